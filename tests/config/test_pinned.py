"""The settings' bytes, pinned: the resume fingerprint of every shipped config (at 1 and at 4
processes) and of the golden run folder, and the flat config's key order that checkpoints and
log headers record. They were taken before `TrainConfig` became sections; a change to any of
them means run folders users have would no longer resume (or no longer be the same bytes).
Machine-independent values (sha256 over JSON), so literals are right here."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from octlm.config.files import read_toml, shipped_configs
from octlm.config.train import TrainConfig

GOLDEN_LOG = Path(__file__).resolve().parents[1] / "golden" / "v1-micro" / "run" / "log.jsonl"
# name: (fingerprint_for(1), fingerprint_for(4))
SHIPPED = {
    "ablations/accum": (
        "4a917a3c00657cf0b102447c88e53e6684ef68fbe1b01eaa2ae093350a384215",
        "eaa72a34baa55fff288418a160339b36b7a51f58ee437d7bf28360e6f61efaa7",
    ),
    "ablations/clip": (
        "07d0d8d56b64d9df87d2142a6cbd3b6dc5698301952a70541f63e13a8ab0b9ff",
        "37f23efcc58ed4c104baf9f2338bf005c1ee2fa2b82b1295d3a6fc68a20ed017",
    ),
    "ablations/high_lr": (
        "82b7fd2817e70d23505a0f865d00781a2767123fcc24643e158aea0a27054398",
        "7b05f70b272496549497752b32aa9a4ba4524a1c1d222c7b177f4e06a348efa8",
    ),
    "ablations/lr": (
        "07d0d8d56b64d9df87d2142a6cbd3b6dc5698301952a70541f63e13a8ab0b9ff",
        "37f23efcc58ed4c104baf9f2338bf005c1ee2fa2b82b1295d3a6fc68a20ed017",
    ),
    "ablations/warmup": (
        "07d0d8d56b64d9df87d2142a6cbd3b6dc5698301952a70541f63e13a8ab0b9ff",
        "37f23efcc58ed4c104baf9f2338bf005c1ee2fa2b82b1295d3a6fc68a20ed017",
    ),
    "day1-overfit": (
        "ae8424e6dfdefde8c015a986880db5f792a92e0a247a8e2798d5a27bdd3f9df7",
        "95adadb9a07e5231ac4643f37294910382ce1159826dbe02d65f90fc41240b13",
    ),
    "main88": (
        "cf1b09d3778eda46c4fc194bcccc4eede32a43e16a0f73e137adec8607f69d41",
        "e77b394cc95785fac48ec04a33628a19511dd5545efe67453dea7d26f78aaf9c",
    ),
    "recipe": (
        "81013ad48e9d827639f99e209bada298e6f7829bb67148e46bd0fc514ed39980",
        "b1fb6e5177aad5ba422558bcd51d514de329a6cb5334c240d17deb76ef57edda",
    ),
    "small": (
        "8f2b27c1a11ca21780a6a8544e291ccef9f7cbaf4b63e735413e8a4709d91c3b",
        "b5e3632d5031a3f711ac519ca5c9895bd454461393d3e88d26fde9803179eefe",
    ),
    "tiny": (
        "2bcc6bb9a3e75bc85e9fa1fbdf97ce487a076f03e113c5d515fc1635ef993bae",
        "27d5f58bb3d1690c853f5d4921de46644173300fb8a217fbb7d39169665e6495",
    ),
}
DEFAULT_DICT_SHA256 = "7728d64b2fef103a6c57794fa2790ae75321d908c7e6c7bec76a929c46ce7ea2"
"""sha256 of `json.dumps(TrainConfig().to_dict())`: its values and its key order, the bytes a
checkpoint's metadata and a log header hold (JSON objects keep their insertion order)."""


def test_every_shipped_config_is_pinned() -> None:
    assert sorted(SHIPPED) == shipped_configs()


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_shipped_config_keeps_its_fingerprints(name: str) -> None:
    keys, _ = read_toml(name, sweep=True)
    cfg = TrainConfig(**keys)
    assert (cfg.fingerprint_for(1), cfg.fingerprint_for(4)) == SHIPPED[name]


def test_the_golden_run_folder_keeps_its_fingerprint() -> None:
    """The config its header records, rebuilt today, has the fingerprint that run recorded."""
    header = json.loads(GOLDEN_LOG.read_text().splitlines()[0])
    cfg = TrainConfig(**header["config"])
    assert cfg.fingerprint_for(header["world"]) == header["fingerprints"]["config"]
    # An older octlm wrote fewer keys: each it wrote has its value, in the order it wrote them.
    written = [k for k in cfg.to_dict() if k in header["config"]]
    assert {k: cfg.to_dict()[k] for k in written} == header["config"]
    assert written == list(header["config"])


def test_the_flat_config_keeps_its_bytes() -> None:
    raw = json.dumps(TrainConfig().to_dict()).encode()
    assert hashlib.sha256(raw).hexdigest() == DEFAULT_DICT_SHA256


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_printed_config_reads_back_to_the_same_run(name: str, tmp_path: Path) -> None:
    """`--print-config`'s TOML, grouped by section with the keys that do not apply left out
    (Muon's under AdamW, wsd's under cosine), is a `--config` file for the same config."""
    from octlm.config.files import load_toml, sectioned_toml

    keys, _ = read_toml(name, sweep=True)
    cfg = TrainConfig(**keys).resolved()
    path = tmp_path / "printed.toml"
    path.write_text(sectioned_toml(cfg), encoding="utf-8")
    assert TrainConfig(**load_toml(path)) == cfg
    assert TrainConfig(**load_toml(path)).fingerprint_for(1) == SHIPPED[name][0]
    text = path.read_text(encoding="utf-8")
    assert ("muon_lr" in text) == (cfg.optim.optimizer == "muon")
    assert text.startswith("# shape\n") and "\n# optim\n" in text
