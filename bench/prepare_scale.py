"""Does `octlm prepare` scale? Memory against corpus size, workers against one, each input
format against reading the same bytes, and (with --big) a 1 GB corpus end to end.

    .venv/bin/python -m bench.prepare_scale [--scale 1] [--rounds 3] [--part all] [--big]

Every measurement is an `octlm prepare` subprocess (`python -m octlm prepare ...`), so its
memory is its own. Peak RSS is read from the summary line prepare prints ("peak RSS N MB
(main), M MB (largest worker)"): it separates the main process from its workers and belongs to
that one run. The bench's own getrusage(RUSAGE_CHILDREN) cannot: it is a running maximum over
every child reaped so far, so a 1x run after the 4x run would read the 4x figure. Each run is
also reaped with os.wait4, whose rusage is that run's maximum over the process and its workers
as the kernel counted it, a cross-check on the summary ("tree" below).

Corpora are cut deterministically from the embedded Shakespeare (seeded RNG, documents of 1-3 KB
starting at a line, TinyStories-shaped, joined by `<|endoftext|>` in one .txt; the 1x file is a
prefix of the 4x one) and kept in a cache folder under the system temp dir, with the tokenizer
(trained once on a sample, then passed with --tokenizer so the memory measured is the
streaming, not HF's trainer). Parts:

- rss: peak RSS at 1x and 4x (150 and 600 MB x --scale), target 4x / 1x <= 1.2; and one 1x run
  that trains its tokenizer (default sample settings).
- workers: wall time with 1 worker against 2 (and 1..N when more cores are available) on
  64 MB x --scale, target >= 1.6x on 2 cores; counts interleaved, order reversed every round,
  speed-ups are medians of same-round pairs.
- formats: per format (.txt with --split-on, .jsonl, .jsonl.gz/.zst/.xz/.bz2, .parquet) of the
  same 32 MB x --scale of documents, the read alone (`documents(find_sources([path]))` iterated
  to the end, in this process) against `open(stories.txt, "rb").read()` of the uncompressed
  text just before it, and the whole prepare; all from the page cache, formats interleaved.
- big (only with --big): 1 GB x --scale end to end with default settings and --vocab-size.

MB/s counts bytes of document text (the same in every format), not bytes on disk. Each part
prints its table as it finishes; the end repeats every table as markdown for
docs/performance.md. The numbers are only worth quoting from a machine nothing else is using.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import tokenizers

from octlm.prepare.corpus import embedded_documents
from octlm.prepare.scan import documents
from octlm.prepare.sources import ReadOptions, find_sources
from octlm.prepare.workers import default_workers

SEP = "<|endoftext|>"
GENERATOR = "v1"  # bump when the corpus generator changes: cached files are named after it
FORMATS = ("txt", "jsonl", "jsonl.gz", "jsonl.zst", "jsonl.xz", "jsonl.bz2", "parquet")
SIZES_MB = {"1x": 150, "4x": 600, "workers": 64, "formats": 32, "big": 1000}
RSS_TARGET, WORKERS_TARGET = 1.2, 1.6
_RSS = re.compile(r"peak RSS ([\d,]+) MB \(main\), ([\d,]+) MB \(largest worker\)")
_PHASES = re.compile(r"(scan|tokenizer|encode) ([\d.]+) s")
_SPLIT = re.compile(r"^\s+(train|val)\s+([\d,]+) documents\s+([\d,]+) tokens", re.M)


def cache() -> Path:
    path = Path(tempfile.gettempdir()) / "octlm-bench-prepare-scale"
    path.mkdir(exist_ok=True)
    return path


def _num(text: str) -> int:
    return int(text.replace(",", ""))


@dataclass
class Run:
    """One `octlm prepare` subprocess, as measured."""

    wall: float
    main_mb: float
    worker_mb: float
    tree_mb: float
    phases: dict[str, float] = field(default_factory=dict)
    documents: int = 0
    tokens: int = 0

    @property
    def own(self) -> float:
        """Seconds prepare counted itself (its phases): the wall time less start-up."""
        return sum(self.phases.values())

    def brief(self) -> str:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in self.phases.items())
        return (
            f"{self.wall:.2f} s ({phases}); {self.documents:,} documents, {self.tokens:,} tokens; "
            f"RSS {self.main_mb:,.0f} MB main, {self.worker_mb:,.0f} MB worker, "
            f"{self.tree_mb:,.0f} MB tree"
        )


def parse_summary(out: str, wall: float, tree_mb: float) -> Run:
    rss = _RSS.search(out)
    if rss is None:
        raise SystemExit(f"no peak RSS line in prepare's summary:\n{out}")
    splits = _SPLIT.findall(out)
    return Run(
        wall=wall,
        main_mb=_num(rss.group(1)),
        worker_mb=_num(rss.group(2)),
        tree_mb=tree_mb,
        phases={name: float(s) for name, s in _PHASES.findall(out)},
        documents=sum(_num(d) for _, d, _ in splits),
        tokens=sum(_num(t) for _, _, t in splits),
    )


def prepare(inputs: list[Path], *flags: str) -> Run:
    """Run `octlm prepare` into a fresh temporary folder (removed after) and measure it."""
    tmp = Path(tempfile.mkdtemp(prefix="prepare-scale-", dir=cache()))
    cmd = [sys.executable, "-m", "octlm", "prepare", *map(str, inputs), "--out", str(tmp / "d")]
    try:
        with open(tmp / "out", "w+") as out, open(tmp / "err", "w+") as err:
            t0 = time.perf_counter()
            proc = subprocess.Popen([*cmd, *flags], stdout=out, stderr=err)
            # os.wait4, not proc.wait(): its rusage is this run's own (see the docstring).
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
            proc.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0), err.seek(0)
            text, errors = out.read(), err.read()
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} {' '.join(flags)} failed:\n{errors[-3000:]}")
        return parse_summary(text, wall, usage.ru_maxrss / 1024)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _atomic(path: Path, write) -> Path:
    """Build `path` under a temporary name and rename it: an interrupted bench leaves no
    half-written file in the cache."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        write(tmp)
        os.replace(tmp, path)
    return path


