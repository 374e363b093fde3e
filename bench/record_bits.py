"""Record the bits of real training runs, to prove a refactor changed none of them.

For each named setting: a real `python -m octlm train` in a fixed folder, then every logged
loss, gradient norm, learning rate and validation number, the weights hashes, and one step-N
checkpoint read with safetensors directly (a sha256 per tensor, and the metadata without the
wall-clock `elapsed`). `compare` runs the same settings again and lists every difference.

    python -m bench.record_bits record /tmp/bits-before.json
    python -m bench.record_bits compare /tmp/bits-before.json      # exit 1 on any difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open

ROOT = Path(os.environ.get("OCTLM_BITS_DIR", "/tmp/octlm-bits"))
E2E = [
    "--model", "tiny", "--steps", "8", "--warmup", "3", "--lr", "3e-3", "--context", "32",
    "--micro-batch", "2", "--accum", "2", "--val-every", "3", "--val-batches", "2",
    "--ckpt-every", "5", "--dtype", "fp32", "--no-progress",
]  # fmt: skip
SETTINGS = {
    "tiny": (["--config", "tiny", "--no-progress"], "demo", 100),
    "e2e-fp32": (E2E, "e2e", 5),
    "e2e-bf16": (E2E + ["--dtype", "bf16"], "e2e", 5),
    "e2e-accum4-dropout": (E2E + ["--accum", "4", "--dropout", "0.1"], "e2e", 5),
    "e2e-keep-hash": (E2E + ["--hash-every", "2", "--keep-ckpts"], "e2e", 5),
    # The recipe's features on the small run: Muon, BOS packing, QK-norm, the value residual,
    # zero-init outputs, a wsd schedule, z-loss; every optimizer and data-order branch a config
    # section decides.
    "e2e-recipe": (
        [
            "--config",
            "recipe",
            *E2E,
            "--packing",
            "bos",
            "--schedule",
            "wsd",
            "--decay-steps",
            "3",
            "--z-loss",
            "1e-4",
            "--order",
            "epoch",
        ],
        "e2e",
        5,
    ),
}


def octlm(*args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OCTLM_CACHE": str(ROOT / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "octlm", *args], capture_output=True, text=True, env=env
    )
    if proc.returncode:
        raise SystemExit(f"octlm {' '.join(args)} failed:\n{proc.stderr[-2000:]}")


def datasets() -> dict[str, Path]:
    demo, e2e = ROOT / "data-demo", ROOT / "data-e2e"
    if not (demo / "manifest.json").is_file():
        octlm("prepare", "--out", str(demo), "--vocab-size", "4096", "--force")
    if not (e2e / "manifest.json").is_file():
        from octlm.prepare.corpus import embedded_documents

        docs = sorted(embedded_documents(), key=lambda d: d.id)[:12]
        src = ROOT / "e2e-docs.jsonl"
        src.write_text("".join(json.dumps({"id": d.id, "text": d.text}) + "\n" for d in docs))
        octlm("prepare", str(src), "--out", str(e2e), "--vocab-size", "512", "--context", "64",
              "--shard-tokens", "200000", "--force")  # fmt: skip
    return {"demo": demo, "e2e": e2e}


def checkpoint_bits(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["octlm"])
        tensors = {}
        for name in sorted(f.keys()):  # noqa: SIM118
            t = f.get_tensor(name).contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
            tensors[name] = [str(t.dtype), list(t.shape), hashlib.sha256(raw).hexdigest()]
    meta.get("train_state", {}).pop("elapsed", None)
    return {"meta": meta, "tensors": tensors}


def record_one(name: str, data: dict[str, Path]) -> dict:
    args, which, step = SETTINGS[name]
    out = ROOT / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    octlm("train", *args, "--data", str(data[which]), "--out", str(out), "--keep-last", "100")
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    keep = ("loss", "grad_norm", "lr", "tokens", "val_loss", "val_ppl", "val_bpb", "val_tokens",
            "noise_scale", "weights_sha256", "skipped")  # fmt: skip
    log = [{k: r[k] for k in ("type", "step", *keep) if k in r} for r in records[1:]]
    snap = out / "snapshots" / f"step_{step:06d}.safetensors"
    return {
        "log": log,
        "checkpoint": checkpoint_bits(out / "checkpoints" / f"step_{step:06d}.safetensors"),
        "snapshot": checkpoint_bits(snap) if snap.is_file() else None,
    }


def diff(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}/{k}: only in {'after' if k not in a else 'before'}")
            else:
                out += diff(a[k], b[k], f"{where}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in diff(x, y, f"{where}[{i}]")
        ]
    return [] if a == b else [f"{where}: {str(a)[:80]} != {str(b)[:80]}"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("record", "compare"))
    ap.add_argument("path", type=Path, help="the bits file: written by record, read by compare")
    ap.add_argument(
        "names", nargs="*", metavar="SETTING", help=f"settings (default all: {', '.join(SETTINGS)})"
    )
    return ap


def main() -> int:
    args = build_parser().parse_args()
    mode, path = args.mode, args.path
    unknown = sorted(set(args.names) - set(SETTINGS))
    if unknown:  # a typo would otherwise fail after minutes of training, with a KeyError
        raise SystemExit(f"unknown setting(s) {unknown}: choose from {', '.join(SETTINGS)}")
    names = args.names or list(SETTINGS)
    data = datasets()
    bits = {name: record_one(name, data) for name in names}
    if mode == "record":
        path.write_text(json.dumps(bits, indent=1))
        print(f"recorded {', '.join(names)} in {path}")
        return 0
    before = json.loads(path.read_text())
    problems = [d for name in names for d in diff(before[name], bits[name], name)]
    for p in problems:
        print(p)
    print("identical" if not problems else f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
