"""What differs between two configs or trajectories, as `key: old -> new` lines for a resume's
notes and refusals."""

from __future__ import annotations

from typing import Any

from octlm.config.shape import SHAPE_KEYS
from octlm.config.train import ABSENT_MEANS


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Keys whose values differ, as `key: old -> new`."""
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def trajectory_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`changed_keys` of two trajectories, the keys left out at their default filled in; an
    unset shape key reads "the preset's" (None would say nothing to a user)."""
    changes = changed_keys({**ABSENT_MEANS, **old}, {**ABSENT_MEANS, **new})
    shape = tuple(f"{key}: " for key in SHAPE_KEYS)
    return [c.replace("None", "the preset's") if c.startswith(shape) else c for c in changes]