def stories(mb: float) -> Path:
    """About `mb` MB of TinyStories-shaped text: documents of 1,000-3,000 characters cut at a
    line start from a random work (seed 0), joined by SEP. Same RNG sequence at every size, so
    a smaller file is a prefix of a bigger one."""
    target = int(mb * 1e6)

    def write(tmp: Path) -> None:
        texts = [d.text for d in embedded_documents()]
        rng, size = random.Random(0), 0
        with open(tmp, "w", encoding="utf-8") as f:
            while size < target:
                text = rng.choice(texts)
                n = rng.randint(1000, 3000)
                start = text.rfind("\n", 0, rng.randrange(max(1, len(text) - n))) + 1
                doc = text[start : start + n]
                f.write(doc if size == 0 else SEP + doc)
                size += len(doc) + (len(SEP) if size else 0)  # the works are ASCII

    return _atomic(cache() / f"stories-{GENERATOR}-{target}.txt", write)


def format_files(mb: float) -> tuple[dict[str, Path], int]:
    """The same documents in every format, and their text bytes. Compression at each tool's
    default level (gzip 6, as the gzip command; xz 6; bzip2 9; zstd 3)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    source = stories(mb)
    docs = source.read_text(encoding="utf-8").split(SEP)
    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode("utf-8")
    compress = {
        "jsonl": lambda b: b,
        "jsonl.gz": lambda b: gzip.compress(b, 6, mtime=0),  # mtime 0: the same bytes each time
        "jsonl.xz": lzma.compress,
        "jsonl.bz2": bz2.compress,
        "jsonl.zst": lambda b: zstandard.compress(b, 3),
    }
    folder = cache() / f"formats-{source.stem}"
    folder.mkdir(exist_ok=True)
    files = {"txt": _atomic(folder / "stories.txt", lambda t: shutil.copyfile(source, t))}
    for fmt, fn in compress.items():
        files[fmt] = _atomic(folder / f"owt.{fmt}", lambda t, f=fn: t.write_bytes(f(lines)))
    table = pa.table({"id": [f"doc-{i}" for i in range(len(docs))], "text": docs})
    files["parquet"] = _atomic(folder / "fineweb.parquet", lambda t: pq.write_table(table, t))
    return files, sum(len(d.encode("utf-8")) for d in docs)


def tokenizer(args: argparse.Namespace) -> Path:
    """The tokenizer every --tokenizer run uses: trained once on the first 20 MB x --scale
    (at least 2 MB) of the 1x corpus, by `octlm tokenizer train`."""
    source = stories(SIZES_MB["1x"] * args.scale)
    chars = max(2_000_000, int(20e6 * args.scale))
    path = cache() / f"tok-{source.stem}-v{args.vocab_size}-{chars}.json"
    if not path.exists():
        cmd = [sys.executable, "-m", "octlm", "tokenizer", "train", str(source), "--split-on"]
        cmd += [SEP, "--max-chars", str(chars), "--vocab-size", str(args.vocab_size)]
        subprocess.run([*cmd, "--out", str(path)], check=True, stdout=subprocess.DEVNULL)
    return path


def md_table(columns: str, rows: list[list[str]]) -> str:
    """A markdown table; `columns` separated by "|", every column but the first right-aligned."""
    names = columns.split("|")
    lines = [names, ["---"] + ["---:"] * (len(names) - 1), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


RUN_COLUMNS = (
    "corpus|MB|documents|tokens|wall s|phases s|main RSS MB|largest worker RSS MB"
    "|tree max MB (wait4)"
)
WORKER_COLUMNS = (
    "workers|wall s (median)|MB/s|speed-up vs 1 (median paired)|prepare's own s"
    "|its speed-up (median paired)|main RSS MB|worker RSS MB"
)
FORMAT_COLUMNS = (
    "format|file MB|raw read MB/s|read + parse MB/s|read time / raw (median paired)"
    "|prepare MB/s|prepare time / .txt's (median paired)"
)


def _mb(path: Path) -> float:
    return path.stat().st_size / 1e6


def _run_row(label: str, path: Path, run: Run) -> list[str]:
    phases = ", ".join(f"{k} {v:.1f}" for k, v in run.phases.items())
    head = [label, f"{_mb(path):,.0f}", f"{run.documents:,}", f"{run.tokens:,}"]
    sizes = [f"{mb:,.0f}" for mb in (run.main_mb, run.worker_mb, run.tree_mb)]
    return [*head, f"{run.wall:.1f}", phases, *sizes]


def part_rss(args: argparse.Namespace, tok: Path) -> str:
    small, large = stories(SIZES_MB["1x"] * args.scale), stories(SIZES_MB["4x"] * args.scale)
    runs = {}
    for label, path in (("1x", small), ("4x", large)):
        runs[label] = prepare([path], "--split-on", SEP, "--tokenizer", str(tok))
        print(f"rss {label}: {runs[label].brief()}", flush=True)
    trained = prepare([small], "--split-on", SEP, "--vocab-size", str(args.vocab_size))
    print(f"rss 1x, tokenizer trained: {trained.brief()}", flush=True)
    rows = [_run_row(f"{k}, --tokenizer", p, runs[k]) for k, p in (("1x", small), ("4x", large))]
    rows.append(_run_row(f"1x, trains its tokenizer (vocab {args.vocab_size:,})", small, trained))
    main_ratio = runs["4x"].main_mb / runs["1x"].main_mb
    worker_ratio = runs["4x"].worker_mb / max(runs["1x"].worker_mb, 1)
    verdict = "met" if max(main_ratio, worker_ratio) <= RSS_TARGET else "NOT met"
    return (
        f"Peak RSS, workers {default_workers()} (the default):\n\n{md_table(RUN_COLUMNS, rows)}"
        f"\n\n4x / 1x peak RSS: main {main_ratio:.3f}, largest worker {worker_ratio:.3f} "
        f"(target <= {RSS_TARGET}: {verdict})"
    )


def worker_counts(cores: int) -> list[int]:
    """1, 2, 4, ... below the core count, and the core count: the 1-to-N curve."""
    counts, n = {1, 2, cores}, 4
    while n < cores:
        counts.add(n)
        n *= 2
    return sorted(counts)


def part_workers(args: argparse.Namespace, tok: Path) -> str:
    path = stories(SIZES_MB["workers"] * args.scale)
    text_mb = _mb(path)  # ASCII: bytes on disk are bytes of text (and separators)
    counts = worker_counts(default_workers())
    rounds: list[dict[int, Run]] = []
    for r in range(args.rounds):
        runs = {}
        for n in counts if r % 2 == 0 else counts[::-1]:
            flags = ("--split-on", SEP, "--tokenizer", str(tok), "--workers", str(n))
            runs[n] = prepare([path], *flags)
            print(f"workers round {r}, {n}: {runs[n].brief()}", flush=True)
        rounds.append(runs)
    rows = []
    for n in counts:
        wall = median(rd[n].wall for rd in rounds)
        own = median(rd[n].own for rd in rounds)
        rows.append(
            [str(n), f"{wall:.2f}", f"{text_mb / wall:.2f}"]
            + [f"{median(rd[1].wall / rd[n].wall for rd in rounds):.3f}", f"{own:.2f}"]
            + [f"{median(rd[1].own / max(rd[n].own, 1e-9) for rd in rounds):.3f}"]
            + [
                f"{median(getattr(rd[n], k) for rd in rounds):,.0f}"
                for k in ("main_mb", "worker_mb")
            ]
        )
    two = median(rd[1].wall / rd[2].wall for rd in rounds)
    verdict = "met" if two >= WORKERS_TARGET else "NOT met"
    return (
        f"Workers, {text_mb:,.1f} MB, {default_workers()} cores, {args.rounds} rounds:\n\n"
        f"{md_table(WORKER_COLUMNS, rows)}\n\n2 workers / 1: {two:.3f}x "
        f"(target >= {WORKERS_TARGET}: {verdict})"
    )


def read_only(path: Path, fmt: str) -> float:
    """Seconds to read, decompress and parse every document of `path` (nothing encoded)."""
    opts = ReadOptions(split_on=SEP if fmt == "txt" else None)
    t0 = time.perf_counter()
    for _ in documents(find_sources([path]), opts):
        pass
    return time.perf_counter() - t0


def raw_read(path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        f.read()
    return time.perf_counter() - t0


def part_formats(args: argparse.Namespace, tok: Path) -> str:
    files, text_bytes = format_files(SIZES_MB["formats"] * args.scale)
    rounds: list[dict[str, tuple[float, float, Run]]] = []
    for r in range(args.rounds):
        timed = {}
        for fmt in FORMATS if r % 2 == 0 else FORMATS[::-1]:
            raw = raw_read(files["txt"])  # just before the format's read: a same-moment pair
            read = read_only(files[fmt], fmt)
            split = ("--split-on", SEP) if fmt == "txt" else ()
            run = prepare([files[fmt]], *split, "--tokenizer", str(tok))
            timed[fmt] = (raw, read, run)
            print(f"formats round {r}, {fmt}: raw {raw:.4f} s, read {read:.3f} s, {run.brief()}")
        rounds.append(timed)
    mb, rows = text_bytes / 1e6, []
    for fmt in FORMATS:
        raw, read = (median(rd[fmt][i] for rd in rounds) for i in (0, 1))
        wall = median(rd[fmt][2].wall for rd in rounds)
        rows.append(
            [f".{fmt}", f"{_mb(files[fmt]):,.1f}", f"{mb / raw:,.0f}", f"{mb / read:,.1f}"]
            + [f"{median(rd[fmt][1] / rd[fmt][0] for rd in rounds):,.1f}", f"{mb / wall:.2f}"]
            + [f"{median(rd[fmt][2].wall / rd['txt'][2].wall for rd in rounds):.3f}"]
        )
    return (
        f"Formats, {mb:,.1f} MB of text in {rounds[0]['txt'][2].documents:,} documents, "
        f"workers {default_workers()}, {args.rounds} rounds (raw = open(stories.txt).read()):"
        f"\n\n{md_table(FORMAT_COLUMNS, rows)}"
    )


def part_big(args: argparse.Namespace, _tok: Path) -> str:
    """One big file, which trains its own tokenizer (so `_tok`, the parts' shared one, is not
    used; the argument gives every part one signature)."""
    path = stories(SIZES_MB["big"] * args.scale)
    run = prepare([path], "--split-on", SEP, "--vocab-size", str(args.vocab_size))
    print(f"big: {run.brief()}", flush=True)
    rows = [_run_row("one .txt, trains its tokenizer", path, run)]
    return (
        f"One big file end to end, default settings, --vocab-size {args.vocab_size:,}, workers "
        f"{default_workers()} ({_mb(path) / run.wall:.2f} MB/s):\n\n{md_table(RUN_COLUMNS, rows)}"
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every corpus size")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the interleaved timings")
    ap.add_argument("--part", choices=("all", "rss", "workers", "formats"), default="all")
    ap.add_argument("--big", action="store_true", help="also 1 GB x --scale end to end (minutes)")
    ap.add_argument("--vocab-size", type=int, default=32768)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    print(
        f"octlm prepare at scale: scale {args.scale}, {default_workers()} cores, Python "
        f"{platform.python_version()}, tokenizers {tokenizers.__version__}, cache {cache()}",
        flush=True,
    )
    tok = tokenizer(args)
    parts = {"rss": part_rss, "workers": part_workers, "formats": part_formats, "big": part_big}
    tables = []
    for name, part in parts.items():
        if args.big if name == "big" else args.part in ("all", name):  # --big: after the rest
            tables.append(part(args, tok))
            print(f"\n{tables[-1]}\n", flush=True)
    command = " ".join(["python -m bench.prepare_scale", *sys.argv[1:]])
    print(f"\n---- markdown for docs/performance.md ----\n\n```\n{command}\n```\n")
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
