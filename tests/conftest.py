"""Shared session fixtures: the embedded corpus, a small tokenizer and a small prepared dataset.

All three are built once per test session and must be treated as read-only by tests.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

# One intra-op thread for the tests and every subprocess they start: the models here are tiny,
# and on a shared 2-core machine a second OpenMP thread waiting on a busy core makes small
# matmuls ~50x slower. Set before torch is imported anywhere.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
# Bytecode written by a module's first import and read by every later process, as under `make
# test` (the Makefile unexports PYTHONDONTWRITEBYTECODE): where the variable is set (this machine),
# a direct `python -m pytest` had every fresh interpreter (torchrun workers, the fork servers,
# the walkthroughs' `python`, verify-resume's runs) compile torch's and octlm's imports again:
# 8.1 s instead of 3.4 s to import what a training process imports (issue 63).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# Tests never read or write the user's cache (the embedded corpus, `octlm bench peak`'s
# measurement, which would otherwise put an MFU into every CPU run's log).
os.environ["OCTLM_CACHE"] = tempfile.mkdtemp(prefix="octlm-test-cache-")

import pytest

from octlm.prepare.corpus import Document, embedded_documents
from octlm.prepare.text import PrepareConfig, prepare
from octlm.tokenizer.core import Tokenizer
from tests import ordering
from tests.shared import shared

atexit.register(shutil.rmtree, os.environ["OCTLM_CACHE"], True)
sys.dont_write_bytecode = False  # this process too, for the modules it imports from here on

TINY_VOCAB = 512
TINY_CONTEXT = 64
TINY_SHARD_TOKENS = 200_000


@pytest.fixture(scope="session")
def corpus_docs() -> list[Document]:
    """The 42 embedded Shakespeare works, in the embedded file's order."""
    return embedded_documents()


@pytest.fixture(scope="session")
def tiny_tokenizer(corpus_docs, tmp_path_factory) -> Tokenizer:
    """A 512-token BPE trained on the first 6 works (by id), loaded back from its saved file."""

    def build(folder: Path) -> None:
        docs = sorted(corpus_docs, key=lambda d: d.id)[:6]
        Tokenizer.train([d.text for d in docs], TINY_VOCAB).save(folder / "tokenizer.json")

    return Tokenizer.load(shared(tmp_path_factory, "tiny_tokenizer", build) / "tokenizer.json")


@pytest.fixture(scope="session")
def tiny_dataset(corpus_docs, tmp_path_factory) -> Path:
    """A prepared dataset folder from the first 12 works (by id): vocab 512, context 64, train in
    several 200,000-token shards. Read-only: copy it before changing anything."""

    def build(root: Path) -> None:
        source = root / "docs.jsonl"
        docs = sorted(corpus_docs, key=lambda d: d.id)[:12]
        source.write_text(
            "".join(json.dumps({"id": d.id, "text": d.text}) + "\n" for d in docs),
            encoding="utf-8",
        )
        config = PrepareConfig(
            out=root / "data",
            inputs=(str(source),),
            vocab_size=TINY_VOCAB,
            context=TINY_CONTEXT,
            shard_tokens=TINY_SHARD_TOKENS,
        )
        prepare(config, progress=False)

    return shared(tmp_path_factory, "tiny_dataset", build) / "data"


@pytest.fixture(scope="session")
def embedded_4096(tmp_path_factory) -> Path:
    """The embedded corpus prepared at vocabulary 4096, every other setting the default (as
    `octlm prepare --vocab-size 4096` writes it; the encoder's fast path on). Read-only."""

    def build(root: Path) -> None:
        prepare(PrepareConfig(out=root / "data", vocab_size=4096), progress=False)

    return shared(tmp_path_factory, "embedded_4096", build) / "data"


