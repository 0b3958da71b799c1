"""The workflows run: `make rehearse`'s scenarios on act (a real workflow engine), from a fresh clone and
fresh virtual environments per job, judged on what act produced, the GitHub API stand-in recorded and the
embedded AWS holds. Stand-ins (harness/rehearsal) only for GitHub's marketplace actions and API, AWS and
the Docker engine. About 15-20 minutes on 2 cores, most of it each job's own `make setup-cdk` and synth."""

from __future__ import annotations

import pytest

from harness.rehearsal.runner import run_scenarios

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    found = run_scenarios(tmp_path_factory.mktemp("rehearsal"), log=lambda line: print(line, flush=True))
    for outcome in found:
        print(outcome.report())
    return {outcome.scenario.split(":")[0]: outcome for outcome in found}


def _passed(outcomes, prefix: str) -> None:
    (outcome,) = [o for name, o in outcomes.items() if name.startswith(prefix)]
    assert outcome.checks, "the scenario judged nothing"
    assert outcome.ok, "\n".join(outcome.failed()) + "\n" + outcome.report()


def test_a_pull_request_that_changes_k_passes_and_keeps_one_comment(outcomes):
    _passed(outcomes, "a pull request that changes K")


def test_a_renamed_prod_endpoint_fails_the_check_until_labelled(outcomes):
    _passed(outcomes, "a pull request that renames the Prod endpoint")


def test_a_merge_deploys_one_assembly_through_every_stage_in_order(outcomes):
    _passed(outcomes, "a merge to main")


def test_a_failed_dev_smoke_test_stops_the_promotion(outcomes):
    _passed(outcomes, "a merge whose Dev smoke test fails")


def test_the_rehearsal_catches_a_wheel_build_that_needs_the_runners_setuptools(outcomes):
    _passed(outcomes, "negative control")
