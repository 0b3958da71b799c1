"""bench/real_spec.py's parts: the cost model judged against end-to-end ratios (none missed when the ratios
are the model's own, each miss measured when they are not), the goals block, the round's closed batches, the
final's round counts, and a part's report taken again only when it was measured with the same key."""

from __future__ import annotations

import json

import pytest

import bench.cost_model
import bench.real_spec


@pytest.fixture(scope="module")
def real_spec():
    return bench.real_spec


@pytest.fixture(scope="module")
def cost():
    return bench.cost_model


def _model(cost):
    return cost.CostModel(lines={("p-eagle", 1): cost.StepLine(42.0, 1.0), ("p-eagle", 8): cost.StepLine(84.0, 30.0),
                                 ("eagle3", 1): cost.StepLine(41.0, 3.0), ("eagle3", 8): cost.StepLine(84.0, 31.0)},
                          plain_step_ms={1: 40.0, 8: 80.0}, sequences={1: 1.0, 8: 8.0})


def _acceptance(reach_pe, reach_e3):
    def head(reach):
        al = {str(k): 1 + sum(reach[:k]) for k in range(1, len(reach) + 1)}
        return {"humaneval_e2e_problems": {"acceptance_length": al, "at_least": reach}}
    return {"heads": {"p-eagle": head(reach_pe), "eagle3": head(reach_e3)}}


def test_the_model_check_measures_each_miss(real_spec, cost):
    model = _model(cost)
    accept = _acceptance([0.5, 0.3, 0.1], [0.5, 0.25, 0.1])
    rounds = [[[100], [60]], [[128], [30]]]  # c1: one request per batch
    al = {k: 1 + sum([0.5, 0.3, 0.1][:k]) for k in (1, 2, 3)}
    truth = [cost.statistics.median(model.workload_ratio(("p-eagle", k, al[k]), ("plain", 0, 1.0), r) for r in rounds)
             for k in (1, 2, 3)]
    screened = {1: {f"p-eagle-k{k}": {"name": f"p-eagle-k{k}", "method": "p-eagle", "k": k,
                                      "speedup_vs_plain": truth[k - 1] * (1.05 if k == 3 else 1.0),
                                      "acceptance_length": al[k]} for k in (1, 2, 3)}}
    screened[1]["p-eagle-2l-k1"] = {"name": "p-eagle-2l-k1", "method": "p-eagle", "k": 1, "speedup_vs_plain": 9.0,
                                    "acceptance_length": 1.5}  # no step times for this head: left out
    ratios = real_spec.measured_ratios(screened, {1: rounds}, {}, {})
    assert [r["a"] for r in ratios] == [("p-eagle", 1), ("p-eagle", 2), ("p-eagle", 3)]
    check = real_spec.model_check(model, accept, ratios)
    errors = [p["relative_error"] for p in check["predictions"]]
    assert errors[:2] == [0.0, 0.0] and errors[2] == pytest.approx(0.05 / 1.05, abs=1e-3)
    assert check["max_relative_error"] == errors[2]
    assert check["max_relative_error_with_run_al"] == pytest.approx(errors[2], abs=1e-3)


def test_goals_hold_value_and_interval(real_spec):
    sweep = {"goals": {"synthetic_c1_best_ratio": {"value": 1.1, "interval": [1.02, 1.2], "met": False},
                       "drafting_slope_ratio": {"value": 4.0, "met": True, "eagle3_ms_per_position": 2.0,
                                                "p_eagle_ms_per_position": 0.5}}}
    accept = {"goals": {"accept_ratio_k3": {"value": 0.97, "interval": [0.95, 0.99], "met": True}}}
    finals = {"concurrency_1": {
        "plain": {"name": "plain", "speedup_vs_plain": 1.0},
        "p-eagle": {"name": "p-eagle-k3", "speedup_vs_plain": 1.2, "speedup_vs_plain_90ci": [1.1, 1.3]},
        "p-eagle-2l": {"name": "p-eagle-2l-k3", "speedup_vs_plain": 1.25, "speedup_vs_plain_90ci": [1.2, 1.3]},
        "p-eagle-sched": {"name": "p-eagle-sched", "speedup_vs_plain": 1.4, "speedup_vs_plain_90ci": [1.3, 1.5]},
        "eagle3": {"name": "eagle3-k2", "speedup_vs_plain": 1.1},
        "p_eagle_over_eagle3": {"median": 1.03, "ci90": [0.99, 1.06]},
        "schedule_over_best_fixed": {"median": 0.98, "ci90": [0.96, 1.0]}},
        "concurrency_8": {"schedule_over_plain": {"median": 0.93, "ci90": [0.9, 0.96]}}}
    goals = real_spec.goals(sweep, accept, finals, {"max_relative_error": 0.04, "max_relative_error_with_run_al": 0.02})
    assert all({"goal", "value", "interval", "met"} <= set(g) for g in goals.values())
    # The fastest trained P-EAGLE head, never the scheduled configuration.
    assert goals["plain_c1_best_ratio"]["configuration"] == "p-eagle-2l-k3" and not goals["plain_c1_best_ratio"]["met"]
    assert goals["e2e_c1_best_ratio"]["met"] and not goals["e2e_c1_best_ratio"]["stretch_met"]
    assert not goals["model_max_error"]["met"] and goals["schedule_c1_vs_best_fixed"]["met"]
    assert not goals["schedule_c8_vs_plain"]["met"] and goals["drafting_slope_ratio"]["interval"] is None