def speeches_dataset(tiny_dataset: Path, works: list[Document], root: Path, limit: int) -> Path:
    """A prepared dataset of speeches (the works cut at blank lines: tens of tokens each, at
    most `limit` of them) encoded with the tiny dataset's tokenizer, at `root`/data."""
    speeches = [p for d in works for p in d.text.split("\n\n") if p.strip()][:limit]
    source = root / "speeches.jsonl"
    lines = (json.dumps({"id": f"s{i}", "text": t}) + "\n" for i, t in enumerate(speeches))
    source.write_text("".join(lines), encoding="utf-8")
    config = PrepareConfig(
        out=root / "data",
        inputs=(str(source),),
        tokenizer=tiny_dataset / "tokenizer.json",
        context=32,
        workers=1,
    )
    prepare(config, progress=False)
    return root / "data"


@pytest.fixture(scope="session")
def speeches(tiny_dataset, corpus_docs, tmp_path_factory) -> Path:
    """Short documents for BOS rows and mixtures: the speeches of the first two works, sharing
    the tiny dataset's tokenizer. Read-only."""
    works = sorted(corpus_docs, key=lambda d: d.id)[:2]
    build = lambda root: speeches_dataset(tiny_dataset, works, root, 10**9)  # noqa: E731
    return shared(tmp_path_factory, "speeches", build) / "data"


@pytest.fixture(scope="session")
def few_speeches(tiny_dataset, corpus_docs, tmp_path_factory) -> Path:
    """6 speeches of another work (a few hundred tokens of training windows): a mixture's
    source whose epochs end within a few steps. Read-only."""
    works = sorted(corpus_docs, key=lambda d: d.id)[2:3]
    build = lambda root: speeches_dataset(tiny_dataset, works, root, 6)  # noqa: E731
    return shared(tmp_path_factory, "few_speeches", build) / "data"


@pytest.fixture(scope="session")
def two_process_run(tiny_dataset, tmp_path_factory) -> Path:
    """The multi-process modules' reference: `dist_args` on 2 DDP processes, accumulation 1,
    straight through (one launcher). Read-only."""
    from tests.e2e.helpers import dist_args, octlm

    def build(folder: Path) -> None:
        octlm(*dist_args(tiny_dataset, folder / "run", "--accum", "1", "--nproc", "2"))

    return shared(tmp_path_factory, "two_process_run", build) / "run"


@pytest.fixture(scope="session")
def straight_run(tiny_dataset, tmp_path_factory):
    """`straight_run(*extra)`: the run folder of `octlm train` with the standard tiny arguments
    (tests/e2e/helpers.py `train_args`) plus `extra`, straight through; trained once per
    session for each distinct `extra`, whichever module or worker asks first. Read-only."""
    from tests.e2e.helpers import octlm, train_args

    def get(*extra: str) -> Path:
        key = "straight" + "".join(f"_{x.lstrip('-')}" for x in extra)

        def build(folder: Path) -> None:
            octlm(*train_args(tiny_dataset, folder / "run", *extra))

        return shared(tmp_path_factory, key, build) / "run"

    return get


WHOLLY_SLOW = re.compile(r"^pytestmark = pytest\.mark\.slow\b", re.M)
"""A module whose every test is slow: its `pytestmark` line, as the slow modules write it."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under `-m "not slow"` (make test-fast) a module marked slow as a whole is not imported:
    every test of it would be deselected, and importing the 56 of them (torch's helpers,
    transformers, wandb, openai, uvicorn... for their skips) cost each worker 2.4 s of its
    collection without a bytecode cache. Any other selection, `make test`'s none included,
    collects them as before."""
    if config.getoption("markexpr") != "not slow" or not collection_path.name.startswith("test_"):
        return None
    if collection_path.suffix == ".py" and WHOLLY_SLOW.search(collection_path.read_text("utf-8")):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of the slowest tests first, dealt out among the xdist workers
    (tests/ordering.py)."""
    items[:] = ordering.longest_first(items, ordering.known_seconds(), ordering.workers())
