"""Typed presets for the models SageMaker JumpStart serves with P-EAGLE heads: what to serve, on what, how.

    from peagle_constructs.presets import GPT_OSS_20B
    serving = GPT_OSS_20B.serving(target_model="s3://.../target/", drafter_model="s3://.../drafter/",
                                  max_model_len=8192)      # any ServingConfig field may be overridden
    GPT_OSS_20B.check(serving, instance_type="ml.g6e.xlarge")  # ConfigError when it cannot run there

A preset holds the head's trained K (a larger K is refused: acceptance collapses past it), the instances it
fits with their tensor-parallel size, the vLLM flags the head's card recommends, and the sizes the memory
arithmetic needs: weights + head + the KV cache for ``max_num_seqs`` full-length sequences at the KV dtype,
per GPU, against the GPU's memory times ``gpu_memory_utilization``. The arithmetic is the worst case
(every sequence at max_model_len); vLLM pages the cache, so a preset that passes it never runs out. (The
head's own KV cache, a few layers, and CUDA graphs live in what gpu_memory_utilization leaves.) Each
preset's defaults fit its smallest instance; the cards' own max_num_seqs (128 for GPT-OSS) are for B200s.

Sources (the numbers in the comments refer to them):
[1] huggingface.co/amazon/GPT-OSS-20B-P-EAGLE (card: 4 layers, trained for K up to 10, recommended K 7, the
    vLLM command: --kv-cache-dtype fp8 --async-scheduling --stream-interval 20 --max-cudagraph-capture-size
    4096 --no-enable-prefix-caching --max-num-batched-tokens 32768, VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1)
[2] huggingface.co/amazon/gpt-oss-120b-p-eagle (trained K 8, recommended K 5, the same flags)
[3] huggingface.co/amazon/Qwen3-Coder-30B-A3B-Instruct-P-EAGLE (trained K 18, recommended K 10;
    --max-model-len 16384 --no-enable-prefix-caching --async-scheduling)
[4] openai/gpt-oss-20b / -120b config.json (24 / 36 layers, 8 KV heads of 64, layers alternate
    sliding_attention (window 128) and full_attention); MXFP4 weights on the GPU: 13.7 GiB / 65 GiB
    (vLLM's load log, vllm-project/vllm issues 23278 and 33155)
[5] Qwen/Qwen3-Coder-30B-A3B-Instruct config (48 layers, 4 KV heads of 128, 262144 context; bf16 weights
    about 57 GiB)
[6] aws.amazon.com/blogs/machine-learning "Parallelize speculative decoding with P-EAGLE on Amazon
    SageMaker AI" (JumpStart: GPT-OSS-20B/120B, Qwen3-Coder-30B, Gemma-4-31B-IT; ml.g7e.2xlarge the smallest)
[7] GPU memory per GPU: g6e L40S 48 GB, g7e RTX PRO 6000 96 GB, p5 H100 80 GB, p5e/p5en H200 141 GB,
    p6-b200 B200 179 GB (instance_types.GPU_FAMILIES)
K by load: every preset keeps a fixed K (``num_speculative_tokens_per_batch_size`` unset). vLLM 0.32 can only
switch parallel drafting between the full K and none (bench/figures/vllm_features.json), and where turning it
off at high load pays on these GPUs is a break-even nobody has measured for these heads; the published speedups
[1][2][3] were measured at a fixed K. Set a schedule per environment once a load test on the instance shows it.
Gemma-4-31B-IT: JumpStart lists a P-EAGLE head [6], but no public one exists: its preset has no drafter
source and no trained K - stage your own head and say its K; its layer shape is not published, so only its
weights are checked against the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from peagle_constructs.errors import ConfigError
from peagle_constructs.instance_types import InstanceType
from peagle_contract.capture import CaptureConfig
from peagle_contract.serving import ServingConfig

GIB = 1024 ** 3
_KV_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "auto": 2, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class AttentionShape:
    """What the KV cache holds per token: layers x 2 (K and V) x KV heads x head dim x bytes."""

    layers: int
    kv_heads: int
    head_dim: int
    sliding_layers: int = 0  # of ``layers``: those that keep only the last ``sliding_window`` tokens
    sliding_window: int = 0

    def kv_bytes(self, *, tokens_per_sequence: int, sequences: int, dtype_bytes: int) -> int:
        per_token_layer = 2 * self.kv_heads * self.head_dim * dtype_bytes
        full = (self.layers - self.sliding_layers) * tokens_per_sequence
        sliding = self.sliding_layers * min(self.sliding_window, tokens_per_sequence)
        return per_token_layer * (full + sliding) * sequences


@dataclass(frozen=True, kw_only=True)
class ModelPreset:
    name: str
    target: str  # the target's hub id: what `make stage-weights` downloads
    drafter: str | None  # the P-EAGLE head's hub id; None: no public head, bring your own
    served_model_name: str
    trained_k: int | None  # the K the head was trained for; None: unknown (state it when you stage one)
    recommended_k: int
    weights_gib: float  # the target's weights on the GPUs, at the dtype it is served in
    head_gib: float  # the head's weights
    attention: AttentionShape | None  # None: not published; the KV cache is then not checked
    model_max_len: int  # the model's own context limit
    max_model_len: int
    max_num_seqs: int
    kv_cache_dtype: str = "auto"
    instances: Mapping[str, int] = field(default_factory=dict)  # instance type -> tensor-parallel size
    extra_args: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    extra_environment: Mapping[str, str] = field(default_factory=dict)

    def serving(self, *, target_model: str, drafter_model: str, num_speculative_tokens: int | None = None,
                num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None,
                max_model_len: int | None = None, max_num_seqs: int | None = None,
                tensor_parallel_size: int | None = None, gpu_memory_utilization: float | None = None,
                dtype: str | None = None, served_model_name: str | None = None,
                extra_args: Mapping[str, str | int | float | bool] | None = None,
                extra_environment: Mapping[str, str] | None = None, bundle_manifest_sha256: str | None = None,
                request_capabilities: frozenset[str] | None = None,
                capture: CaptureConfig | None = None) -> ServingConfig:
        """The preset as a ServingConfig. Every keyword is a ServingConfig field; one left out (None) takes the
        preset's value (K, lengths, the served name, the card's flags) or else the contract's default.
        ``extra_args`` and ``extra_environment`` merge over the preset's."""
        given = dict(num_speculative_tokens=num_speculative_tokens,
                     num_speculative_tokens_per_batch_size=num_speculative_tokens_per_batch_size,
                     tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization,
                     dtype=dtype, bundle_manifest_sha256=bundle_manifest_sha256,
                     request_capabilities=request_capabilities, capture=capture)
        return ServingConfig(
            target_model=target_model, drafter_model=drafter_model,
            max_model_len=self.max_model_len if max_model_len is None else max_model_len,
            max_num_seqs=self.max_num_seqs if max_num_seqs is None else max_num_seqs,
            served_model_name=self.served_model_name if served_model_name is None else served_model_name,
            extra_args={**self.extra_args, "kv_cache_dtype": self.kv_cache_dtype, **(extra_args or {})},
            extra_environment={**self.extra_environment, **(extra_environment or {})},
            **{"num_speculative_tokens": self.recommended_k,
               **{name: value for name, value in given.items() if value is not None}})

    def check(self, serving: ServingConfig, *, instance_type: str, where: str = "preset") -> None:
        """ConfigError (naming the numbers) when ``serving`` cannot run this preset on ``instance_type``."""
        instance = InstanceType.of(instance_type)  # a malformed or unknown type is named as such first
        if self.trained_k is not None and serving.num_speculative_tokens > self.trained_k:
            raise ConfigError(f"{where}.num_speculative_tokens",
                              f"got {serving.num_speculative_tokens}, but the {self.name} head was trained for K up "
                              f"to {self.trained_k}; allowed: 1..{self.trained_k} (acceptance collapses past it)")
        if serving.max_model_len > self.model_max_len:
            raise ConfigError(f"{where}.max_model_len", f"got {serving.max_model_len}; allowed: at most "
                                                        f"{self.model_max_len}, {self.name}'s own context")
        if instance_type not in self.instances:
            raise ConfigError(f"{where}.instance_type", f"got {instance_type!r}; allowed for {self.name}: "
                                                        f"{sorted(self.instances)}")
        tp = self.instances[instance_type]
        if serving.tensor_parallel_size != tp:
            raise ConfigError(f"{where}.tensor_parallel_size",
                              f"got {serving.tensor_parallel_size}; {self.name} on {instance_type} uses {tp}")
        usable = instance.spec.gpu_memory_gb * 1e9 / GIB * serving.gpu_memory_utilization
        weights = (self.weights_gib + self.head_gib) / tp
        kv_dtype = str(serving.extra_args.get("kv_cache_dtype", "auto"))
        kv = 0.0
        if self.attention is not None:
            kv = self.attention.kv_bytes(tokens_per_sequence=serving.max_model_len, sequences=serving.max_num_seqs,
                                         dtype_bytes=_KV_BYTES.get(kv_dtype, 2)) / GIB / tp
        if weights + kv > usable:
            raise ConfigError(
                f"{where}.max_num_seqs",
                f"{self.name} does not fit {instance_type}: weights {self.weights_gib:.1f} GiB + head "
                f"{self.head_gib:.1f} GiB over {tp} GPU(s) = {weights:.1f} GiB, plus the KV cache for "
                f"{serving.max_num_seqs} x {serving.max_model_len} tokens at {kv_dtype} = {kv:.1f} GiB per GPU, is "
                f"{weights + kv:.1f} GiB; allowed: at most {usable:.1f} GiB ({instance.spec.gpu_memory_gb} GB x "
                f"gpu_memory_utilization {serving.gpu_memory_utilization}); lower max_num_seqs or max_model_len, or "
                "choose a larger instance")