def test_batches_follow_the_concurrency_and_round_counts_the_concurrencies(real_spec):
    rounds = [{"token_ids": [[1] * 5, [1] * 3, [1] * 7]}]
    assert real_spec.batches(rounds, 2) == [[[5, 3], [7]]]
    assert real_spec.batches(rounds, 1) == [[[5], [3], [7]]]

    class Args:
        concurrency, final_rounds = [1, 8], [24, 8]
    assert real_spec.final_rounds(Args) == {1: 24, 8: 8}
    Args.final_rounds = [5]
    assert real_spec.final_rounds(Args) == {1: 5, 8: 5}


def test_a_part_is_taken_again_only_with_the_same_key(real_spec, tmp_path):
    key = {"heads": {"p_eagle": "smollm2-head-1"}, "k": [1, 2]}
    (tmp_path / "synthetic_sweep.json").write_text(json.dumps({"part_key": key, "figure": 1}))
    assert real_spec.reusable(tmp_path, "synthetic_sweep", key)["figure"] == 1
    assert real_spec.reusable(tmp_path, "synthetic_sweep", {**key, "k": [1, 2, 3]}) is None
    assert real_spec.reusable(tmp_path, "synthetic_sweep", {**key, "heads": {"p_eagle": "smollm2-head-2"}}) is None
    assert real_spec.reusable(tmp_path, "acceptance", key) is None


def test_the_report_says_what_was_measured_in_words(real_spec, cost):
    model = _model(cost)
    goals = {"drafting_slope_ratio": {"eagle3_ms_per_position": 3.0, "p_eagle_ms_per_position": 1.0},
             "accept_ratio_k3": {"value": 0.97, "interval": [0.93, 1.01]},
             "accept_ratio_k4": {"value": 0.96, "interval": [0.91, 1.0]},
             "e2e_c1_best_ratio": {"value": 1.04, "interval": [1.01, 1.07], "configurations": ["p-eagle-k3", "eagle3-k2"]},
             "plain_c1_best_ratio": {"value": 1.2}, "schedule_c8_vs_plain": {"value": 0.98}}
    finals = {"concurrency_8": {"p-eagle": {"k": 2, "speedup_vs_plain": 0.8}}}
    lines = real_spec.in_words(model, goals, finals, {"drafting_up_to_batch": 2}, 2304)
    # K=4 at c1: EAGLE-3 41 + 3 x 4 = 53 ms a step, P-EAGLE 42 + 4 = 46: 13% saved; at K=7 62 against 49: 21%.
    assert "saves 13% of a step at K=4 and 21% at K=7" in lines[0]
    assert "2304 training answers" in lines[1] and "0.97x EAGLE-3's at K=3 (90% interval 0.93-1.01)" in lines[1]
    assert "(p-eagle-k3) is 1.04x the fastest EAGLE-3 (eagle3-k2" in lines[2]
    # Plain at c8: 80 ms a step; P-EAGLE at K=2: 84 + 60 = 144 ms, so it needs AL above 1.8.
    assert "acceptance length above 1.80" in lines[3] and "keeps 0.98x plain" in lines[3]
    assert real_spec.in_words(model, {}, {}, {}, None) == []  # without the figures, no sentence about them
