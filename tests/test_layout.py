"""The house rules the layout makes visible, held by a test (docs/architecture.md).

No re-export under `noqa: F401`, no underscore name imported from another module, no package
file over 400 lines nor function over 60, and the rooms' import directions: `octlm/trainer/`
imports no tool, no `octlm.generation` and no CLI; nothing below the tools imports
`octlm.tools`; the flat top holds only what every stage needs; no module is named like an API
name;
`octlm/tokenizer/` (which `data/` imports) imports only itself and the base (`errors`,
`hashing`, `fsutil`). And the map: docs/architecture.md has one row per module, and its floor
table is the one the imports give.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "octlm"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60
BASE = ("octlm.errors", "octlm.hashing", "octlm.fsutil")  # import no other octlm module
# A file over 400 lines is a prompt to split it by concept, never to move code into a room named
# for the overflow. One that is a single concept read as a whole is listed here, with its
# ceiling and the reason; a function over 60 lines is always split.
LONG_FILES: dict[str, tuple[int, str]] = {
    "octlm/trainer/checkpoint.py": (
        430,
        "the checkpoint format: the layout a file holds, how it is written and read back, and "
        "the view of it every reader gets, which change together",
    ),
}


def sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE.parent)): p.read_text() for p in PACKAGE.rglob("*.py")}


@functools.cache
def parsed(text: str) -> ast.Module:
    """A package file's tree, parsed once per session (every check walks the same files)."""
    return ast.parse(text)


def imports(tree: ast.AST) -> list[ast.ImportFrom | ast.Import]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def imported_modules(tree: ast.AST) -> set[str]:
    names = set()
    for node in imports(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n.startswith("octlm")}


def wrong_imports(room: str, is_wrong: Callable[[str], bool]) -> dict[str, list[str]]:
    """Per module under `room` (a path prefix), the octlm modules it imports that `is_wrong`."""
    bad = {}
    for name, text in sources().items():
        if name.startswith(room):
            wrong = sorted(m for m in imported_modules(parsed(text)) if is_wrong(m))
            if wrong:
                bad[name] = wrong
    return bad


def test_no_reexports_under_noqa_f401() -> None:
    bad = [f for f, text in sources().items() if "noqa: F401" in text]
    assert bad == []


