"""Token shards on disk: a 256-byte header, then the tokens; a JSON manifest ties them together.

Header: magic b"OCTLMTOK", format version (u32), bytes per token (u32), token count (u64),
zero padding. Readers memmap the tokens, check sizes against header and manifest, and (on
request) every shard's sha256. The dataset fingerprint is derived from the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from octlm.errors import DataError
from octlm.hashing import file_sha256, sha256_json

MAGIC = b"OCTLMTOK"
SHARD_VERSION = 1
MANIFEST_VERSION = 1
MASKED_MANIFEST_VERSION = 2
"""A dataset with a loss-mask stream (prompt/completion) is written as version 2, so an octlm
that cannot read the mask refuses it instead of training on prompts; plain datasets stay 1."""
HEADER_BYTES = 256
_HEADER = struct.Struct("<8sIIQ")
MANIFEST_NAME = "manifest.json"
TOKENIZER_NAME = "tokenizer.json"
SPLITS = ("train", "val")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (halves disk and memory traffic), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def write_shard(path: Path, tokens: np.ndarray) -> str:
    """Write one shard (fsynced) and return its sha256."""
    with open(path, "wb") as f:
        f.write(_header(tokens.dtype.itemsize, len(tokens)))
        f.write(np.ascontiguousarray(tokens).tobytes())
        f.flush()
        os.fsync(f.fileno())
    return file_sha256(path)


class ShardWriter:
    """One split's token stream cut into shards of at most `limit` tokens, written as the tokens
    arrive: memory holds no more than the array handed to `add`.

    A shard is opened with a header that promises `limit` tokens and hashed as it is written;
    only a split's last, shorter shard has its header rewritten and is hashed again on close.
    """

    def __init__(self, folder: Path, split: str, dtype: np.dtype, limit: int) -> None:
        self.folder, self.split, self.dtype, self.limit = folder, split, dtype, limit
        self.shards: list[dict[str, Any]] = []
        self.tokens = 0
        self._file: Any = None
        self._count = 0
        self._hash: Any = None

    def add(self, tokens: np.ndarray) -> None:
        tokens = np.ascontiguousarray(tokens, dtype=self.dtype)
        self.tokens += len(tokens)
        while len(tokens):
            if self._file is None:
                self.start_shard()
            take = min(self.limit - self._count, len(tokens))
            data = tokens[:take].tobytes()
            self._file.write(data)
            self._hash.update(data)
            self._count += take
            tokens = tokens[take:]
            if self._count == self.limit:
                self.finish_shard()

    def close(self) -> list[dict[str, Any]]:
        """Finish the last shard; the split's manifest entries."""
        if self._file is not None:
            self.finish_shard()
        return self.shards

    def discard(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def start_shard(self) -> None:
        path = self.folder / f"{self.split}_{len(self.shards):06d}.bin"
        self._file = open(path, "wb")  # noqa: SIM115 (closed by finish_shard or discard)
        header = _header(self.dtype.itemsize, self.limit)
        self._file.write(header)
        self._hash = hashlib.sha256(header)
        self._count = 0

    def finish_shard(self) -> None:
        f, count = self._file, self._count
        if count != self.limit:  # the last shard: its header promised too much
            f.seek(0)
            f.write(_header(self.dtype.itemsize, count))
        f.flush()
        os.fsync(f.fileno())
        f.close()
        self._file = None
        path = Path(f.name)
        digest = self._hash.hexdigest() if count == self.limit else file_sha256(path)
        self.shards.append({"file": path.name, "tokens": int(count), "sha256": digest})


def _header(itemsize: int, count: int) -> bytes:
    return _HEADER.pack(MAGIC, SHARD_VERSION, itemsize, count).ljust(HEADER_BYTES, b"\0")


def read_shard(path: Path, itemsizes: tuple[int, ...] = (2, 4)) -> np.ndarray:
    """Memmap one shard's tokens after checking its header against the file size (a loss-mask
    shard has 1-byte entries: `itemsizes=(1,)`)."""
    if not path.is_file():
        raise DataError(f"shard missing: {path}", "re-run `octlm prepare` for this folder")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES:
        raise DataError(f"shard {path} is truncated (no header)", "re-run `octlm prepare`")
    magic, version, itemsize, count = _HEADER.unpack_from(head)
    if magic != MAGIC:
        raise DataError(f"{path} is not an octlm token shard", "re-run `octlm prepare`")
    if version != SHARD_VERSION or itemsize not in itemsizes:
        raise DataError(
            f"shard {path} has format version {version} / {itemsize}-byte tokens, "
            f"this octlm reads version {SHARD_VERSION}",
            "re-run `octlm prepare` with this octlm",
        )
    if size != HEADER_BYTES + count * itemsize:
        raise DataError(
            f"shard {path} is {size} bytes but its header promises {count} tokens",
            "the file is truncated or corrupt; re-run `octlm prepare`",
        )
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[itemsize]
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(count,))


