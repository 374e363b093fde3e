"""Compressed corpus files, read as one decompressed byte stream: gzip, xz and bzip2 from the
stdlib, zstd with `zstandard` (the `octlm[data]` extra).

A stream that ends early or holds garbage raises one of `CODEC_ERRORS`; `codec_errors_named`
turns it into a one-line error naming the file.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from octlm.errors import DataError
from octlm.extras import require

COMPRESSIONS = {".gz": "gzip", ".xz": "xz", ".bz2": "bz2", ".zst": "zstd"}
CODEC_ERRORS = (EOFError, OSError, lzma.LZMAError, zlib.error)
_READ_BYTES = 1 << 20


def is_codec_error(exc: BaseException) -> bool:
    """A decoding failure, not a failing disk: gzip's BadGzipFile and bz2's "Invalid data
    stream" are OSErrors without an errno."""
    return not isinstance(exc, OSError) or exc.errno is None


@contextmanager
def codec_errors_named(path: Path, compression: str | None) -> Iterator[None]:
    """A truncated or corrupt stream read inside the block becomes a DataError naming `path`."""
    try:
        yield
    except CODEC_ERRORS as exc:
        if not is_codec_error(exc):
            raise
        raise DataError(
            f"{path} is truncated or corrupt ({compression or 'read'}: {exc})",
            "download or compress it again",
        ) from None


def open_decompressed(raw: BinaryIO, compression: str | None) -> BinaryIO:
    if compression is None:
        return raw
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "xz":
        return lzma.LZMAFile(raw)
    if compression == "bz2":
        return bz2.BZ2File(raw)
    return io.BufferedReader(ZstdReader(raw), buffer_size=_READ_BYTES)


class ZstdReader(io.RawIOBase):
    """zstd frames back to back, decoded one at a time; a stream that ends inside a frame is an
    EOFError (zstandard's own stream_reader returns what it has without a word)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.zstd = require("zstandard", "reading .zst files")
        self.obj = self.zstd.ZstdDecompressor().decompressobj()
        self.pending = b""
        self.in_frame = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            data = self.raw.read(_READ_BYTES)
            if not data:
                if self.in_frame:
                    raise EOFError("the stream ends inside a zstd frame")
                return 0
            self.pending = self._decode(data)
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def _decode(self, data: bytes) -> bytes:
        out = []
        while data:
            try:
                out.append(self.obj.decompress(data))
            except self.zstd.ZstdError as exc:
                raise EOFError(f"not a zstd stream ({exc})") from None
            self.in_frame = not self.obj.eof
            data = self.obj.unused_data if self.obj.eof else b""
            if self.obj.eof:
                self.obj = self.zstd.ZstdDecompressor().decompressobj()
        return b"".join(out)
