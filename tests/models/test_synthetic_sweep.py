"""bench/synthetic_sweep.py's arithmetic: the drafting cost's slope in K per method, pooled over acceptance
profiles, and the goals read from it (the engines themselves are exercised by `python -m bench.synthetic_sweep
--pair toy`; tests/models/test_synthetic_sampler.py runs synthetic acceptance on a real engine)."""

from __future__ import annotations

import pytest

from bench import synthetic_sampler, synthetic_sweep


@pytest.fixture(scope="module")
def sweep():
    return synthetic_sweep


def _summary(method: str, k: int, profile: str, all_in: float, hooked: float) -> dict:
    return {"name": f"{method}-k{k}-{profile}", "method": method, "k": k, "drafting_ms_per_step": all_in,
            "drafter_ms_per_step": hooked, "speedup_vs_plain": 1.0}


def test_the_slope_is_the_least_squares_cost_of_one_more_position(sweep):
    assert sweep.slope([(1, 5.0), (2, 7.5), (3, 10.0)]) == {"ms_per_position": 2.5, "ms_at_k0": 2.5}
    assert sweep.slope([(4, 3.0)]) == {"ms_per_position": None, "ms_at_k0": None}


def test_costs_pool_the_profiles_and_the_goal_compares_the_slopes(sweep):
    found = {}
    for k in (1, 2, 3, 4):
        for profile, noise in (("zero", -0.1), ("gpu-like", 0.0), ("one", 0.1)):
            found[f"e{k}{profile}"] = _summary("eagle3", k, profile, 2.0 + 3.0 * k + noise, 1.5 + 2.0 * k)
            found[f"p{k}{profile}"] = _summary("p-eagle", k, profile, 4.0 + 0.5 * k + noise, 3.0 + 0.2 * k)
    cost = sweep.costs({1: found})
    row = cost["concurrency_1"]
    assert row["eagle3"]["drafting_ms_per_step"] == {1: 5.0, 2: 8.0, 3: 11.0, 4: 14.0}  # the median profile
    assert row["eagle3"]["ms_per_position"] == pytest.approx(3.0) and row["p-eagle"]["ms_per_position"] == pytest.approx(0.5)
    goal = sweep.goals(cost, {})["drafting_slope_ratio"]
    assert goal["value"] == 6.0 and goal["met"]
    final = {"concurrency_1": {"p_eagle_over_eagle3": {"median": 1.12, "ci90": [1.05, 1.2]}}}
    best = sweep.goals(cost, final)["synthetic_c1_best_ratio"]
    assert best == {"goal": 1.15, "value": 1.12, "interval": [1.05, 1.2], "met": False}


def test_the_profiles_are_vllms_unconditional_rates():
    rates = synthetic_sampler.profile_rates
    assert rates("zero", 3) == [0.0, 0.0, 0.0] and rates("one", 2) == [1.0, 1.0]
    assert rates("gpu-like", 4) == pytest.approx([0.7, 0.56, 0.448, 0.3584])
    with pytest.raises(ValueError, match="allowed: zero, one, gpu-like"):
        rates("half", 2)
