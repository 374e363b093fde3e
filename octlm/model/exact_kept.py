"""The exact path's packed weights kept with a model across calls, for a model that serves:
`octlm generate`, chat, `octlm serve`, evaluation (`load_model` keeps every model it loads).

Each call of the exact path (`forward_exact`) otherwise packs the weights afresh: oneDNN's chunks
for many rows, transposed copies and panels for a decode's few (`octlm/model/exact_products.py`).
On `small` that is about as much as the weights (88 MB) copied, over 100 ms a `generate` call
(docs/performance.md, "A head in panels, and packed weights kept"): paid by every chat turn and
every evaluation micro-batch. A kept model's packings live as long as the model does, at the cost
of holding them (up to about three copies of its float32 weights), and each is made again once its
weights change (`stamp` and `Kept.probe`: an optimizer's step, a loaded state dict), so a kept
model may also train. The bits are the same either way: a packing is a function of the weights
alone, and which call serves a row count is decided per call.

Only float32 on CPU outside autocast is kept (where the packed products run); elsewhere the
products' joined copies are a call's or a decode's own, as before.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from octlm.model.packed import float32_cpu


class Stamped(dict):
    """`packs` that outlive a call (a kept model's): each entry is checked against its weights'
    `stamp` on every use. A call's or a decode's own packs are not (their weights must not
    change while they live), which saves a decode step of `tiny` about 2%."""


def stamp(weights: tuple[Tensor, ...]) -> tuple[int, ...]:
    """Which tensor each weight is, where its values live and PyTorch's count of its in-place
    writes (`load_state_dict`, `copy_`, a foreach optimizer's step). The count misses some
    writes: a fused optimizer's step (PyTorch 2.13's fused AdamW on CPU leaves it unchanged)
    and writes through `.data`; `Kept.probe` catches those."""
    return tuple(n for w in weights for n in (id(w), w.data_ptr(), w._version))


PROBES = 64
"""Values sampled from each weight (evenly spaced) for `Kept.probe`."""


@dataclass
class Kept:
    """A kept model's packs per exact kernel, and `probe`: the weights' sampled values when
    they were last checked."""

    packs: dict[int, Stamped] = field(default_factory=dict)
    probe: Tensor | None = None

    def check(self, model: nn.Module) -> None:
        """Drop every packing if a sampled value changed since the last check (a training step
        changes almost every value of every weight; `stamp` alone misses a fused optimizer's)."""
        now = probe_of(model)
        if self.probe is None or not torch.equal(now, self.probe):
            self.packs.clear()
        self.probe = now


def probe_of(model: nn.Module) -> Tensor:
    """`PROBES` evenly spaced values of each parameter, in one tensor (about 0.1 ms)."""
    parts = []
    for p in model.parameters():
        flat = p.detach().reshape(-1)
        parts.append(flat[:: max(1, flat.numel() // PROBES)])
    return torch.cat(parts)


KEPT: weakref.WeakKeyDictionary[nn.Module, Kept] = weakref.WeakKeyDictionary()
"""Per kept model: its `Kept`."""


def keep_packed(model: nn.Module) -> None:
    """Keep `model`'s exact packings across calls from now on."""
    KEPT.setdefault(model, Kept())


def forget_packed(model: nn.Module) -> None:
    """Drop `model`'s kept packings (their memory), and keep none from now on."""
    KEPT.pop(model, None)


def kept_packs(model: nn.Module, kernel: int, check: bool) -> Stamped | None:
    """The kept packs of `model` for `kernel`, or None (not kept, or not float32 on CPU outside
    autocast). `check`: compare the weights' probe first (a call that starts a forward or a
    decode; a decode's later steps skip it, its weights must not change meanwhile)."""
    kept = KEPT.get(model)
    if kept is None or not float32_cpu(next(model.parameters())):
        return None
    if check:
        kept.check(model)
    return kept.packs.setdefault(kernel, Stamped())
