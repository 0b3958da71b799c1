"""The EAGLE-3 / P-EAGLE drafter head, written to compute exactly what vLLM 0.32's `Eagle3LlamaForCausalLM` runs.

One decoder layer whose attention reads the normalised token embedding and the normalised incoming hidden
state side by side (width 2H). The incoming hidden state is, per row:
- a real row: `fc` of the target's auxiliary hidden states (three layers concatenated, width 3H);
- a P-EAGLE mask row: `fc(mask_hidden)`, one learned vector shared by every draft position 2..K;
- a sequential EAGLE-3 step d > 0: the head's own pre-norm output from step d-1 (no `fc`).
Parameter names equal the checkpoint keys vLLM loads (`midlayer.` maps to its `layers.0.`), so
`state_dict()` is the checkpoint. The forward takes an explicit boolean attention mask and explicit RoPE
positions because training packs many draft positions into one sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DrafterShape:
    vocab_size: int
    hidden_size: int = 128
    heads: int = 4
    intermediate_size: int = 384
    aux_layers: int = 3
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style RoPE (the halves of each head rotate together), as vLLM's Llama uses.

    x: [batch, heads, rows, head_dim]; positions: [rows].
    """
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float32) / half))
    angles = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, shape: DrafterShape):
        super().__init__()
        width, inner = shape.hidden_size, shape.heads * shape.head_dim
        self.q_proj = nn.Linear(2 * width, inner, bias=False)
        self.k_proj = nn.Linear(2 * width, inner, bias=False)
        self.v_proj = nn.Linear(2 * width, inner, bias=False)
        self.o_proj = nn.Linear(inner, width, bias=False)
        self.heads, self.head_dim, self.theta = shape.heads, shape.head_dim, shape.rope_theta

    def project_kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotate(self._split(self.k_proj(x)), positions, self.theta), self._split(self.v_proj(x))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """`mask` [rows, keys] is True where a row may attend; keys are `past` rows first, then these rows."""
        q = rotate(self._split(self.q_proj(x)), positions, self.theta)
        k, v = self.project_kv(x, positions)
        keys = torch.cat([kv[0] for kv in (past or [])] + [k], dim=2)
        values = torch.cat([kv[1] for kv in (past or [])] + [v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        b, _, rows, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, rows, -1)), (k, v)

    def forward_ttt(self, x: torch.Tensor, positions: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]]
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Training-time-test attention without materialising the [R, (d+1)R] mask: row r attends causally to
        the first pass's keys (past[0]) and to its own row in every later pass (past[1:] and this one)."""
        q = rotate(self._split(self.q_proj(x)), positions, self.theta)
        k, v = self.project_kv(x, positions)
        if not past:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scale = self.head_dim ** -0.5
            k0, v0 = past[0]
            rows = q.shape[2]
            causal = torch.ones(rows, rows, dtype=torch.bool).tril()
            first = (q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))
            diag_k = torch.stack([kv[0] for kv in past[1:]] + [k], dim=-2)  # [B, h, R, d, hd]
            diag_v = torch.stack([kv[1] for kv in past[1:]] + [v], dim=-2)
            diag = (q.unsqueeze(-2) * diag_k).sum(-1) * scale  # [B, h, R, d]
            probs = torch.cat([first, diag], dim=-1).softmax(-1)
            out = probs[..., :rows] @ v0 + (probs[..., rows:].unsqueeze(-1) * diag_v).sum(-2)
        b, _, rows, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, rows, -1)), (k, v)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, rows, _ = x.shape
        return x.view(b, rows, self.heads, self.head_dim).transpose(1, 2)


class MLP(nn.Module):
    def __init__(self, shape: DrafterShape):
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, shape.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, shape: DrafterShape):
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.hidden_norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.mlp = MLP(shape)


class DrafterHead(nn.Module):
    """Both drafters share this architecture; P-EAGLE's adds the `mask_hidden` parameter (width 3H)."""

    def __init__(self, shape: DrafterShape, *, parallel: bool):
        super().__init__()
        self.shape = shape
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.fc = nn.Linear(shape.aux_layers * shape.hidden_size, shape.hidden_size, bias=False)
        self.midlayer = MidLayer(shape)
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        self.mask_hidden = (nn.Parameter(torch.randn(shape.aux_layers * shape.hidden_size) * 0.02)
                            if parallel else None)

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
             past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One pass of the head. tokens [B, R]; hidden [B, R, H] (already through `fc` where vLLM applies it).

        `mask` None selects the training-time-test attention pattern (see Attention.forward_ttt).
        Returns (logits, pre-norm output fed to the next sequential step, this pass's (k, v)).
        """
        layer = self.midlayer
        embeds = layer.input_layernorm(self.embed_tokens(tokens))
        # vLLM's default (norm_before_residual false): the residual is the hidden state before hidden_norm.
        residual = hidden
        x = torch.cat([embeds, layer.hidden_norm(hidden)], dim=-1)
        if mask is None:
            attn, kv = layer.self_attn.forward_ttt(x, positions, past or [])
        else:
            attn, kv = layer.self_attn(x, positions, mask, past)
        x = attn + residual
        x = layer.mlp(layer.post_attention_layernorm(x)) + x
        return self.lm_head(self.norm(x)), x, kv

    def shared_hidden(self) -> torch.Tensor:
        assert self.mask_hidden is not None, "only the P-EAGLE drafter has mask_hidden"
        return self.fc(self.mask_hidden)
