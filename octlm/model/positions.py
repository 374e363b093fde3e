"""Where each token sits: RoPE's cos/sin tables and rotation, and, for rows of packed
examples or documents, which positions may attend to which (a dense mask, or FlexAttention's
block mask) and where each segment's positions restart."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention


def rope_tables(head_dim: int, n_positions: int, base: float) -> tuple[Tensor, Tensor]:
    """float32 (cos, sin) tables of shape (n_positions, head_dim) in the rotate_half layout."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(n_positions, dtype=torch.float32), inv_freq)  # (T, D/2)
    # Both halves share frequencies: dim i pairs with i + D/2 (HF Llama layout, not interleaved).
    angles = torch.cat((angles, angles), dim=-1)  # (T, D)
    return on_this_thread(torch.cos, angles), on_this_thread(torch.sin, angles)


SERIAL_ELEMENTS = 1024
"""Half the grain at which ATen splits an elementwise MKL-VML kernel (cos, sin, exp, ...)
across threads (2048, aten/src/ATen/cpu/vml.h): a call on fewer elements runs on the calling
thread alone."""


def on_this_thread(fn: Any, x: Tensor) -> Tensor:
    """fn(x) for an elementwise fn, computed in slices that never reach a second thread.

    Why: on a 2-core AVX-512 machine (PyTorch 2.13 CPU, MKL 2024.0 with VML_HA), in about one
    fresh process in six the first parallel `cos` of a 256 x 64 table came back up to 1.5e-4
    off on the second thread's half, while the same process's single-threaded `cos` was
    right: a race on first use, not rounding. The tables feed every step, so that process's
    run parted from every other. Slicing changes no bit of a correct result (each element is
    computed alone), so run folders written before this resume onto the same tables.
    """
    flat = x.reshape(-1)
    return torch.cat([fn(part) for part in flat.split(SERIAL_ELEMENTS)]).view_as(x)


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


def segment_positions(segments: Tensor) -> Tensor:
    """For rows (B, T) of contiguous segment ids: each position's index inside its segment
    (B, T), where RoPE restarts."""
    T = segments.shape[1]
    index = torch.arange(T, device=segments.device)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first


def segment_attention(segments: Tensor) -> tuple[Tensor, Tensor]:
    """For packed rows (B, T) of contiguous segment ids: the attention mask (B, 1, T, T), True
    where a query may attend (earlier or same position, same segment), and each position's
    index inside its segment (`segment_positions`). A packed example is then computed as it
    would be alone, up to the rounding of a masked kernel."""
    T = segments.shape[1]
    same = segments.unsqueeze(2) == segments.unsqueeze(1)  # (B, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=segments.device).tril()
    return (same & causal).unsqueeze(1), segment_positions(segments)


def segment_block_mask(segments: Tensor) -> BlockMask:
    """The mask of `segment_attention` as FlexAttention's block mask: blocks of 128 x 128
    positions that no query may attend are skipped, and the kernel stays a fused one (SDPA
    with a dense boolean mask leaves the flash kernel for a slower one on CUDA)."""
    B, T = segments.shape

    def same_segment_causal(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (kv <= q) & (segments[b, q] == segments[b, kv])

    return create_block_mask(same_segment_causal, B, None, T, T, device=segments.device)


@functools.cache
def compiled_flex_attention() -> Any:
    return torch.compile(flex_attention, dynamic=False)


def flex_attention_for(q: Tensor) -> Any:
    """FlexAttention compiled on CUDA (its fused kernel); elsewhere eager, which computes the
    same through the full score matrix (what the CPU tests check against the dense mask)."""
    if q.is_cuda:
        return compiled_flex_attention()

    def eager(*args: Any, **kwargs: Any) -> Tensor:
        with warnings.catch_warnings():  # "called without torch.compile()": meant here
            warnings.simplefilter("ignore", UserWarning)
            return flex_attention(*args, **kwargs)

    return eager
