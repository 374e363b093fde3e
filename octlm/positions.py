"""Where each token sits: RoPE's cos/sin tables and rotation, and, for rows of packed
examples, which positions may attend to which and where each example's positions restart."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def rope_tables(head_dim: int, n_positions: int, base: float) -> tuple[Tensor, Tensor]:
    """float32 (cos, sin) tables of shape (n_positions, head_dim) in the rotate_half layout."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(n_positions, dtype=torch.float32), inv_freq)  # (T, D/2)
    # Both halves share frequencies: dim i pairs with i + D/2 (HF Llama layout, not interleaved).
    angles = torch.cat((angles, angles), dim=-1)  # (T, D)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (..., T, D) by position; done in float32 so bf16 inputs keep precise angles."""
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x32 * cos.float() + rotated * sin.float()).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Holds the shared cos/sin tables; non-persistent so they never enter the state_dict."""

    def __init__(self, head_dim: int, n_positions: int, base: float) -> None:
        super().__init__()
        cos, sin = rope_tables(head_dim, n_positions, base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, seq_len: int) -> tuple[Tensor, Tensor]:
        return self.cos[:seq_len], self.sin[:seq_len]

    def at(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Tables at per-row `positions` (B, T), shaped (B, 1, T, D) to broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def segment_attention(segments: Tensor) -> tuple[Tensor, Tensor]:
    """For packed rows (B, T) of contiguous segment ids: the attention mask (B, 1, T, T), True
    where a query may attend (earlier or same position, same segment), and each position's
    index inside its segment (B, T), where RoPE restarts. A packed example is then computed as
    it would be alone, up to the rounding of a masked kernel."""
    B, T = segments.shape
    index = torch.arange(T, device=segments.device)
    same = segments.unsqueeze(2) == segments.unsqueeze(1)  # (B, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=segments.device).tril()
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return (same & causal).unsqueeze(1), index - first
