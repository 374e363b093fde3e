"""Shared session fixtures: the embedded corpus, a small tokenizer and a small prepared dataset.

All three are built once per test session and must be treated as read-only by tests.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

# One intra-op thread for the tests and every subprocess they start: the models here are tiny,
# and on a shared 2-core machine a second OpenMP thread waiting on a busy core makes small
# matmuls ~50x slower. Set before torch is imported anywhere.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
# Tests never read or write the user's cache (the embedded corpus, `octlm bench peak`'s
# measurement, which would otherwise put an MFU into every CPU run's log).
os.environ["OCTLM_CACHE"] = tempfile.mkdtemp(prefix="octlm-test-cache-")

import pytest

from octlm.data.corpus import Document, embedded_documents
from octlm.data.prepare import PrepareConfig, prepare
from octlm.tokenizer import Tokenizer

atexit.register(shutil.rmtree, os.environ["OCTLM_CACHE"], True)

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
    docs = sorted(corpus_docs, key=lambda d: d.id)[:6]
    path = tmp_path_factory.mktemp("tiny_tokenizer") / "tokenizer.json"
    Tokenizer.train([d.text for d in docs], TINY_VOCAB).save(path)
    return Tokenizer.load(path)


@pytest.fixture(scope="session")
def tiny_dataset(corpus_docs, tmp_path_factory) -> Path:
    """A prepared dataset folder from the first 12 works (by id): vocab 512, context 64, train in
    several 200,000-token shards. Read-only: copy it before changing anything."""
    root = tmp_path_factory.mktemp("tiny_dataset")
    source = root / "docs.jsonl"
    docs = sorted(corpus_docs, key=lambda d: d.id)[:12]
    source.write_text(
        "".join(json.dumps({"id": d.id, "text": d.text}) + "\n" for d in docs), encoding="utf-8"
    )
    out = root / "data"
    prepare(
        PrepareConfig(
            out=out,
            inputs=(str(source),),
            vocab_size=TINY_VOCAB,
            context=TINY_CONTEXT,
            shard_tokens=TINY_SHARD_TOKENS,
        ),
        progress=False,
    )
    return out


@pytest.fixture(scope="session")
def two_process_run(tiny_dataset, tmp_path_factory) -> Path:
    """The multi-process modules' reference: `dist_args` on 2 DDP processes, accumulation 1,
    straight through (one launcher). Read-only."""
    from tests.e2e.helpers import dist_args, octlm

    out = tmp_path_factory.mktemp("two-process") / "run"
    octlm(*dist_args(tiny_dataset, out, "--accum", "1", "--nproc", "2"))
    return out
