"""bench/published.py: published ratios split into acceptance and step time, a step ratio fitted on one data
set predicting the others through the cost model, the floor that "fastest at K=3" puts on a position's cost,
and this CPU's figures from a sweep's step lines."""

from __future__ import annotations

import json
import math

import pytest

from bench import published

BEST = {"p-eagle": 7, "eagle3": 3}
# Two made-up data sets whose ratios share one step-time ratio (1.1) at c=1 and not at c=8.
AL = {"a": {"p-eagle": {3: 2.0, 7: 3.0}, "eagle3": {3: 2.0, 7: 2.2}},
      "b": {"p-eagle": {3: 2.5, 7: 4.0}, "eagle3": {3: 2.5, 7: 3.0}}}
RATIOS = {"a": {1: 1.5 * 1.1, 8: 1.5 * 0.9}, "b": {1: 1.6 * 1.1, 8: 1.6 * 0.8}}


def test_a_published_ratio_is_its_acceptance_part_times_its_step_part():
    parts = published.split(AL, RATIOS, BEST)
    assert parts["a"][1]["acceptance_part"] == pytest.approx(1.5)
    assert parts["b"][8]["step_part"] == pytest.approx(0.8)
    for by_c in published.split(published.BLOG_AL, published.BLOG_RATIO, published.BLOG_BEST_K).values():
        for row in by_c.values():
            assert row["acceptance_part"] * row["step_part"] == pytest.approx(row["published"], rel=1e-3)


def test_a_step_ratio_fitted_on_one_data_set_predicts_another_only_where_step_time_is_shared():
    at_1 = published.predict(AL, RATIOS, BEST, fitted_on="a", concurrency=1)
    assert {row["data_set"]: row["relative_error"] for row in at_1} == {"a": 0.0, "b": 0.0}
    at_8 = {row["data_set"]: row for row in published.predict(AL, RATIOS, BEST, fitted_on="a", concurrency=8)}
    assert at_8["b"]["predicted"] == pytest.approx(1.6 * 0.9, rel=1e-3)
    assert at_8["b"]["relative_error"] == pytest.approx(abs(0.9 - 0.8) / 0.8, rel=1e-2)


def test_fastest_at_k3_bounds_one_position_from_below():
    floor = published.eagle3_pass_floor(AL, BEST)["a"]
    assert floor == pytest.approx((2.2 / 2.0 - 1) / 4, abs=1e-4)
    # At exactly that cost per position K=3 and K=7 tie; any more and K=3 wins, as the source says it did.
    step3 = 1.0
    position = floor * step3
    fixed = step3 - 3 * position
    assert 2.2 / (fixed + 7 * position) == pytest.approx(2.0 / step3, rel=1e-3)
    assert 2.2 / (fixed + 7 * 1.2 * position) < 2.0 / step3


def test_this_cpu_reads_the_sweeps_step_lines():
    step_model = {"step_ms": {"p-eagle-c1": {"ms_at_k0": 20.0, "ms_per_position": 1.0},
                              "eagle3-c1": {"ms_at_k0": 18.0, "ms_per_position": 3.0}}}
    cpu = published.this_cpu(step_model, BEST)
    assert cpu == {1: {"step_part": round(27.0 / 27.0, 4), "eagle3_pass_share": round(3.0 / 27.0, 4)}}


def test_the_report_names_a_source_for_everything_it_uses_and_says_nothing_is_measured(tmp_path):
    sweep = {"date": "2026-12-06", "step_model": {"step_ms": {
        f"{m}-c{c}": {"ms_at_k0": 20.0 + c, "ms_per_position": 0.5 if m == "p-eagle" else 1.5}
        for m in ("p-eagle", "eagle3") for c in (1, 8)}}}
    report = published.report(sweep)
    assert "nothing here is measured" in report["what"]
    assert all(src["url"].startswith("https://") and src["used"] for src in published.SOURCES.values())
    assert set(report["split"]) == set(published.BLOG_AL) == set(published.BLOG_RATIO)
    assert all(row["fitted_on"] != row["data_set"] for row in report["predictions_c1"])
    assert len(report["in_words"]) == 5 and all(report["in_words"])
    json.dumps(report)  # what --publish writes
    for row in report["predictions_c1"]:
        assert math.isfinite(row["predicted"]) and row["relative_error"] >= 0
