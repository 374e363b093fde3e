"""The exact path's packed weights kept with a model across calls, for a model that serves:
`octlm generate`, chat, `octlm serve`, evaluation (`load_model` keeps every model it loads).

Each call of the exact path (`forward_exact`) otherwise packs the weights afresh: oneDNN's chunks
for many rows, transposed copies and panels for a decode's few (`octlm/model/exact_products.py`). On
`small` that is about as much as the weights (88 MB) copied, over 100 ms a `generate` call
(docs/performance.md, "A head in panels, and packed weights kept"): paid by every chat turn and
every evaluation micro-batch. A kept model's packings live as long as the model does, at the cost of
holding them (up to about three copies of its float32 weights), and each is made again once its
weights change (`stamp`: an optimizer's step, a loaded state dict), so a kept model may also train
(RL). The bits are the same either way: a packing is a function of the weights alone, and which call
serves a row count is decided per call.

Only float32 on CPU outside autocast is kept (where the packed products run); elsewhere the
products' joined copies are a call's or a decode's own, as before.
"""

from __future__ import annotations

import weakref

from torch import Tensor, nn

from octlm.model.packed import float32_cpu


class Stamped(dict):
    """`packs` that outlive a call (a kept model's, ): each entry is
    checked against its weights' `stamp` on every use. A call's or a decode's own packs are
    not (their weights must not change while they live), which saves a decode step of `tiny`
    about 2%."""


def stamp(weights: tuple[Tensor, ...]) -> tuple[int, ...]:
    """What changes when a weight does: which tensor it is, where its values live and PyTorch's
    count of its in-place writes (an optimizer's step, `load_state_dict`, `copy_`). A write
    through `.data` escapes the count: `forget_packed` after one."""
    return tuple(n for w in weights for n in (id(w), w.data_ptr(), w._version))


KEPT: weakref.WeakKeyDictionary[nn.Module, dict[int, Stamped]] = weakref.WeakKeyDictionary()
"""Per kept model: per exact kernel, its `packs` (`product`'s)."""


def keep_packed(model: nn.Module) -> None:
    """Keep `model`'s exact packings across calls from now on."""
    KEPT.setdefault(model, {})


def forget_packed(model: nn.Module) -> None:
    """Drop `model`'s kept packings (their memory), and keep none from now on. Needed after a
    write to its weights that PyTorch does not count (through `.data`), else harmless."""
    KEPT.pop(model, None)


def kept_packs(model: nn.Module, kernel: int) -> Stamped | None:
    """The kept packs of `model` for `kernel`, or None (not kept, or not float32 on CPU outside
    autocast)."""
    kept = KEPT.get(model)
    if kept is None or not float32_cpu(next(model.parameters())):
        return None
    return kept.setdefault(kernel, Stamped())
