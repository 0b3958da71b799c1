"""The EAGLE-3 / P-EAGLE drafter head, written to compute exactly what vLLM 0.32's `Eagle3LlamaForCausalLM` runs.

Layer 0 (checkpoint prefix ``midlayer.``) is the EAGLE-3 layer: its attention reads the normalised token
embedding and the normalised incoming hidden state side by side (width 2H). Layers 1.. (``layers.N.``, for
deeper heads) are plain pre-norm Llama layers on the running hidden state (width H); vLLM builds them the
same way and feeds them no embedding. The incoming hidden state is, per row:
- a real row: `fc` of the target's auxiliary hidden states (three layers concatenated, width 3H);
- a P-EAGLE mask row: `fc(mask_hidden)`, one learned vector shared by every draft position 2..K;
- a sequential EAGLE-3 step d > 0: the head's own pre-norm output from step d-1 (no `fc`).
Parameter names equal the checkpoint keys vLLM loads (`midlayer.` maps to its `layers.0.`), so
`state_dict()` is the checkpoint. The forward takes an explicit boolean attention mask and explicit RoPE
positions because training packs many draft positions into one sequence.

The token embedding either trains whole (it starts as the target's; the published P-EAGLE recipes train
it, and on SmolLM2 it lifted held-out agreement at depths 2-4 over a frozen one) or stays the target's with
one learned row, the mask token's (P-EAGLE's mask token is the one token whose meaning is new). The LM head
may cover a reduced draft vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

KV = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class DrafterShape:
    vocab_size: int
    hidden_size: int = 128
    heads: int = 4
    intermediate_size: int = 384
    aux_layers: int = 3
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    layers: int = 1  # decoder layers: 1 is EAGLE-3's; published P-EAGLE heads use 4
    kv_heads: int | None = None  # None: as many as query heads
    draft_vocab_size: int | None = None  # rows of the LM head; None: the whole vocabulary
    target_hidden_size: int | None = None  # width of each aux feature; None: hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    @property
    def draft_vocab(self) -> int:
        return self.draft_vocab_size or self.vocab_size

    @property
    def fused_width(self) -> int:
        return self.aux_layers * (self.target_hidden_size or self.hidden_size)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style RoPE (the halves of each head rotate together), as vLLM's Llama uses.

    x: [batch, heads, rows, head_dim]; positions: [rows], or [batch, rows] when each sequence has its own.
    """
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float32) / half))
    angles = positions.float()[..., None] * inv_freq
    if angles.dim() == 3:
        angles = angles[:, None]  # one set of positions per sequence, shared by its heads
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, shape: DrafterShape, in_width: int):
        super().__init__()
        kv_heads = shape.kv_heads or shape.heads
        self.q_proj = nn.Linear(in_width, shape.heads * shape.head_dim, bias=False)
        self.k_proj = nn.Linear(in_width, kv_heads * shape.head_dim, bias=False)
        self.v_proj = nn.Linear(in_width, kv_heads * shape.head_dim, bias=False)
        self.o_proj = nn.Linear(shape.heads * shape.head_dim, shape.hidden_size, bias=False)
        self.heads, self.kv_heads, self.head_dim, self.theta = shape.heads, kv_heads, shape.head_dim, shape.rope_theta

    def project_kv(self, x: torch.Tensor, positions: torch.Tensor) -> KV:
        k = rotate(self._split(self.k_proj(x), self.kv_heads), positions, self.theta)
        return self._widen(k), self._widen(self._split(self.v_proj(x), self.kv_heads))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, past: list[KV]
                ) -> tuple[torch.Tensor, KV]:
        """`mask` [rows, keys] is True where a row may attend; keys are `past` rows first, then these rows."""
        q = rotate(self._split(self.q_proj(x), self.heads), positions, self.theta)
        k, v = self.project_kv(x, positions)
        keys = torch.cat([kv[0] for kv in past] + [k], dim=2)
        values = torch.cat([kv[1] for kv in past] + [v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        b, _, rows, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, rows, -1)), (k, v)

    def forward_ttt(self, x: torch.Tensor, positions: torch.Tensor, past: list[KV],
                    rows: torch.Tensor | None = None) -> tuple[torch.Tensor, KV]:
        """Training-time-test attention without materialising the [R, (d+1)R] mask: row r attends causally to
        the first pass's keys (past[0]) and to its own row in every later pass (past[1:] and this one).

        ``rows`` [B, S]: a later pass runs on these rows of the first pass only (each sequence its own), so
        each attends to the first pass's keys up to its row, and ``past[1:]`` hold those rows alone."""
        q = rotate(self._split(self.q_proj(x), self.heads), positions, self.theta)
        k, v = self.project_kv(x, positions)
        if not past:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scale = self.head_dim ** -0.5
            k0, v0 = past[0]
            if rows is None:
                n = q.shape[2]
                causal = torch.ones(n, n, dtype=torch.bool).tril()
            else:
                causal = (torch.arange(k0.shape[2])[None, None, None, :] <= rows[:, None, :, None])
            first = (q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))
            diag_k = torch.stack([kv[0] for kv in past[1:]] + [k], dim=-2)  # [B, h, R, d, hd]
            diag_v = torch.stack([kv[1] for kv in past[1:]] + [v], dim=-2)
            diag = (q.unsqueeze(-2) * diag_k).sum(-1) * scale  # [B, h, R, d]
            probs = torch.cat([first, diag], dim=-1).softmax(-1)
            keys0 = k0.shape[2]
            out = probs[..., :keys0] @ v0 + (probs[..., keys0:].unsqueeze(-1) * diag_v).sum(-2)
        b, _, rows, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, rows, -1)), (k, v)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, rows, _ = x.shape
        return x.view(b, rows, heads, self.head_dim).transpose(1, 2)

    def _widen(self, x: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention: each KV head serves heads // kv_heads query heads, as in vLLM's Llama."""
        return x if self.kv_heads == self.heads else x.repeat_interleave(self.heads // self.kv_heads, dim=1)


class MLP(nn.Module):
    def __init__(self, shape: DrafterShape):
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, shape.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Layer 0 reads [embedding | hidden] (2H); later layers read the hidden state (H). Every layer has a
    ``hidden_norm``, as vLLM builds them; only layer 0 uses it."""

    def __init__(self, shape: DrafterShape, *, first: bool):
        super().__init__()
        self.first = first
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.hidden_norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.self_attn = Attention(shape, (2 if first else 1) * shape.hidden_size)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor, embeds: torch.Tensor | None, positions: torch.Tensor,
                mask: torch.Tensor | None, past: list[KV], ttt_rows: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, KV]:
        if self.first:
            # vLLM's default (norm_before_residual false): the residual is the hidden state before hidden_norm.
            attn_in = torch.cat([self.input_layernorm(embeds), self.hidden_norm(x)], dim=-1)
        else:
            attn_in = self.input_layernorm(x)
        if mask is None:
            attn, kv = self.self_attn.forward_ttt(attn_in, positions, past, ttt_rows)
        else:
            attn, kv = self.self_attn(attn_in, positions, mask, past)
        x = attn + x
        return self.mlp(self.post_attention_layernorm(x)) + x, kv


class DrafterHead(nn.Module):
    """Both drafters share this architecture; P-EAGLE's adds the `mask_hidden` parameter (width 3H).

    ``mask_token`` (P-EAGLE with ``learn_embedding=False``): the token whose embedding row is learned while
    the rest of the embedding stays frozen.
    """

    def __init__(self, shape: DrafterShape, *, parallel: bool, learn_embedding: bool = True,
                 mask_token: int | None = None):
        super().__init__()
        self.shape = shape
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.fc = nn.Linear(shape.fused_width, shape.hidden_size, bias=False)
        self.midlayer = DecoderLayer(shape, first=True)
        # ModuleDict keyed "1", "2", ...: state_dict names layers.1.*, the checkpoint keys vLLM reads.
        self.layers = nn.ModuleDict({str(i): DecoderLayer(shape, first=False) for i in range(1, shape.layers)})
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.lm_head = nn.Linear(shape.hidden_size, shape.draft_vocab, bias=False)
        self.mask_hidden = nn.Parameter(torch.randn(shape.fused_width) * 0.02) if parallel else None
        self.learn_embedding = learn_embedding
        self.mask_token = mask_token
        self.mask_embedding = None
        if not learn_embedding:
            self.embed_tokens.weight.requires_grad_(False)
            if parallel:
                if mask_token is None:
                    raise ValueError("a P-EAGLE head with a frozen embedding needs the mask token to learn")
                self.mask_embedding = nn.Parameter(torch.zeros(shape.hidden_size))

    def decoder_layers(self) -> list[DecoderLayer]:
        return [self.midlayer, *self.layers.values()]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        embeds = self.embed_tokens(tokens)
        if self.mask_embedding is None:
            return embeds
        return torch.where((tokens == self.mask_token)[..., None], self.mask_embedding, embeds)

    def step_hidden(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                    mask: torch.Tensor | None, past: list[list[KV]] | None = None,
                    ttt_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, list[KV]]:
        """One pass of the head without its LM head. tokens [B, R]; hidden [B, R, H] (already through `fc` where
        vLLM applies it); positions [R] or [B, R]; mask [R, keys] or [B, 1, R, keys].

        `past` holds earlier passes' keys and values, one list per pass with one (k, v) per layer.
        `mask` None selects the training-time-test attention pattern (see Attention.forward_ttt), on the first
        pass's rows ``ttt_rows`` [B, S] alone when given.
        Returns (pre-norm output, fed to the next sequential step; this pass's per-layer (k, v)).
        """
        embeds = self.embed(tokens)
        x, kvs = hidden, []
        for i, layer in enumerate(self.decoder_layers()):
            x, kv = layer(x, embeds, positions, mask, [p[i] for p in past or []], ttt_rows)
            kvs.append(kv)
        return x, kvs

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The draft-vocabulary logits of pre-norm outputs ``x`` (any leading shape)."""
        return self.lm_head(self.norm(x))

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
             past: list[list[KV]] | None = None) -> tuple[torch.Tensor, torch.Tensor, list[KV]]:
        """:meth:`step_hidden` with the logits of every row: (logits, pre-norm output, per-layer (k, v))."""
        x, kvs = self.step_hidden(tokens, hidden, positions, mask, past)
        return self.logits(x), x, kvs

    def shared_hidden(self) -> torch.Tensor:
        assert self.mask_hidden is not None, "only the P-EAGLE drafter has mask_hidden"
        return self.fc(self.mask_hidden)

    def embedding_for_checkpoint(self) -> torch.Tensor:
        """The embedding vLLM should use: with a frozen embedding, the target's with the learned mask row."""
        weight = self.embed_tokens.weight.detach().clone()
        if self.mask_embedding is not None:
            weight[self.mask_token] = self.mask_embedding.detach()
        return weight
