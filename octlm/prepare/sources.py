"""Documents streamed from files: text (whole, or cut at a separator), JSON lines, Parquet and
Arrow, the text formats also compressed (.gz, .xz, .bz2 from the stdlib; .zst with `zstandard`).

A reader holds one read buffer and one document at a time, so memory does not grow with the
file. A document's id depends only on the file's name below its input and its place in the file
(or a record's own `id`), never on listing order or worker count: the split and the dataset
fingerprint follow from the ids.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import BinaryIO

from octlm.errors import DataError
from octlm.extras import require
from octlm.prepare.compressed import COMPRESSIONS, codec_errors_named, open_decompressed
from octlm.prepare.tables import ARROW, PARQUET, read_rows

TEXT, JSONL = "text", "jsonl"
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TABLE_SUFFIXES = {".parquet": PARQUET, ".arrow": ARROW, ".feather": ARROW}
MAX_DOCUMENT_CHARS = 1 << 26
"""64 Mi characters: the longest document a reader will hold (a bound on memory per document)."""
_READ_BYTES = 1 << 20
EMBEDDED_NAME = "shakespeare.jsonl.xz"


@dataclass(frozen=True, slots=True)
class Document:
    id: str
    text: str


@dataclass(frozen=True, slots=True)
class ReadOptions:
    text_field: str = "text"
    """JSONL field / Parquet or Arrow column holding the text."""
    split_on: str | None = None
    """Cut text files into documents at this separator (e.g. `<|endoftext|>`)."""


@dataclass(frozen=True, slots=True)
class Source:
    path: Path
    name: str
    """The id base: the file's name, or folder/sub/file for a file found in a folder."""
    kind: str
    compression: str | None
    size: int
    """Bytes on disk: what the progress bars count."""


def embedded_source() -> Source:
    path = Path(str(resources.files("octlm").joinpath("assets").joinpath(EMBEDDED_NAME)))
    return Source(path, EMBEDDED_NAME, JSONL, "xz", path.stat().st_size)


def classify(path: Path, name: str) -> Source:
    """The reader a file gets, from its suffixes (`a.jsonl.gz` is gzip-compressed JSON lines)."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    inner = suffixes[-2] if compression and len(suffixes) > 1 else (suffixes or [""])[-1]
    if compression and not suffixes[:-1]:
        inner = ""
    if inner in TABLE_SUFFIXES:
        if compression:
            raise DataError(
                f"{path} is a compressed {inner} file",
                f"decompress it: {inner[1:]} files compress their columns themselves",
            )
        kind = TABLE_SUFFIXES[inner]
    else:
        kind = JSONL if inner in JSONL_SUFFIXES else TEXT
    return Source(path, name, kind, compression, path.stat().st_size)


def find_sources(inputs: Sequence[str | Path]) -> list[Source]:
    """Every input file in order; a folder's files recursively, sorted, hidden ones skipped.
    No inputs means the embedded corpus."""
    if not inputs:
        return [embedded_source()]
    sources: list[Source] = []
    for raw in inputs:
        path = Path(raw)
        if not path.exists():
            raise DataError(f"input not found: {path}", "check the path")
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p, path))
            if not files:
                raise DataError(f"folder {path} holds no files", "put text or JSONL files in it")
            sources += [classify(f, str(f.relative_to(path.parent))) for f in files]
        else:
            sources.append(classify(path, path.name))
    for src in sources:  # a missing extra is found before any work is done
        if src.kind in (PARQUET, ARROW):
            require("pyarrow", f"reading {src.path}")
        if src.compression == "zstd":
            require("zstandard", f"reading {src.path}")
    return sources


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def read_source(
    src: Source, opts: ReadOptions, on_bytes: Callable[[int], None] | None = None
) -> Iterator[Document]:
    """The documents of one file, in file order (empty ones included: the caller counts them).
    `on_bytes(n)` is told of each n bytes of the file consumed."""
    with open(src.path, "rb") as raw:
        progress = _Progress(raw, on_bytes, src.size)
        if src.kind in (PARQUET, ARROW):
            rows = read_rows(src.path, src.kind, opts.text_field, progress.fraction)
            for row, (doc_id, text) in enumerate(rows, start=1):
                yield Document(doc_id or f"{src.name}:{row}", text)
            progress.done()
            return
        with codec_errors_named(src.path, src.compression):
            stream = open_decompressed(raw, src.compression)
            if src.kind == JSONL:
                yield from _read_jsonl(stream, src, opts, progress)
            else:
                yield from _read_text(stream, src, opts, progress)
        progress.done()


class _Progress:
    """Tells `on_bytes` how far into the (compressed) file the reader is."""

    def __init__(self, raw: BinaryIO, on_bytes: Callable[[int], None] | None, size: int) -> None:
        self.raw, self.on_bytes, self.size, self.told = raw, on_bytes, size, 0

    def fraction(self, done: float) -> None:
        """For readers that know only how much of the file they have read."""
        if self.on_bytes is not None:
            pos = int(self.size * done)
            if pos > self.told:
                self.on_bytes(pos - self.told)
                self.told = pos

    def tick(self) -> None:
        if self.on_bytes is not None:
            pos = self.raw.tell()
            if pos > self.told:
                self.on_bytes(pos - self.told)
                self.told = pos

    def done(self) -> None:
        if self.on_bytes is not None and self.size > self.told:
            self.on_bytes(self.size - self.told)
            self.told = self.size


def _decode_error(src: Source, exc: UnicodeDecodeError, offset: int) -> DataError:
    where = " of its uncompressed text" if src.compression else ""
    return DataError(
        f"{src.path} is not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {offset}{where})",
        "convert it to UTF-8, e.g. `iconv -f latin1 -t utf-8`",
    )


def _text_chunks(stream: BinaryIO, src: Source, progress: _Progress) -> Iterator[str]:
    """The file as str chunks, decoded incrementally: an error names its byte offset."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    fed = 0
    while True:
        data = stream.read(_READ_BYTES)
        held = len(decoder.getstate()[0])  # bytes of a character cut by the last chunk
        try:
            text = decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise _decode_error(src, exc, fed - held + exc.start) from None
        fed += len(data)
        progress.tick()
        if text:
            yield text
        if not data:
            return