# The flags both GPT-OSS heads' cards serve with [1][2] (rendered by the DLC rule, e.g.
# SM_VLLM_ASYNC_SCHEDULING=true, SM_VLLM_NO_ENABLE_PREFIX_CACHING=true).
_GPT_OSS_FLAGS = {"async_scheduling": True, "enable_prefix_caching": False, "stream_interval": 20,
                  "max_cudagraph_capture_size": 4096, "max_num_batched_tokens": 32768}
_GPT_OSS_ENV = {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1"}  # [1]
_SINGLE = 1
# The 30-120B models: one 96 GB or larger GPU, or their weights split over 2 (80-96 GB) or 4 (48 GB) GPUs.
_LARGE = {"ml.g7e.2xlarge": _SINGLE, "ml.g7e.12xlarge": 2, "ml.p5.48xlarge": 2, "ml.p5e.48xlarge": _SINGLE,
          "ml.p5en.48xlarge": _SINGLE, "ml.p6-b200.48xlarge": _SINGLE, "ml.g6e.12xlarge": 4}

GPT_OSS_20B = ModelPreset(
    name="GPT-OSS-20B", target="openai/gpt-oss-20b", drafter="amazon/GPT-OSS-20B-P-EAGLE",
    served_model_name="gpt-oss-20b", trained_k=10, recommended_k=7,  # [1]
    weights_gib=13.7, head_gib=3.4,  # [4]; the head: about 1.8B parameters in bf16 [1]
    attention=AttentionShape(layers=24, kv_heads=8, head_dim=64, sliding_layers=12, sliding_window=128),  # [4]
    model_max_len=131072, max_model_len=32768, max_num_seqs=16, kv_cache_dtype="fp8",  # [1]
    instances={"ml.g6e.xlarge": _SINGLE, "ml.g6e.2xlarge": _SINGLE, "ml.g6e.4xlarge": _SINGLE,
               "ml.g7e.2xlarge": _SINGLE, "ml.g7e.4xlarge": _SINGLE, "ml.p5.4xlarge": _SINGLE,
               "ml.p5e.48xlarge": _SINGLE, "ml.p5en.48xlarge": _SINGLE, "ml.p6-b200.48xlarge": _SINGLE},
    extra_args=_GPT_OSS_FLAGS, extra_environment=_GPT_OSS_ENV,
)

GPT_OSS_120B = ModelPreset(
    name="GPT-OSS-120B", target="openai/gpt-oss-120b", drafter="amazon/gpt-oss-120b-p-eagle",
    served_model_name="gpt-oss-120b", trained_k=8, recommended_k=5,  # [2]
    weights_gib=65.0, head_gib=3.2,  # [4]; the head: about 1.7B parameters in bf16 [2]
    attention=AttentionShape(layers=36, kv_heads=8, head_dim=64, sliding_layers=18, sliding_window=128),  # [4]
    model_max_len=131072, max_model_len=32768, max_num_seqs=16, kv_cache_dtype="fp8",  # [2]
    instances=_LARGE,
    extra_args=_GPT_OSS_FLAGS, extra_environment=_GPT_OSS_ENV,
)

QWEN3_CODER_30B = ModelPreset(
    name="Qwen3-Coder-30B-A3B-Instruct", target="Qwen/Qwen3-Coder-30B-A3B-Instruct",
    drafter="amazon/Qwen3-Coder-30B-A3B-Instruct-P-EAGLE", served_model_name="qwen3-coder-30b-a3b",
    trained_k=18, recommended_k=10,  # [3]
    weights_gib=57.0, head_gib=1.5,  # [5]; the head's size is not on its card: an estimate for a 4-layer head
    attention=AttentionShape(layers=48, kv_heads=4, head_dim=128),  # [5]
    model_max_len=262144, max_model_len=16384, max_num_seqs=8,  # [3]
    instances=_LARGE,
    extra_args={"async_scheduling": True, "enable_prefix_caching": False},  # [3]
)

GEMMA_4_31B = ModelPreset(
    name="Gemma-4-31B-IT", target="google/gemma-4-31b-it", drafter=None, served_model_name="gemma-4-31b-it",
    trained_k=None, recommended_k=5,  # [6]: no public head; yours states its own K
    weights_gib=58.0, head_gib=2.0, attention=None,  # 31B parameters in bf16; the head: an estimate
    model_max_len=262144, max_model_len=16384, max_num_seqs=16,
    instances=_LARGE,
    extra_args={"async_scheduling": True, "enable_prefix_caching": False},
)

PRESETS: dict[str, ModelPreset] = {p.name: p for p in (GPT_OSS_20B, GPT_OSS_120B, QWEN3_CODER_30B, GEMMA_4_31B)}
