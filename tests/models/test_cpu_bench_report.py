"""bench/spec_runs.py's reporting (both speculative benchmarks): ratios, greedy-parity flags, table, plot and the
portable report, on hand-made results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import spec_runs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return spec_runs


def _result(name, method, k, tps, cpu_tps, al, tokens, target_fw, drafter_fw):
    return {"name": name, "method": method, "k": k, "tokens_per_s": tps, "tokens_per_cpu_s": cpu_tps,
            "acceptance_length": al, "token_ids": tokens, "drafter_forwards_per_step": drafter_fw,
            "target_forwards_per_output_token": target_fw, "drafter_share_of_time": 0.2,
            "accepted_per_position": [0.6, 0.4, 0.2][:k]}


def test_summary_ratios_and_parity(bench, tmp_path):
    same, other = [[1, 2, 3]], [[1, 2, 4]]
    results = [
        _result("plain", "plain", 0, 10.0, 20.0, None, same, 1.0, 0.0),
        _result("eagle3-k3", "eagle3", 3, 15.0, 30.0, 3.0, same, 0.33, 3.0),
        _result("eagle3-k5", "eagle3", 5, 12.0, 24.0, 3.2, same, 0.31, 5.0),
        _result("p-eagle-k5", "p-eagle", 5, 18.0, 36.0, 3.6, other, 0.28, 1.0),
        _result("plain-end", "plain", 0, 14.0, 20.0, None, same, 1.0, 0.0),
    ]
    summary = bench.summarise(results)
    assert summary["plain_tokens_per_s_baseline"] == 12.0
    assert summary["plain_drift_end_over_start"] == 1.4
    assert summary["eagle3_best_k"] == 3 and summary["p_eagle_best_k"] == 5
    assert summary["p_eagle_best_vs_plain"] == 1.5
    assert summary["p_eagle_best_vs_eagle3_best"] == 1.2
    assert summary["al_ratio_p_eagle_over_eagle3_k5"] == pytest.approx(3.6 / 3.2, abs=1e-3)
    # A speculative run whose greedy tokens differ from plain decoding must be flagged.
    assert summary["all_identical_to_plain"] is False
    assert [r["identical_to_plain"] for r in results] == [True, True, True, False, True]
    text = bench.table(results)
    assert "p-eagle-k5" in text and "False" in text
    bench.plot(results, tmp_path / "plot.png", title="t")
    assert (tmp_path / "plot.png").stat().st_size > 10_000


def test_cycles_keep_the_fastest_timing_and_reject_changed_output(bench):
    first = dict(_result("p-eagle-k4", "p-eagle", 4, 100.0, 90.0, 3.8, [[1, 2]], 0.3, 1.0),
                 generate_s=2.0, cpu_s=2.2, rounds_s=[2.0], target_forward_s=1.0, drafter_forward_s=0.4,
                 target_share_of_time=0.5, target_forward_ms=3.0, drafter_forward_ms=1.0)
    faster = dict(first, tokens_per_s=200.0, generate_s=1.0, tokens_per_cpu_s=80.0, cpu_s=2.5, rounds_s=[1.0],
                  drafter_forward_ms=0.8)
    merged = bench.merge_cycles(bench.merge_cycles(None, first), faster)
    assert merged["tokens_per_s"] == 200.0 and merged["generate_s"] == 1.0 and merged["drafter_forward_ms"] == 0.8
    assert merged["tokens_per_cpu_s"] == 90.0  # the first cycle had the better CPU time
    assert merged["cycles_generate_s"] == [2.0, 1.0]
    with pytest.raises(RuntimeError, match="changed between cycles"):
        bench.merge_cycles(merged, dict(faster, token_ids=[[1, 3]]))


def test_a_committed_report_holds_no_absolute_path_of_this_machine(bench, tmp_path):
    from models.cache import CACHE_DIR

    results = [dict(_result("plain", "plain", 0, 10.0, 20.0, None, [[1]], 1.0, 0.0), accepted_per_position=[]),
               dict(_result("p-eagle-k3", "p-eagle", 3, 15.0, 30.0, 2.0, [[1]], 0.5, 1.0),
                    accepted_per_position=[0.5, 0.3, 0.1])]
    bench.summarise(results)
    report = bench.header(command="make bench-real", settings={"batch": 1})
    report["models"] = {"target": str(CACHE_DIR / "smollm2-x" / "target"), "repo_file": str(ROOT / "bench")}
    bench.write_report(report, results, tmp_path, "r", title="t")
    text = (tmp_path / "r.json").read_text()
    for root in (str(CACHE_DIR), str(ROOT), sys.prefix):
        assert root not in text
    written = json.loads(text)
    assert written["models"]["target"] == "<model cache>/smollm2-x/target"
    assert written["date"] and written["command"] == "make bench-real" and written["machine"]["cpus"]
    assert "token_ids" not in written["results"][0]


def test_one_sweep_builds_both_benchmarks_configurations(bench, tmp_path):
    """Plain first and last, EAGLE-3 at each K, every P-EAGLE head at each K, each naming its head folder and
    drafting with it; the real benchmark's names carry the concurrency."""
    from models.pair import ModelPair

    pair = ModelPair(root=tmp_path, target=tmp_path / "target", drafter=tmp_path / "p_eagle_4l", mask_token_id=3,
                     eagle3_drafter=tmp_path / "eagle3", other_drafters={"p_eagle": tmp_path / "p_eagle"})
    configs = bench.sweep({"prompts": ["x"]}, pair, eagle3_k=[2, 7], p_eagle_k=[3],
                          heads={"p-eagle-4l": None, "p-eagle": "p_eagle"}, suffix="-c8")
    assert [c["name"] for c in configs] == ["plain-c8", "eagle3-k2-c8", "eagle3-k7-c8", "p-eagle-4l-k3-c8",
                                            "p-eagle-k3-c8", "plain-end-c8"]
    by_name = {c["name"]: c for c in configs}
    assert by_name["eagle3-k7-c8"]["speculative_config"]["num_speculative_tokens"] == 7
    assert by_name["eagle3-k7-c8"]["speculative_config"]["model"].endswith("eagle3")
    assert by_name["p-eagle-k3-c8"]["speculative_config"]["model"].endswith("p_eagle")
    assert by_name["p-eagle-k3-c8"]["speculative_config"]["parallel_drafting"] is True
    assert [c.get("head") for c in configs] == [None, "eagle3", "eagle3", "p_eagle_4l", "p_eagle", None]
    assert all(c["prompts"] == ["x"] for c in configs)
    assert configs[0]["speculative_config"] is None and configs[-1]["speculative_config"] is None
