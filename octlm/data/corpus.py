"""Documents: the embedded Shakespeare corpus, user files, and the train/validation split.

The split is by whole document and depends only on document ids (sha256 of each id), so the
same corpus always splits the same way whatever order its files are listed in.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from octlm.errors import DataError

EMBEDDED_NAME = "shakespeare.jsonl.xz"
# sha256 of the uncompressed JSONL, as printed by scripts/build_corpus.py.
CORPUS_SHA256 = "7d1dc0f402e1e20f6a0a0c90220a18da4ee43eea88e7165e9c6c2ca1cda39be0"
DEFAULT_VAL_FRACTION = 0.1


@dataclass(frozen=True, slots=True)
class Document:
    id: str
    text: str


def embedded_bytes() -> bytes:
    """The uncompressed JSONL of the embedded corpus (42 works of Shakespeare)."""
    blob = resources.files("octlm").joinpath("assets").joinpath(EMBEDDED_NAME).read_bytes()
    return lzma.decompress(blob)


def embedded_documents() -> list[Document]:
    # split on "\n" only: JSON escapes it, but str.splitlines would also cut at U+2028 and friends.
    lines = embedded_bytes().decode("utf-8").split("\n")
    return [Document(d["id"], d["text"]) for d in map(json.loads, filter(None, lines))]


def read_documents(inputs: Sequence[str | Path]) -> list[Document]:
    """Documents from text files, folders of them (recursive), or JSONL with a `text` field.

    A text file is one document; a JSONL line is one document (its `id` field, if any, names it).
    No inputs means the embedded corpus.
    """
    if not inputs:
        return embedded_documents()
    docs: list[Document] = []
    for raw in inputs:
        path = Path(raw)
        if not path.exists():
            raise DataError(f"input not found: {path}", "check the path")
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p, path))
            if not files:
                raise DataError(f"folder {path} holds no files", "put text or JSONL files in it")
            for file in files:
                docs.extend(_read_file(file, name=str(file.relative_to(path.parent))))
        else:
            docs.extend(_read_file(path, name=path.name))
    docs = [d for d in docs if d.text.strip()]
    if not docs:
        raise DataError("the corpus is empty: no document holds any text", "add text to the inputs")
    ids = [d.id for d in docs]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DataError(
            f"two documents share the id {dup!r}",
            "give each JSONL line a unique id, and each input file a unique name",
        )
    return docs


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _decode(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{name} is not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            "convert it to UTF-8, e.g. `iconv -f latin1 -t utf-8`",
        ) from None


def _read_file(path: Path, name: str) -> list[Document]:
    text = _decode(path.read_bytes(), str(path))
    if path.suffix != ".jsonl":
        return [Document(name, text)]
    docs = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{path}:{lineno} is not valid JSON ({exc.msg})", "fix that line"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DataError(f"{path}:{lineno} has no string field 'text'", "add one to each line")
        doc = Document(str(record.get("id", f"{name}:{lineno}")), record["text"])
        for field in (doc.text, doc.id):
            try:
                field.encode("utf-8")
            except UnicodeEncodeError as exc:  # JSON can escape half of a surrogate pair
                raise DataError(
                    f"{path}:{lineno} holds a lone surrogate \\u{ord(field[exc.start]):04x}, "
                    "which is not text",
                    "write the character itself, or both halves of its surrogate pair",
                ) from None
        docs.append(doc)
    return docs


def split_documents(
    docs: Sequence[Document], val_fraction: float = DEFAULT_VAL_FRACTION
) -> tuple[list[Document], list[Document]]:
    """Deterministic split by document: the ids with the smallest sha256 go to validation."""
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"validation fraction {val_fraction} is not in (0, 1)", "use e.g. 0.1")
    if len(docs) < 2:
        raise DataError(
            f"the corpus has {len(docs)} document; a train/validation split needs at least 2",
            "split the text into several files, or use JSONL with one document per line",
        )
    n_val = min(len(docs) - 1, max(1, math.floor(len(docs) * val_fraction + 0.5)))
    ranked = sorted(docs, key=lambda d: hashlib.sha256(d.id.encode("utf-8")).hexdigest())
    val_ids = {d.id for d in ranked[:n_val]}
    # Keep each split in input order so shards read like the corpus.
    return [d for d in docs if d.id not in val_ids], [d for d in docs if d.id in val_ids]