def _read_text(
    stream: BinaryIO, src: Source, opts: ReadOptions, progress: _Progress
) -> Iterator[Document]:
    sep = opts.split_on
    if not sep:
        parts: list[str] = []
        size = 0
        for text in _text_chunks(stream, src, progress):
            parts.append(text)
            size += len(text)
            if size > MAX_DOCUMENT_CHARS:
                raise DataError(
                    f"{src.path} is one document of more than {MAX_DOCUMENT_CHARS:,} characters",
                    "cut it into documents with --split-on SEPARATOR (e.g. '<|endoftext|>')",
                )
        yield Document(src.name, "".join(parts))
        return
    yield from _split_text(_text_chunks(stream, src, progress), src, sep)


def _split_text(chunks: Iterable[str], src: Source, sep: str) -> Iterator[Document]:
    """Documents between separators, numbered from 1 (`name:1`, `name:2`, ...)."""
    buf, index, found = "", 0, False
    for text in chunks:
        # Search only where a separator could start: the part of `buf` already searched holds
        # none, except perhaps one cut by the chunk boundary (its last len(sep) - 1 chars).
        start = max(0, len(buf) - len(sep) + 1)
        buf += text
        pos = 0
        while (hit := buf.find(sep, start)) >= 0:
            index += 1
            found = True
            yield Document(f"{src.name}:{index}", buf[pos:hit])
            pos = start = hit + len(sep)
        buf = buf[pos:]
        if len(buf) > MAX_DOCUMENT_CHARS:
            if not found:
                raise DataError(
                    f"the separator {sep!r} does not occur in the first "
                    f"{MAX_DOCUMENT_CHARS:,} characters of {src.path}: it would be one document",
                    "check --split-on (the exact separator between documents in this file)",
                )
            raise DataError(
                f"document {index + 1} of {src.path} is longer than {MAX_DOCUMENT_CHARS:,} "
                f"characters (no {sep!r} after it)",
                "check --split-on, or cut that document",
            )
    yield Document(f"{src.name}:{index + 1}", buf)


def json_objects(src: Source, fmt: str, example: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a JSON-lines file (compressed or not),
    for `--format fmt`, whose lines look like `example`. A file that is not JSON lines, or a
    line that is not UTF-8, not JSON or not an object, is a one-line error naming it."""
    if src.kind != JSONL:
        raise DataError(
            f"{src.path} holds neither JSON lines nor a table: --format {fmt} reads "
            ".jsonl/.json/.ndjson files (also .gz/.xz/.bz2/.zst) and .parquet/.arrow files",
            f"write one {example} object per line",
        )
    with open(src.path, "rb") as raw, codec_errors_named(src.path, src.compression):
        stream = open_decompressed(raw, src.compression)
        for lineno, line in enumerate(stream, start=1):
            where = f"{src.path}:{lineno}"
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{where} is not UTF-8", "re-encode the file as UTF-8") from None
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where} is not valid JSON ({exc.msg})", "fix that line") from None
            if not isinstance(record, dict):
                raise DataError(f"{where} is not a JSON object", "write one object per line")
            yield lineno, record


def _read_jsonl(
    stream: BinaryIO, src: Source, opts: ReadOptions, progress: _Progress
) -> Iterator[Document]:
    field, offset = opts.text_field, 0
    for lineno, line in enumerate(stream, start=1):
        start, offset = offset, offset + len(line)
        if lineno % 1024 == 0:
            progress.tick()
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _decode_error(src, exc, start + exc.start) from None
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            if lineno == 1 and text.lstrip().startswith("["):
                raise _array_error(src) from None
            raise DataError(
                f"{src.path}:{lineno} is not valid JSON ({exc.msg})", "fix that line"
            ) from None
        if lineno == 1 and isinstance(record, list):
            raise _array_error(src)
        if not isinstance(record, dict) or field not in record:
            raise DataError(
                f"{src.path}:{lineno} has no string field {field!r}",
                "add one to each line, or name the text field with --text-field",
            )
        value = record[field]
        if value is not None and not isinstance(value, str):
            raise DataError(
                f"{src.path}:{lineno} has no string field {field!r} (it holds a "
                f"{type(value).__name__})",
                "name the text field with --text-field",
            )
        doc = Document(str(record.get("id", f"{src.name}:{lineno}")), value or "")
        _check_encodable(doc, src, lineno)
        yield doc


def _array_error(src: Source) -> DataError:
    return DataError(
        f"{src.path} holds a JSON array, not JSON lines",
        f"write one object per line, e.g. `jq -c '.[]' {src.path} > docs.jsonl`",
    )


def _check_encodable(doc: Document, src: Source, lineno: int) -> None:
    for text in (doc.text, doc.id):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # JSON can escape half of a surrogate pair
            raise DataError(
                f"{src.path}:{lineno} holds a lone surrogate \\u{ord(text[exc.start]):04x}, "
                "which is not text",
                "write the character itself, or both halves of its surrogate pair",
            ) from None