def test_no_private_name_is_imported_from_another_module() -> None:
    bad = []
    for name, text in sources().items():
        for node in imports(parsed(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("octlm"):
                bad += [
                    f"{name}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name[0] == "_" and not a.name.startswith("__")
                ]
    assert bad == []


def test_no_package_file_is_over_400_lines() -> None:
    sizes = {name: len(text.splitlines()) for name, text in sources().items()}
    over = {n: s for n, s in sizes.items() if s > MAX_FILE_LINES}
    assert {n: s for n, s in over.items() if s > LONG_FILES.get(n, (MAX_FILE_LINES, ""))[0]} == {}


def test_no_function_is_over_60_lines() -> None:
    long = {}
    for name, text in sources().items():
        for node in ast.walk(parsed(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{name}:{node.name}"] = lines
    assert long == {}


def test_train_imports_no_tool_no_loader_and_no_cli() -> None:
    above = ("octlm.tools", "octlm.generation", "octlm.cli")
    assert wrong_imports("octlm/trainer/", lambda m: m.startswith(above)) == {}


def test_the_tokenizer_imports_only_itself_and_the_base() -> None:
    """`data/` opens tokenizers, so the tokenizer reads no dataset (a manifest's ids are
    `octlm.data.dataset_tokenizer`'s), nor anything else above it."""
    allowed = ("octlm.tokenizer.", *BASE)
    assert wrong_imports("octlm/tokenizer/", lambda m: not m.startswith(allowed)) == {}


def test_only_the_cli_and_the_tools_import_the_tools() -> None:
    bad = {}
    for name, text in sources().items():
        if name.startswith(("octlm/tools/", "octlm/cli/")):
            continue
        wrong = {m for m in imported_modules(parsed(text)) if m.startswith("octlm.tools")}
        if wrong:
            bad[name] = sorted(wrong)
    assert bad == {}


def test_the_rules_catch_what_they_forbid(tmp_path) -> None:
    """The checks above can fail: each is shown a file that breaks its rule."""
    text = "from octlm.x import _y  # noqa: F401\n" + "def f():\n" + "    pass\n" * 61
    tree = ast.parse(text)
    assert "noqa: F401" in text
    assert [a.name for n in imports(tree) for a in n.names] == ["_y"]
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assert fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES
    assert "octlm.tools.plot" in imported_modules(ast.parse("from octlm.tools import plot"))


def test_architecture_doc_quotes_the_loop_body_as_it_is() -> None:
    doc = ARCHITECTURE.read_text()
    quoted = doc.split("```python\n", 1)[1].split("```", 1)[0]
    assert quoted in (PACKAGE / "trainer" / "loop.py").read_text()


def holds_code(tree: ast.Module) -> bool:
    """More than a docstring: a package's `__init__.py` that is only its docstring has no row in
    the map (the docstring is the text above its room's table)."""
    body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    return bool(body)


def mapped_modules() -> set[str]:
    """The modules the map must name, relative to octlm/: every .py file, a package's
    `__init__.py` only when it holds more than its docstring."""
    return {
        name.removeprefix("octlm/")
        for name, text in sources().items()
        if not name.endswith("__init__.py") or holds_code(parsed(text))
    }


def map_rows(doc: str) -> list[str]:
    """The module of each table row of `doc` whose first cell is a backticked `*.py` path."""
    return re.findall(r"^\|\s*`([\w/]+\.py)`\s*\|", doc, flags=re.MULTILINE)


def map_problems(doc: str, modules: set[str]) -> dict[str, list[str]]:
    """What keeps `doc` from being one row per module: modules with no row (missing), rows
    naming no module (stale), modules with more than one row (twice)."""
    rows = map_rows(doc)
    problems = {
        "missing": sorted(modules - set(rows)),
        "stale": sorted(set(rows) - modules),
        "twice": sorted({r for r in rows if rows.count(r) > 1}),
    }
    return {kind: names for kind, names in problems.items() if names}


def test_the_architecture_map_has_one_row_per_module() -> None:
    """docs/architecture.md is the map of the package: a new module gets its row, a moved or
    removed one loses it, in the same commit."""
    assert map_problems(ARCHITECTURE.read_text(), mapped_modules()) == {}


def test_the_map_check_catches_a_missing_a_stale_and_a_doubled_row() -> None:
    doc = (
        "| module | job |\n|---|---|\n"
        "| `cli.py` | the command |\n| `cli.py` | again |\n"
        "| `train/loop.py` | moved |\n| `log.jsonl` | not a module |\n"
        "text naming `api.py` outside a table\n"
    )
    assert map_rows(doc) == ["cli.py", "cli.py", "train/loop.py"]
    assert map_problems(doc, {"cli.py", "api.py"}) == {
        "missing": ["api.py"],
        "stale": ["train/loop.py"],
        "twice": ["cli.py"],
    }
    assert "data/__init__.py" not in mapped_modules()  # only its docstring
    assert {"__init__.py", "__main__.py", "trainer/run.py"} <= mapped_modules()


def test_the_settings_import_no_torch() -> None:
    """`config/` is torch-free: a config is built, checked, fingerprinted and printed (`octlm
    train --print-config`, a sweep's plan, the report's presets) without loading torch."""
    modules = sorted(p.stem for p in (PACKAGE / "config").glob("*.py") if p.stem != "__init__")
    code = "import sys; " + "; ".join(f"import octlm.config.{m}" for m in modules)
    code += "; from octlm.config.train import TrainConfig; TrainConfig().fingerprint_for(1)"
    code += "; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert len(modules) >= 8 and result.stdout.strip() == "False"


def test_the_data_commands_start_without_torch() -> None:
    """`octlm prepare`, `octlm tokenizer` and their encoding workers never import torch (1.5 s
    of start-up each on a 2-core machine); the training side does."""
    code = "import sys, octlm.cli.main, octlm.cli.data, octlm.prepare.pool, octlm.prepare.pairs"
    code += ", octlm.prepare.text"
    code += "; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


@functools.cache
def module_graph() -> dict[str, set[str]]:
    """Each package module -> the package modules it imports (lazy and type-only included);
    built once per session (the floor table asks it for every pair of units). Read-only."""
    names = {n.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for n in sources()}
    graph: dict[str, set[str]] = {}
    for name, text in sources().items():
        module = name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        graph[module] = {m for m in imported_modules(parsed(text)) if m in names} - {module}
    return graph


def test_no_module_imports_itself_in_a_circle() -> None:
    """A circle, even a lazy or type-only one, means two modules share one concept."""
    graph, cycles = module_graph(), []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in seen:
                seen.add(nxt)
                visit(nxt, [*path, nxt])

    seen: set[str] = set()
    for start in sorted(graph):
        if start not in seen:
            seen.add(start)
            visit(start, [start])
    assert cycles == []


# The flat top of octlm/: what every stage needs. A new module goes into the room of the stage it
# serves (docs/architecture.md, "Where a new module goes"); one that truly serves every stage is
# added here, in the same commit as its row in the map. The run log left the flat top when it
# reached 400 lines: split by concept into the room `runlog/` (writer, reader), not a new module.
TOP_LEVEL = frozenset(
    {"__init__", "__main__", "api", "device", "errors", "extras", "fsutil", "hashing"}
    | {"numerics"}
)


def test_the_flat_top_holds_only_what_every_stage_needs() -> None:
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == TOP_LEVEL


def api_names() -> set[str]:
    """The names `import octlm` resolves (`_PUBLIC` in octlm/__init__.py), read from its source."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_PUBLIC":
            return {key.value for key in node.value.keys}  # type: ignore[attr-defined]
    raise AssertionError("octlm/__init__.py has no _PUBLIC")


def test_no_package_or_module_is_named_like_an_api_name() -> None:
    """`octlm.chat` is the API's function: a module `octlm/chat.py` (or a package `chat/`) would
    be shadowed by it once any API name resolves, or shadow it before."""
    assert {"train", "load", "generate", "chat", "TrainConfig"} <= api_names()
    clashes = {
        name for name in sources() if set(Path(name).with_suffix("").parts[1:2]) & api_names()
    }
    assert clashes == set()


def unit_of(module: str) -> str:
    """A module's unit in the floor table: its room (`trainer/`), or itself at the flat top
    (`octlm` itself is `__init__`)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return f"{parts[1]}/" if (PACKAGE / parts[1]).is_dir() else parts[1]


def unit_graph() -> dict[str, set[str]]:
    """Each unit -> the units it imports (lazy and type-only imports included)."""
    graph: dict[str, set[str]] = {}
    for module, imported in module_graph().items():
        unit = unit_of(module)
        graph.setdefault(unit, set()).update({unit_of(m) for m in imported} - {unit})
    return graph


def imports_between(unit: str, other: str) -> list[str]:
    """The package's module imports that make `unit` import `other`."""
    return [
        f"{module} imports {imported}"
        for module, deps in sorted(module_graph().items())
        for imported in sorted(deps)
        if unit_of(module) == unit and unit_of(imported) == other
    ]


Why = Callable[[str, str], list[str]]


def circle_problem(circle: list[str], why: Why) -> str:
    """The failure message for an import circle (its first unit repeated at the end)."""
    lines = [
        "import circle " + " -> ".join(f"`{u}`" for u in circle) + ": it has no floors, and "
        "no unit may import a floor at or above its own (docs/architecture.md, 'Which way the "
        "imports go'); move what they share down into one of them"
    ]
    for unit, other in zip(circle, circle[1:], strict=False):
        lines += [f"  {unit} -> {other}: {line}" for line in why(unit, other)]
    return "\n".join(lines)


def floors_of(graph: dict[str, set[str]], why: Why = lambda a, b: []) -> dict[str, int]:
    """Each unit's floor: one above the highest floor it imports, 0 when it imports no other
    unit. A circle has none: an AssertionError names it in order, each edge with `why`."""
    floors: dict[str, int] = {}
    path: list[str] = []  # the units being computed, each importing the next

    def floor(unit: str) -> int:
        if unit in path:
            raise AssertionError(circle_problem([*path[path.index(unit) :], unit], why))
        if unit not in floors:
            path.append(unit)
            floors[unit] = 1 + max((floor(d) for d in sorted(graph[unit])), default=-1)
            path.pop()
        return floors[unit]

    for unit in sorted(graph):
        floor(unit)
    return floors


def floor_rows(
    graph: dict[str, set[str]], why: Why = lambda a, b: []
) -> list[tuple[int, list[str], list[str]]]:
    """(floor, its units, what they import) for each floor (`floors_of`)."""
    floors = floors_of(graph, why)
    rows = []
    for n in sorted(set(floors.values()), reverse=True):
        units = sorted(u for u in floors if floors[u] == n)
        rows.append((n, units, sorted(set().union(*(graph[u] for u in units)))))
    return rows


def render_floor(row: tuple[int, list[str], list[str]]) -> str:
    n, units, deps = row
    names = ", ".join(f"`{u}`" for u in units)
    return f"| {n} | {names} | {', '.join(f'`{d}`' for d in deps) or 'nothing of octlm'} |"


def doc_floor_rows(doc: str) -> list[str]:
    """The floor table's rows: table rows whose first cell is a number."""
    return [line.strip() for line in doc.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]


def test_the_floor_table_is_the_one_the_imports_give() -> None:
    """docs/architecture.md's floors are computed, not remembered: each unit's floor and what
    each floor imports. On failure the message is the table to paste."""
    expected = [render_floor(row) for row in floor_rows(unit_graph(), imports_between)]
    assert doc_floor_rows(ARCHITECTURE.read_text()) == expected, "\n" + "\n".join(expected)


def test_the_floor_check_catches_a_wrong_floor_and_a_missing_import() -> None:
    graph = {"a": set(), "b": {"a"}, "c": {"a", "b"}}
    rows = [render_floor(row) for row in floor_rows(graph)]
    assert rows == ["| 2 | `c` | `a`, `b` |", "| 1 | `b` | `a` |", "| 0 | `a` | nothing of octlm |"]
    doc = "| 2 | `c` | `b` |\n| 1 | `b` | `a` |\n| 0 | `a` | nothing of octlm |\n| x | y |"
    assert doc_floor_rows(doc) != rows  # c's import of a is missing from the doc
    assert floors_of({**graph, "d": {"a"}}) == {"a": 0, "b": 1, "c": 2, "d": 1}


def test_the_floor_check_names_an_import_circle() -> None:
    """A circle between units (there may be none between modules) has no floors: the check
    names it, in order, and the rule, where it once overflowed the stack."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    with pytest.raises(AssertionError) as failure:
        floors_of(graph, lambda u, o: [f"octlm.{u}.x imports octlm.{o}.y"])
    message = str(failure.value)
    assert message.startswith("import circle `a` -> `b` -> `c` -> `a`: it has no floors")
    assert "no unit may import a floor at or above its own" in message
    assert "  c -> a: octlm.c.x imports octlm.a.y" in message.splitlines()
    with pytest.raises(AssertionError, match=r"import circle `a/` -> `b` -> `a/`"):
        floor_rows({"a/": {"b"}, "b": {"a/"}})


def flat_config_reads(text: str, keys: list[str]) -> list[str]:
    """`cfg.<key>` reads of a flat TrainConfig key in a module's source (a section's read is
    `cfg.<section>.<key>`)."""
    pattern = r"\bcfg\.(" + "|".join(sorted(keys, key=len, reverse=True)) + r")\b"
    return [m.group(0) for m in re.finditer(pattern, text)]


def test_the_package_reads_settings_by_section() -> None:
    """Inside octlm, a module that handles a TrainConfig reads its sections (`cfg.optim.lr`...
    `cfg.lr_schedule.lr`), so a setting's readers are found by its section; the flat read
    (`cfg.lr`) is the Python API's, for users' code."""
    from octlm.config.train import config_keys

    bad = {
        name: reads
        for name, text in sources().items()
        if "TrainConfig" in text and (reads := flat_config_reads(text, config_keys()))
    }
    assert bad == {}
    assert flat_config_reads("cfg.lr + cfg.lr_schedule.lr", config_keys()) == ["cfg.lr"]
