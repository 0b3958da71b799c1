"""Test-only hook, loaded by every Python process of a test server (PYTHONPATH points here).

With PEAGLE_TEST_DRAFTER_CALLS=<file>, each forward pass of vLLM's EAGLE-3 drafter model appends one
byte to <file>, so a test reads the number of drafter passes as the file's size. The patch is applied
when vLLM imports the drafter module, in whichever process (the model runner's) that happens.
"""

import importlib.abc
import os
import sys

_TARGET = "vllm.model_executor.models.llama_eagle3"
_PATH = os.environ.get("PEAGLE_TEST_DRAFTER_CALLS")


def _patch(module) -> None:
    cls = module.Eagle3LlamaForCausalLM
    original = cls.forward
    fd = os.open(_PATH, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def counted_forward(self, *args, **kwargs):
        os.write(fd, b".")
        return original(self, *args, **kwargs)

    cls.forward = counted_forward


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


if _PATH:
    import importlib.util

    sys.meta_path.insert(0, _Finder())