def dataset_fingerprint(manifest: dict[str, Any]) -> str:
    """sha256 over what decides the token streams: tokenizer, dtype, and every shard's hash."""
    core = {
        "manifest_version": manifest["manifest_version"],
        "tokenizer": manifest["tokenizer"]["fingerprint"],
        "dtype": manifest["dtype"],
        "splits": {
            name: [
                (s["file"], s["tokens"], s["sha256"]) for s in manifest["splits"][name]["shards"]
            ]
            for name in SPLITS
        },
    }
    if manifest["manifest_version"] == MASKED_MANIFEST_VERSION:
        core["loss_mask"] = manifest["loss_mask"]["version"]
        core["mask_splits"] = {
            name: [
                (s["file"], s["tokens"], s["sha256"])
                for s in manifest["splits"][name]["mask_shards"]
            ]
            for name in SPLITS
        }
    # A Hugging Face tokenizer's BOS/EOS/PAD ids (dataset_tokenizer.py): covered, so an edit is
    # caught; absent for octlm's own tokens, so those datasets keep their fingerprints.
    if "specials" in manifest["tokenizer"]:
        core["specials"] = manifest["tokenizer"]["specials"]
    return sha256_json(core)


class TokenStream:
    """One split's shards as a single read-only token stream."""

    def __init__(self, shards: list[np.ndarray]) -> None:
        self.shards = shards
        self.offsets = np.cumsum([0] + [len(s) for s in shards])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def window(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start+length) as int64, crossing shard boundaries if needed."""
        if start < 0 or length < 0 or start + length > len(self):
            raise IndexError(f"window {start}+{length} outside a stream of {len(self)} tokens")
        if length == 0:
            return np.empty(0, dtype=np.int64)
        parts, pos, end = [], start, start + length
        i = int(np.searchsorted(self.offsets, start, side="right")) - 1
        while pos < end:
            local = pos - int(self.offsets[i])
            take = min(end - pos, len(self.shards[i]) - local)
            parts.append(np.asarray(self.shards[i][local : local + take], dtype=np.int64))
            pos += take
            i += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


@dataclass(frozen=True)
class ShardDataset:
    """A prepared dataset folder: manifest, tokenizer file and the train/val streams."""

    root: Path
    manifest: dict[str, Any]
    train: TokenStream
    val: TokenStream
    train_mask: TokenStream | None = None
    """The loss-mask streams of a prompt/completion dataset (`octlm.data.packing`), else None."""
    val_mask: TokenStream | None = None

    @property
    def masked(self) -> bool:
        return self.train_mask is not None

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def tokenizer_fingerprint(self) -> str:
        return self.manifest["tokenizer"]["fingerprint"]

    @property
    def tokenizer_path(self) -> Path:
        return self.root / TOKENIZER_NAME

    @classmethod
    def open(
        cls,
        root: str | Path,
        *,
        verify_checksums: bool = False,
        tokenizer_fingerprint: str | None = None,
    ) -> ShardDataset:
        root = Path(root)
        manifest = load_manifest(root)
        if (
            tokenizer_fingerprint is not None
            and tokenizer_fingerprint != manifest["tokenizer"]["fingerprint"]
        ):
            raise DataError(
                f"the shards in {root} were written with tokenizer "
                f"{manifest['tokenizer']['fingerprint'][:12]}, not {tokenizer_fingerprint[:12]}",
                f"use {root / TOKENIZER_NAME}, or re-run `octlm prepare --tokenizer YOURS`",
            )
        streams, masks = {}, {}
        for split in SPLITS:
            entries = manifest["splits"][split]
            streams[split] = _open_stream(root, entries["shards"], (2, 4), verify_checksums)
            if "mask_shards" in entries:
                masks[split] = _open_stream(root, entries["mask_shards"], (1,), verify_checksums)
                if len(masks[split]) != len(streams[split]):
                    raise DataError(
                        f"the {split} loss mask of {root} has {len(masks[split])} entries for "
                        f"{len(streams[split])} tokens",
                        "re-run `octlm prepare`",
                    )
        return cls(
            root, manifest, streams["train"], streams["val"], masks.get("train"), masks.get("val")
        )


def _open_stream(
    root: Path, entries: list[dict[str, Any]], itemsizes: tuple[int, ...], verify: bool
) -> TokenStream:
    shards = []
    for entry in entries:
        path = root / entry["file"]
        tokens = read_shard(path, itemsizes)
        if len(tokens) != entry["tokens"]:
            raise DataError(
                f"shard {path} holds {len(tokens)} tokens, the manifest says {entry['tokens']}",
                "re-run `octlm prepare`",
            )
        if verify and file_sha256(path) != entry["sha256"]:
            raise DataError(f"shard {path} fails its sha256 check", "re-run `octlm prepare`")
        shards.append(tokens)
    return TokenStream(shards)


def load_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise DataError(
            f"{root} is not a prepared dataset (no {MANIFEST_NAME})",
            f"run `octlm prepare --out {root}` first",
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DataError(f"{path} is not valid JSON", "re-run `octlm prepare`") from None
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != "octlm-dataset"
        or manifest.get("manifest_version") not in (MANIFEST_VERSION, MASKED_MANIFEST_VERSION)
    ):
        raise DataError(
            f"{path} is not an octlm dataset manifest of version "
            f"{MANIFEST_VERSION} or {MASKED_MANIFEST_VERSION}",
            "re-run `octlm prepare` with this octlm",
        )
    # Checked here, before any field is used: a field removed or retyped by hand is "edited" too.
    try:
        edited = dataset_fingerprint(manifest) != manifest["fingerprint"]
    except (KeyError, TypeError, ValueError):
        edited = True
    if edited:
        raise DataError(f"{path} was edited", "re-run `octlm prepare`")
    return manifest
