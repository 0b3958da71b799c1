"""Test-only hooks, loaded by every Python process whose PYTHONPATH points here (test servers, check workers,
the fused kernel's start check). Each is off unless its variable is set; each patches a module when it is first
imported, in whichever process that happens.

- PEAGLE_TEST_DRAFTER_CALLS=<file>: each forward pass of vLLM's EAGLE-3 drafter appends one byte to <file>, so a
  test reads the number of drafter passes as the file's size (runs in the model runner's process).
- PEAGLE_TEST_START_CHECK_FAULT=crash|mismatch|hang: the fused build misbehaves where it is first used - the start
  check's child: it aborts (SIGABRT, as a device fault that takes the process down would), writes one wrong token
  id (a kernel miscompiled for a device), or never returns. PEAGLE_TEST_START_CHECK_RUNS=<file>: each process
  that runs the build appends its pid there once, so a test counts how many times the check ran.
- PEAGLE_TEST_CHECK_FAULTS=1: in a request-check worker, a body that starts with ``CRASH`` kills the worker
  (SIGABRT), one that starts with ``SLOW<4 digits>`` takes that many seconds to check.
"""

import importlib.abc
import importlib.util
import os
import sys
import time


def _drafter_counter(module) -> None:
    cls = module.Eagle3LlamaForCausalLM
    original = cls.forward
    fd = os.open(os.environ["PEAGLE_TEST_DRAFTER_CALLS"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def counted_forward(self, *args, **kwargs):
        os.write(fd, b".")
        return original(self, *args, **kwargs)

    cls.forward = counted_forward


def _faulty_fused_build(module) -> None:
    real, fault, runs = module.build_draft_inputs_fused, os.environ.get("PEAGLE_TEST_START_CHECK_FAULT"), \
        os.environ.get("PEAGLE_TEST_START_CHECK_RUNS")
    noted = []

    def build(*, batch, spec, out, **kwargs):
        if runs and not noted:
            noted.append(True)
            with open(runs, "a") as f:
                f.write(f"{os.getpid()}\n")
        if fault == "crash":
            os.abort()
        if fault == "hang":
            time.sleep(3600)
        result = real(batch=batch, spec=spec, out=out, **kwargs)
        if fault == "mismatch":
            out.token_ids[0] += 1
        return result

    module.build_draft_inputs_fused = build


def _faulty_request_checks(module) -> None:
    real = module.RequestValidator.check

    def check(self, *, route, body):
        if body.startswith(b"CRASH"):
            os.abort()
        if body.startswith(b"SLOW"):
            time.sleep(float(body[4:8]))
            return module.Rejection(400, "slow body checked")
        return real(self, route=route, body=body)

    module.RequestValidator.check = check


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, patches: dict) -> None:
        self.patches = patches

    def find_spec(self, name, path, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


_PATCHES = {}
if os.environ.get("PEAGLE_TEST_DRAFTER_CALLS"):
    _PATCHES["vllm.model_executor.models.llama_eagle3"] = _drafter_counter
if os.environ.get("PEAGLE_TEST_START_CHECK_FAULT") or os.environ.get("PEAGLE_TEST_START_CHECK_RUNS"):
    _PATCHES["peagle_runtime.kernels.fused"] = _faulty_fused_build
if os.environ.get("PEAGLE_TEST_CHECK_FAULTS") == "1":
    _PATCHES["peagle_runtime.request_checks"] = _faulty_request_checks
if _PATCHES:
    sys.meta_path.insert(0, _PatchOnImport(_PATCHES))
