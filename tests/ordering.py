"""The suite's order: the modules that hold its slowest tests first, dealt out so that each
pytest-xdist worker starts with its share of them.

`make test` runs `-n 3 --dist worksteal`. Worksteal hands each worker a contiguous, equal-count
slice of the collection, and an idle worker then steals from the end of the busiest one's
queue. A long test that comes late leaves the other workers idle at the end for as long as it
runs (a 100 s walkthrough collected last is 100 s of one idle core). Here the modules that hold
a test listed in tests/slowest.txt (its seconds from a `--durations` run) are moved to the head
of the slices, the longest first, each to the slice with the least listed work so far; every
other test keeps its place, and a module's tests stay together in their order (its module
fixtures are built once per worker, as before). The order changes only when tests start, never
what they check.

Refresh the list after a change of costs: `make test` prints the slowest 25; their lines
("12.34s call tests/x.py::test_y") pasted into tests/slowest.txt are its format.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

LIST = Path(__file__).with_name("slowest.txt")

Item = TypeVar("Item")


def known_seconds(path: Path = LIST) -> dict[str, float]:
    """{node id: seconds} from `path`'s "12.34s call tests/x.py::test_y" lines (setup and
    teardown lines count to their test too)."""
    seconds: dict[str, float] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].endswith("s") and not line.startswith("#"):
            seconds[parts[2]] = seconds.get(parts[2], 0.0) + float(parts[0][:-1])
    return seconds


def workers() -> int:
    """The number of xdist workers this session runs on (1 without xdist)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def slices(total: int, n: int) -> list[int]:
    """The sizes of the slices xdist's worksteal first hands `n` workers out of `total` tests."""
    sizes = []
    for w in range(n):
        sizes.append((total - sum(sizes)) // (n - w))
    return sizes


def longest_first(items: Sequence[Item], seconds: dict[str, float], n: int) -> list[Item]:
    """`items` (pytest items: each has a `nodeid`) reordered as the module docstring says, for
    `n` workers."""
    module = [item.nodeid.split("::")[0] for item in items]  # type: ignore[attr-defined]
    cost: dict[str, float] = {}
    for item, name in zip(items, module, strict=True):
        cost[name] = cost.get(name, 0.0) + seconds.get(item.nodeid, 0.0)  # type: ignore[attr-defined]
    slow = sorted((m for m, c in cost.items() if c > 0), key=lambda m: (-cost[m], m))
    heads: list[list[Item]] = [[] for _ in range(n)]
    load = [0.0] * n
    for name in slow:
        w = load.index(min(load))
        heads[w] += [item for item, m in zip(items, module, strict=True) if m == name]
        load[w] += cost[name]
    rest = [item for item, m in zip(items, module, strict=True) if cost[m] == 0]
    ordered: list[Item] = []
    for w, size in enumerate(slices(len(items), n)):
        take = max(0, size - len(heads[w]))
        ordered += heads[w] + rest[:take]
        rest = rest[take:]
    return ordered + rest
