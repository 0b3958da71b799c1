"""Runs the scenarios in one scratch space, sharing what they can: one origin, one GitHub API stand-in for
the pull requests, one local runtime for the promotions (each promotion gets an empty embedded account)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

from harness.rehearsal import scenarios
from harness.rehearsal.scenarios import Outcome

SCENARIOS = ("change-k", "rename-endpoint", "promote", "dev-smoke-fails", "old-setuptools")
PULL_REQUESTS = {"change-k": scenarios.pull_request_change_k, "rename-endpoint": scenarios.pull_request_rename_endpoint}
PROMOTIONS = {"promote": (scenarios.merge_promotes, True), "dev-smoke-fails": (scenarios.failed_dev_smoke_stops_staging, False)}


def run_scenarios(root: Path, *, only: Sequence[str] | None = None, echo: Callable[[str], None] | None = None,
                  log: Callable[[str], None] = print) -> list[Outcome]:
    from harness.rehearsal.aws_edge import EmbeddedAccount, local_runtime
    from harness.rehearsal.engine import Scratch
    from harness.rehearsal.github_api import GitHubApi
    from stacks.environments import ENVIRONMENTS

    chosen = [name for name in SCENARIOS if not only or name in only]
    scratch = Scratch(root / "scratch")
    log(f"rehearsal: origin at {scratch.main[:12]} (this repository's HEAD), scratch {root}")
    outcomes: list[Outcome] = []
    if any(name in PULL_REQUESTS for name in chosen):
        with GitHubApi(repository=scenarios.REPOSITORY, token=scenarios.TOKEN) as api:
            for name in (n for n in chosen if n in PULL_REQUESTS):
                log(f"rehearsal: {name} ...")
                outcomes.append(PULL_REQUESTS[name](scratch, api, echo=echo))
            # What GitHub would have received, for a reader of the comments.
            (root / "github-api.json").write_text(json.dumps(
                {"calls": [asdict(call) for call in api.state.calls], "comments": api.state.comments}, indent=2))
    if any(name in PROMOTIONS for name in chosen):
        runtime = local_runtime(root / "runtime")
        log("rehearsal: starting the local runtime every endpoint is served by ...")
        try:
            runtime.start().wait_ready(timeout_s=900)
            for name in (n for n in chosen if n in PROMOTIONS):
                scenario, dev_answers = PROMOTIONS[name]
                answering = {env.endpoint_name: env.component_name for env in ENVIRONMENTS
                             if dev_answers or env.name != "Dev"}
                log(f"rehearsal: {name} (an empty embedded account) ...")
                with EmbeddedAccount(root / name, runtime=runtime, answering=answering) as account:
                    outcomes.append(scenario(scratch, account, echo=echo))
        finally:
            runtime.stop()
    if "old-setuptools" in chosen:
        log("rehearsal: old-setuptools (negative control) ...")
        outcomes.append(scenarios.old_setuptools_fails_synth(scratch, echo=echo))
    return outcomes
