"""octlm's checksumming safetensors writer against `safetensors.save_file` plus a read-back hash.

    .venv/bin/python -m bench.st_writer [--rounds 7]

A checkpoint file needs its bytes on disk and their checksum (xxh3-128). Two ways to get both:
octlm's `write_safetensors` (octlm/trainer/stwriter.py) hashes each tensor's bytes as it writes
them; `save_file` writes the file (its own Rust writer) and the file is then read back from the
page cache and hashed (`octlm.hashing.file_checksum`). Both write into the same folder, with no
fsync (the rest of the durable protocol, fsync and rename, is the same for either). The
tensors are a model's weights and two AdamW moments per weight, as a checkpoint holds them,
for tiny and the small shape (vocabulary 4096) and the seed's small (vocabulary 32768).
Rounds alternate the order; the ratio is the median of per-round ratios.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from octlm.config.shape import preset
from octlm.hashing import file_checksum
from octlm.model.gpt import GPT
from octlm.trainer.stwriter import write_safetensors

MODELS = {
    "tiny (vocab 4096)": preset("tiny", context=128),
    "small shape (vocab 4096)": preset("small", vocab_size=4096, context=128),
    "small (seed, vocab 32768)": preset("small", context=128),
}


def checkpoint_like(config) -> dict[str, torch.Tensor]:
    """Weights and two moments each: the bulk of a checkpoint, tensor for tensor."""
    torch.manual_seed(0)
    weights = GPT(config).state_dict()
    tensors = {}
    for name, w in weights.items():
        tensors[f"model.{name}"] = w.contiguous()
        tensors[f"optimizer.{name}.exp_avg"] = torch.randn_like(w) * 1e-3
        tensors[f"optimizer.{name}.exp_avg_sq"] = torch.rand_like(w) * 1e-6
    return tensors


def octlm_writer(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    return write_safetensors(path, tensors, {"octlm": "{}"})


def save_file_and_hash(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    save_file(tensors, str(path), metadata={"octlm": "{}"})
    return file_checksum(path)


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    ways = {
        "octlm write_safetensors": octlm_writer,
        "save_file + xxh3 read-back": save_file_and_hash,
    }
    print("| model | MB | octlm writer s | save_file + read-back s | ratio (octlm / save_file) |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        for label, config in MODELS.items():
            tensors = checkpoint_like(config)
            mb = sum(t.numel() * t.element_size() for t in tensors.values()) / 1e6
            times = {name: [] for name in ways}
            for r in range(args.rounds + 1):
                order = list(ways) if r % 2 == 0 else list(ways)[::-1]
                for name in order:
                    path = Path(tmp) / f"{name[:5]}.safetensors"
                    seconds = timed(ways[name], path, tensors)
                    path.unlink()
                    if r:  # round 0 warms the page cache and the allocator
                        times[name].append(seconds)
            a, b = (times[name] for name in ways)
            ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
            print(
                f"| {label} | {mb:.1f} | {statistics.median(a):.3f} | {statistics.median(b):.3f}"
                f" | {ratio:.2f} |"
            )


if __name__ == "__main__":
    main()
