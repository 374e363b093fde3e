"""The suite's order (tests/ordering.py): only when tests start moves, never which run."""

from __future__ import annotations

from dataclasses import dataclass

from tests.ordering import known_seconds, longest_first, slices


@dataclass
class Item:
    nodeid: str


def items() -> list[Item]:
    names = [f"tests/m{m}.py::t{t}" for m in range(6) for t in range(5)]
    return [Item(n) for n in names]


def test_slow_modules_lead_each_workers_slice_and_nothing_is_lost() -> None:
    seconds = {"tests/m4.py::t2": 90.0, "tests/m1.py::t0": 50.0, "tests/m5.py::t4": 45.0}
    ordered = longest_first(items(), seconds, 2)
    assert sorted(i.nodeid for i in ordered) == sorted(i.nodeid for i in items())
    assert slices(len(ordered), 2) == [15, 15]
    first, second = ordered[:15], ordered[15:]
    # The longest module heads slice 0; the next two (50 + 45 < 90) head slice 1, longest first.
    assert [i.nodeid for i in first[:5]] == [f"tests/m4.py::t{t}" for t in range(5)]
    assert [i.nodeid.split("::")[0] for i in second[:10]] == ["tests/m1.py"] * 5 + [
        "tests/m5.py"
    ] * 5
    # The other modules keep their order and their tests stay together.
    rest = [i.nodeid for i in ordered if i.nodeid.split("::")[0] in ("tests/m0.py", "tests/m2.py")]
    assert rest == [i.nodeid for i in items() if i.nodeid.startswith(("tests/m0", "tests/m2"))]


def test_one_worker_runs_the_slowest_module_first_and_no_list_changes_nothing() -> None:
    ordered = longest_first(items(), {"tests/m3.py::t1": 5.0}, 1)
    assert ordered[0].nodeid == "tests/m3.py::t0" and len(ordered) == len(items())
    assert longest_first(items(), {}, 2) == items()


def test_the_list_reads_durations_lines(tmp_path) -> None:
    path = tmp_path / "slowest.txt"
    path.write_text(
        "# a comment\n12.50s call     tests/a.py::test_x\n0.50s setup    tests/a.py::test_x\n"
        "3.00s call     tests/b.py::test_y[ddp]\nnot a line\n"
    )
    assert known_seconds(path) == {"tests/a.py::test_x": 13.0, "tests/b.py::test_y[ddp]": 3.0}
