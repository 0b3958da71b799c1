"""Runs the scenarios in one scratch space, sharing what they can: one origin, one GitHub API stand-in for the
pull requests, one local runtime for the promotions (each promotion gets empty embedded accounts)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

from harness.rehearsal import scenarios, weights
from harness.rehearsal.scenarios import Outcome

PULL_REQUESTS = {"change-k": scenarios.pull_request_change_k, "rename-endpoint": scenarios.pull_request_rename_endpoint,
                 "pr-judges-itself": scenarios.pull_request_cannot_judge_itself,
                 "hostile-artifacts": scenarios.hostile_artifacts}
PROMOTIONS = {"promote": (scenarios.merge_promotes, True), "dev-smoke-fails": (scenarios.failed_dev_smoke_stops_staging, False)}
SCENARIOS = (*PULL_REQUESTS, *PROMOTIONS, "manual-promote-from-branch", "old-setuptools")


def run_scenarios(root: Path, *, only: Sequence[str] | None = None, echo: Callable[[str], None] | None = None,
                  log: Callable[[str], None] = print, work_tree: bool = False) -> list[Outcome]:
    from harness.rehearsal.aws_edge import EmbeddedAccounts, local_runtime
    from harness.rehearsal.engine import REPOSITORY, Scratch
    from harness.rehearsal.github_api import GitHubApi
    from stacks.environments import ENVIRONMENTS

    chosen = [name for name in SCENARIOS if not only or name in only]
    scratch = Scratch(root / "scratch", work_tree=work_tree)
    log(f"rehearsal: origin at {scratch.main[:12]} (this repository's {'work tree' if work_tree else 'HEAD'}), "
        f"scratch {root}")
    # As a team does after `make stage-weights`: the weights' digest pinned on main, for every stage.
    bundle = root / "bundle"
    pin = weights.local_bundle(bundle)
    scratch.main = scratch.commit(parent=scratch.main, branch="main", message="Pin the staged weights",
                                  edit=weights.pin_edit(pin))
    log(f"rehearsal: main pins the weights bundle {pin[:12]}... ({scratch.main[:12]})")
    outcomes: list[Outcome] = []
    if any(name in PULL_REQUESTS for name in chosen):
        # The stand-in's own token is never handed to a job: each run gets one with its workflow's permissions.
        with GitHubApi(repository=REPOSITORY, token="rehearsal-owner-token") as api:
            for name in (n for n in chosen if n in PULL_REQUESTS):
                log(f"rehearsal: {name} ...")
                outcomes.append(PULL_REQUESTS[name](scratch, api, echo=echo))
            # What GitHub would have received, for a reader of the comments and statuses.
            (root / "github-api.json").write_text(json.dumps(
                {"calls": [asdict(call) for call in api.state.calls], "comments": api.state.comments,
                 "statuses": api.state.statuses}, indent=2))
    if any(name in PROMOTIONS for name in chosen):
        runtime = local_runtime(root / "runtime", bundle=bundle, pin=pin)
        log("rehearsal: starting the local runtime every endpoint is served by ...")
        try:
            runtime.start().wait_ready(timeout_s=900)
            for name in (n for n in chosen if n in PROMOTIONS):
                scenario, dev_answers = PROMOTIONS[name]
                answering = {env.endpoint_name: env.component_name for env in ENVIRONMENTS
                             if dev_answers or env.name != "Dev"}
                log(f"rehearsal: {name} (empty embedded accounts, one per stage) ...")
                with EmbeddedAccounts(root / name, runtime=runtime, answering=answering) as aws:
                    weights.stage(aws, pin)  # each stage's own bucket, in its own account, by the real stager
                    outcomes.append(scenario(scratch, aws, echo=echo))
        finally:
            runtime.stop()
    if "manual-promote-from-branch" in chosen:
        log("rehearsal: manual-promote-from-branch (negative control; bootstrapped accounts, no endpoint) ...")
        with EmbeddedAccounts(root / "manual-promote-from-branch", runtime=None) as aws:
            outcomes.append(scenarios.manual_promote_from_a_branch(scratch, aws, echo=echo))
    if "old-setuptools" in chosen:
        log("rehearsal: old-setuptools (negative control) ...")
        outcomes.append(scenarios.old_setuptools_fails_synth(scratch, echo=echo))
    return outcomes
