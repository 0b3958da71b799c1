"""bench/cost_model.py: a step-time line per method fitted from measured configurations, acceptance length
from per-position acceptance, and predicted ratios judged against measured ones."""

from __future__ import annotations

import pytest

from tests.models.bench_modules import load


@pytest.fixture(scope="module")
def model():
    return load("cost_model")


def _config(method: str, k: int, c: int, step_ms: float, tokens_per_step: float) -> dict:
    # What a benchmark summary holds, made from a known step time and yield.
    return {"method": method, "k": k, "concurrency": c, "tokens_per_s": 1000.0 * tokens_per_step / step_ms,
            "target_forwards_per_output_token": 1.0 / tokens_per_step}


def test_step_time_and_yield_are_read_back_from_a_summary(model):
    s = _config("eagle3", 3, 1, step_ms=62.5, tokens_per_step=2.4)
    assert model.step_ms(s) == pytest.approx(62.5) and model.tokens_per_step(s) == pytest.approx(2.4)


def test_acceptance_length_chains_the_conditional_rates(model):
    assert model.acceptance_length([0.7, 0.8, 0.8], 3) == pytest.approx(1 + 0.7 + 0.56 + 0.448)
    assert model.acceptance_length([0.5], 0) == 1.0
    with pytest.raises(ValueError, match="2 positions"):
        model.acceptance_length([0.5, 0.5], 3)


def test_the_model_recovers_the_lines_it_was_fitted_on_and_predicts_a_ratio(model):
    truth = {("eagle3", 1): (47.6, 2.7), ("p-eagle", 1): (50.8, 0.55)}
    sweep = [_config("plain", 0, 1, 44.8, 1.0)]
    for (method, c), (a, b) in truth.items():
        for k in range(1, 8):
            sweep.append(_config(method, k, c, a + b * k, tokens_per_step=1.9))  # any yield: step time is fitted
    fitted = model.CostModel.from_sweep(sweep)
    for key, (a, b) in truth.items():
        assert fitted.lines[key].ms_at_k0 == pytest.approx(a) and fitted.lines[key].ms_per_position == pytest.approx(b)
    # At equal acceptance the ratio is the step times' ratio: 1.22x at K = 7, as the issue's analysis put it.
    al = model.acceptance_length([0.9] * 7, 7)
    assert fitted.ratio(("p-eagle", 7, al), ("eagle3", 7, al), 1) == pytest.approx((47.6 + 2.7 * 7) / (50.8 + 0.55 * 7))
    assert fitted.tokens_per_s("plain", 0, 1, 1.0) == pytest.approx(1000 / 44.8)


def test_errors_say_how_far_each_prediction_misses(model):
    sweep = [_config("plain", 0, 1, 40.0, 1.0), *(_config("p-eagle", k, 1, 40.0 + k, 2.0) for k in (1, 2, 3))]
    fitted = model.CostModel.from_sweep(sweep)
    measured = [{"a": ("p-eagle", 2, 2.0), "b": ("plain", 0, 1.0), "concurrency": 1, "ratio": 2.0 * 40 / 42 * 1.05}]
    [row] = model.errors(fitted, measured)
    assert row["predicted"] == pytest.approx(80 / 42, abs=1e-4)
    assert row["relative_error"] == pytest.approx(1 - 1 / 1.05, abs=1e-3)
