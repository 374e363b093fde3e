"""The code-shape figures of the redesign: the loop body, the largest file and function, imports.

    python -m bench.code_shape [ROOT] [--loop FILE:FUNCTION]

Lines are counted from `ast` spans; "distinct names" are the non-builtin names and attribute
chains (`run.saver.check` counts once) read inside a function body; import pairs are the
distinct (importing module, imported octlm module) pairs over the package's files, lazy
imports inside functions included.
"""

from __future__ import annotations

import argparse
import ast
import builtins
from pathlib import Path


def chain(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def distinct_names(fn: ast.AST) -> set[str]:
    names: set[str] = set()
    inner: set[int] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            c = chain(node)
            if c:
                names.add(c)
                sub = node.value
                while isinstance(sub, ast.Attribute | ast.Name):
                    inner.add(id(sub))
                    sub = getattr(sub, "value", None)
        elif isinstance(node, ast.Name) and id(node) not in inner and node.id not in dir(builtins):
            names.add(node.id)
    return names


def module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("root", nargs="?", default=".")
    p.add_argument("--loop", default="octlm/trainer/loop.py:_loop")
    return p


def main() -> None:
    args = build_parser().parse_args()
    root = Path(args.root)
    files = sorted((root / "octlm").rglob("*.py"))
    sizes, functions, pairs = [], [], set()
    for f in files:
        text = f.read_text()
        tree = ast.parse(text)
        sizes.append((len(text.splitlines()), str(f.relative_to(root))))
        me = module_name(root, f)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.append(
                    (node.end_lineno - node.lineno + 1, f"{f.relative_to(root)}:{node.name}")
                )
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("octlm"):
                pairs.add((me, node.module))
            if isinstance(node, ast.Import):
                pairs.update((me, a.name) for a in node.names if a.name.startswith("octlm"))
    loop_file, loop_fn = args.loop.split(":")
    tree = ast.parse((root / loop_file).read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == loop_fn)
    body = [n for n in fn.body if isinstance(n, ast.While | ast.With | ast.For)]
    loops = [n for n in ast.walk(fn) if isinstance(n, ast.While | ast.For)]
    loop = loops[0] if loops else fn
    print(f"loop function {args.loop}: {fn.end_lineno - fn.lineno + 1} lines, "
          f"{len(distinct_names(fn))} distinct names")  # fmt: skip
    print(f"loop body (the while): {loop.end_lineno - loop.lineno + 1} lines, "
          f"{len(distinct_names(loop))} distinct names")  # fmt: skip
    del body
    sizes.sort(reverse=True)
    functions.sort(reverse=True)
    print(f"package: {len(files)} files, {sum(s for s, _ in sizes)} lines")
    print("largest files: " + ", ".join(f"{n} {s}" for s, n in sizes[:3]))
    print("largest functions: " + ", ".join(f"{n} {s}" for s, n in functions[:3]))
    print(f"functions over 60 lines: {sum(1 for s, _ in functions if s > 60)}")
    print(f"import pairs (module -> octlm module): {len(pairs)}")


if __name__ == "__main__":
    main()
