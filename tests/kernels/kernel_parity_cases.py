"""The parity table: shapes and edge cases of the parallel-draft input build (small: the interpreter is slow)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    name: str
    k: int
    query_lens: tuple[int, ...]
    num_rejected: tuple[int, ...] | None  # None: vLLM passes no rejected counts (first step after prefill)
    first_positions: tuple[int, ...]
    hidden_size: int = 32
    dtype: str = "float32"
    block_size: int = 4
    max_model_len: int = 64
    seed: int = 0
    notes: str = field(default="", compare=False)


CASES: tuple[Case, ...] = (
    Case("no_rejected_tensor", 4, (5, 5, 5), (0, 0, 0), (10, 13, 16), notes="counts given, all 0"),
    Case("no_rejected_none", 4, (5, 5, 5), None, (10, 13, 16), notes="num_rejected=None"),
    Case("all_rejected", 4, (5, 5), (4, 4), (8, 20), notes="only the bonus row is valid"),
    Case("mixed_rejected", 4, (5, 5, 5, 5), (0, 1, 3, 4), (0, 9, 17, 30)),
    Case("k1", 1, (2, 2, 2), (0, 1, 1), (3, 7, 11), notes="no mask rows"),
    Case("k2", 2, (3, 3), (2, 0), (4, 40)),
    Case("k16", 16, (17, 17), (0, 9), (5, 30), max_model_len=128),
    Case("mixed_lengths", 4, (1, 7, 3, 12), (0, 0, 2, 0), (0, 5, 19, 2), notes="prefill chunks beside decodes"),
    Case("long_prefill_multi_row_block", 7, (40,), None, (0,), max_model_len=128, notes="3 row blocks of 16"),
    Case("max_len_boundary", 4, (5, 5, 5), (0, 2, 0), (24, 27, 59), max_model_len=64,
         notes="rows reach max_model_len exactly: slot -1 from there"),
    Case("max_len_tight", 3, (4, 4), (0, 1), (28, 27), max_model_len=32, notes="mask rows past the end"),
    Case("hidden_two_col_blocks", 3, (4, 4), (1, 0), (2, 9), hidden_size=1100, notes="1024 + ragged 76 columns"),
    Case("bf16", 4, (5, 5, 5), (2, 0, 4), (1, 6, 50), dtype="bfloat16", hidden_size=64),
    Case("fp16_block16", 7, (8, 8), (3, 7), (100, 3), dtype="float16", block_size=16, max_model_len=256),
    Case("batch32_decode", 3, (4,) * 32, tuple((i * 7) % 4 for i in range(32)), tuple(5 * i for i in range(32)),
         max_model_len=256, seed=3),
)
