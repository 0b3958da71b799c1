"""``python -m harness.rehearsal [--only NAME ...] [--keep DIR] [--verbose] [--work-tree]``: every scenario of
harness.rehearsal.scenarios, a report per scenario, exit status 1 when any check failed."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from harness.rehearsal.runner import SCENARIOS, run_scenarios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.rehearsal", description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=SCENARIOS, help="run only these scenarios")
    parser.add_argument("--keep", type=Path, help="scratch folder to keep (default: a temporary one, removed)")
    parser.add_argument("--verbose", action="store_true", help="print act's log as the jobs run")
    parser.add_argument("--work-tree", action="store_true",
                        help="seed the origin from the work tree as it is (uncommitted changes included; committed in "
                             "a scratch clone, never here) instead of HEAD")
    args = parser.parse_args(argv)
    started = time.monotonic()
    echo = print if args.verbose else None
    with tempfile.TemporaryDirectory(prefix="rehearsal-") as tmp:
        root = args.keep or Path(tmp)
        outcomes = run_scenarios(root, only=args.only, echo=echo, log=lambda line: print(line, flush=True),
                                 work_tree=args.work_tree)
        for outcome in outcomes:
            print(outcome.report(), flush=True)
    failed = [o.scenario for o in outcomes if not o.ok]
    print(f"rehearsal: {len(outcomes) - len(failed)} of {len(outcomes)} scenarios passed in "
          f"{time.monotonic() - started:.0f} s" + (f"; failed: {'; '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
