"""The first pass of `prepare`: every document's id key and length, before anything is encoded.

The split has to be known before the tokenizer sees a training document, and it depends on the
whole corpus (a fraction of all documents), so the corpus is read once for ids alone. Files are
scanned in parallel (a worker per file); a key table per file comes back in input order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from octlm.errors import DataError
from octlm.prepare.pool import ordered_map
from octlm.prepare.sources import TEXT, Document, ReadOptions, Source, read_source
from octlm.prepare.split import KeyTable


@dataclass
class Scan:
    keys: KeyTable = field(default_factory=KeyTable)
    empty: int = 0
    """Documents skipped because their text is blank."""
    text_files_cut: int = 0
    """Text files that held the --split-on separator at least once."""


def documents(
    sources: Sequence[Source], opts: ReadOptions, on_bytes: Callable[[int], None] | None = None
) -> Iterator[Document]:
    """Every non-blank document of the corpus, in input order: the order of every pass."""
    for src in sources:
        for doc in read_source(src, opts, on_bytes):
            if doc.text.strip():
                yield doc


def scan_file(task: tuple[Source, ReadOptions]) -> Scan:
    """One file's scan (the task a worker runs)."""
    src, opts = task
    return _scan_here(src, opts, None)


def scan_corpus(
    sources: Sequence[Source],
    opts: ReadOptions,
    *,
    workers: int,
    on_bytes: Callable[[int], None] | None = None,
) -> Scan:
    """Keys of every document; a corpus with blank text only, or a separator never found, is an
    error here, before any work that takes long."""
    total = Scan()
    if workers <= 1 or len(sources) <= 1:  # one reader: a live progress bar
        for src in sources:
            _merge(total, _scan_here(src, opts, on_bytes))
    else:
        tasks = ((src.size, (src, opts)) for src in sources)
        for size, scan in ordered_map(scan_file, tasks, workers=workers):
            _merge(total, scan)
            if on_bytes is not None:
                on_bytes(size)
    if not len(total.keys):
        raise DataError("the corpus is empty: no document holds any text", "add text to the inputs")
    texts = [s for s in sources if s.kind == TEXT]
    if opts.split_on and texts and not total.text_files_cut:
        raise DataError(
            f"the separator {opts.split_on!r} occurs in none of the text inputs",
            "check --split-on (write the exact text between documents)",
        )
    if not opts.split_on and len(total.keys) == 1 and texts:
        raise DataError(
            f"the corpus is one document ({texts[0].path}); a train/validation split needs at "
            "least 2",
            "cut it into documents with --split-on SEPARATOR (e.g. '<|endoftext|>')",
        )
    return total


def _scan_here(src: Source, opts: ReadOptions, on_bytes: Callable[[int], None] | None) -> Scan:
    scan = Scan()
    count = 0
    for doc in read_source(src, opts, on_bytes):
        count += 1
        if doc.text.strip():
            scan.keys.add(doc.id, len(doc.text))
        else:
            scan.empty += 1
    scan.text_files_cut = int(src.kind == TEXT and bool(opts.split_on) and count > 1)
    return scan


def _merge(total: Scan, part: Scan) -> None:
    total.keys.extend(part.keys)
    total.empty += part.empty
    total.text_files_cut += part.text_files_cut


def find_ids(sources: Sequence[Source], opts: ReadOptions, indices: set[int]) -> dict[int, str]:
    """The ids of the documents at these indices (to name them in an error)."""
    found: dict[int, str] = {}
    for i, doc in enumerate(documents(sources, opts)):
        if i in indices:
            found[i] = doc.id
            if len(found) == len(indices):
                break
    return found
