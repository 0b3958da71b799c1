"""bench/cost_model.py: a step-time line per method fitted from measured configurations, acceptance length
from per-position acceptance, and predicted ratios judged against measured ones."""

from __future__ import annotations

import pytest

from bench import cost_model


@pytest.fixture(scope="module")
def model():
    return cost_model


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


def _two_concurrencies(model):
    # c1 memory-bound (drafting positions cheap), c8 compute-bound (each position costs about a plain step).
    sweep = [_config("plain", 0, 1, 40.0, 1.0), _config("plain", 0, 8, 80.0, 8.0)]
    for k in range(1, 6):
        sweep.append(_config("p-eagle", k, 1, 42.0 + 1.0 * k, 2.0))
        sweep.append(_config("p-eagle", k, 8, 84.0 + 30.0 * k, 16.0))
    return model.CostModel.from_sweep(sweep)


def test_step_time_is_linear_in_the_batch_between_measured_concurrencies(model):
    fitted = _two_concurrencies(model)
    assert fitted.step_at("plain", 0, 1) == pytest.approx(40.0) and fitted.step_at("plain", 0, 8) == pytest.approx(80.0)
    assert fitted.step_at("plain", 0, 4.5) == pytest.approx(60.0)  # halfway
    assert fitted.step_at("p-eagle", 2, 8) == pytest.approx(144.0)
    assert fitted.step_at("plain", 0, 16) == pytest.approx(80.0)  # flat past the last measured one
    with pytest.raises(KeyError, match="eagle3"):
        fitted.step_at("eagle3", 1, 1)


def test_a_closed_batch_is_charged_as_its_requests_finish(model):
    fitted = _two_concurrencies(model)
    # Plain, two requests of 10 and 40 tokens: 10 steps with both running, then 30 with one.
    expected = 10 * fitted.step_at("plain", 0, 2) + 30 * fitted.step_at("plain", 0, 1)
    assert fitted.batch_ms("plain", 0, 1.0, [40, 10]) == pytest.approx(expected)
    # At AL 2 each request needs half the steps.
    spec = 5 * fitted.step_at("p-eagle", 3, 2) + 15 * fitted.step_at("p-eagle", 3, 1)
    assert fitted.batch_ms("p-eagle", 3, 2.0, [10, 40]) == pytest.approx(spec)
    ratio = fitted.workload_ratio(("p-eagle", 3, 2.0), ("plain", 0, 1.0), [[10, 40], [20]])
    assert ratio == pytest.approx((expected + 20 * 40.0) / (spec + 10 * 45.0))


def test_the_schedule_drafts_while_the_model_says_it_pays(model):
    fitted = _two_concurrencies(model)
    reach = [0.5, 0.3, 0.1, 0.05, 0.02]  # AL(K) = 1 + the first K shares: one request gains, eight lose
    chosen = model.choose_schedule(fitted, "p-eagle", reach, trained_k=5, max_batch=8)

    def speed(k, b):
        return (1 + sum(reach[:k])) * fitted.step_at("plain", 0, b) / fitted.step_at("p-eagle", k, b)
    best = max(range(1, 6), key=lambda k: speed(k, 1))
    on = max(b for b in range(1, 9) if all(speed(best, x) > 1 for x in range(1, b + 1)))
    assert (chosen["k"], chosen["drafting_up_to_batch"]) == (best, on) == (4, 3)  # worked by hand too
    assert chosen["schedule"] == [[1, 3, 4], [4, 8, 0]]
    assert chosen["predicted_speedup_vs_plain_by_batch"][1] == pytest.approx(speed(4, 1), abs=1e-4)
    # Nothing accepted: drafting never pays, so it is off at every load.
    assert model.choose_schedule(fitted, "p-eagle", [0.0] * 5, trained_k=5, max_batch=8)["schedule"] == [[1, 8, 0]]
    # Drafting that pays at every load keeps a fixed K (no schedule).
    cheap = model.CostModel(lines={("p-eagle", 1): model.StepLine(40.0, 0.1), ("p-eagle", 8): model.StepLine(80.0, 0.1)},
                            plain_step_ms={1: 40.0, 8: 80.0}, sequences={1: 1.0, 8: 8.0})
    assert model.choose_schedule(cheap, "p-eagle", [0.5] * 5, trained_k=5, max_batch=8)["schedule"] is None
