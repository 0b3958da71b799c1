"""Training a head on captured traffic, on the random pair: the served head warm-started, trained with the
benchmark's recipe for the stage's K, written beside it in its own draft vocabulary, then gated on vLLM against
it; a second run resumes from what the first kept."""

from __future__ import annotations

import json

import pytest
from peagle_contract.capture import CaptureConfig, format_record
from safetensors.torch import load_file

from models.trainer import traffic_training

pytestmark = pytest.mark.engine
CONFIG = CaptureConfig(sample_rate=1.0, stage="dev", target="random-pair")


def _capture(tmp_path, n: int = 48):
    lines = [format_record(config=CONFIG, request_id=f"r{i}", route="/v1/completions", stream=False,
                           request={"prompt": f"Once upon a time, number {i},"},
                           answer=f" there was a little model, the {i}th, that drafted {7 * i} tokens a day",
                           finish_reason="length",
                           prompt_tokens=8, output_tokens=16) for i in range(n)]
    path = tmp_path / "capture.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return [path]


def test_a_candidate_is_trained_from_the_served_head_and_gated_against_it(untrained, tmp_path):
    logged: list[str] = []
    kwargs = dict(capture=_capture(tmp_path), stage="dev", target_name="random-pair", target=untrained.target,
                  in_service=untrained.drafter, work=tmp_path / "work", k=3, cpu_seconds=4.0, max_tokens=16,
                  log=logged.append)
    report = traffic_training.run(**kwargs)
    assert report["gate"] in ("passed", "refused") and report["outputs_identical"] is True
    assert report["requests_held_out"] == 10 and report["requests_training"] == 38
    assert report["training"]["steps"] > 0 and report["training"]["training_requests"] > 0
    assert report["al_before"]["value"] >= 1.0 and report["al_after"]["value"] >= 1.0
    candidate = traffic_training.Path(report["candidate"])
    config = json.loads((candidate / "config.json").read_text())
    assert config["trained_num_speculative_tokens"] == 3 and candidate.parent == tmp_path / "work"
    served = load_file(str(untrained.drafter / "model.safetensors"))
    trained = load_file(str(candidate / "model.safetensors"))
    assert not (trained["fc.weight"] == served["fc.weight"]).all()  # it trained; the served head is untouched
    assert json.loads((tmp_path / "work" / traffic_training.REPORT).read_text())["gate"] == report["gate"]
    # Resumed: nothing recomputed but the gate.
    logged.clear()
    again = traffic_training.run(**kwargs)
    assert any("from an earlier run" in line for line in logged) and again["candidate"] == report["candidate"]
    assert not any("features on" in line for line in logged)
