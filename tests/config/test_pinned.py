"""The settings' bytes, pinned: the resume fingerprint of every shipped config (at 1 and at 4
processes) and of the golden run folder, and the flat config's key order that checkpoints and
log headers record. They were taken before `TrainConfig` became sections; a change to any of
them means run folders users have would no longer resume (or no longer be the same bytes).
Machine-independent values (sha256 over JSON), so literals are right here."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from octlm.config.files import read_toml, shipped_configs
from octlm.config.train import TrainConfig

GOLDEN_LOG = Path(__file__).resolve().parents[1] / "golden" / "v1-micro" / "run" / "log.jsonl"
# name: (fingerprint_for(1), fingerprint_for(4)), taken before sections and the tree
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
SHIPPED_TREE = {
    "ablations/accum": (
        "305c6162107f031759a2885561ddb99567130385017bb57b55512881b66b4960",
        "c7b5ea0373d779df17072b96317363f4bff5b9f633bdb7573e924e18b92105f6",
    ),
    "ablations/clip": (
        "b30e595f4e1817931a902dc9ae2eda1b24e6fb4166cb35d9142f05b73c87108a",
        "f5566f2d9c711d2dd9f5e8b1521823168ffc7a9b6e2a035d1e1796d9b9d61e33",
    ),
    "ablations/high_lr": (
        "2512ac2c0216c915a732c6f048fd87357591f0271e20ac56089c118935f56705",
        "05f28bc0310f1c99ea4bccc6a91e2a74cb3d16a747a8472d6af3886bcaaa3db1",
    ),
    "ablations/lr": (
        "b30e595f4e1817931a902dc9ae2eda1b24e6fb4166cb35d9142f05b73c87108a",
        "f5566f2d9c711d2dd9f5e8b1521823168ffc7a9b6e2a035d1e1796d9b9d61e33",
    ),
    "ablations/warmup": (
        "b30e595f4e1817931a902dc9ae2eda1b24e6fb4166cb35d9142f05b73c87108a",
        "f5566f2d9c711d2dd9f5e8b1521823168ffc7a9b6e2a035d1e1796d9b9d61e33",
    ),
    "day1-overfit": (
        "1389a892cc868fac5254289fc6c27bc0b154e8f6e4c1a4181fd0a179db862d20",
        "2808157d4f563334a9a1f973e39efc693a5d7fecb621e493dfb04d56198c0a0a",
    ),
    "main88": (
        "02a3babea2679827a3ad8d82c7b4ca7c574c4c2a79a6c7bab1e708478a2bd4e3",
        "d631f74da9c4acfb584d558dc5c8313c0848afc971de1b0a8662e12bfb980a04",
    ),
    "recipe": (
        "fb6d11372906441f6b0125cb607d7fced712a37c67030c2c5cec121a75d1e52b",
        "e9b979e8fdb63fbb395fb7ccf50e775756ab2fd6f21ac784e992d9837c900250",
    ),
    "small": (
        "478709c386ace0167fe50081e6808e51a155e52c8bcde2a5ae530c557a43655e",
        "46b638f08718a54d52dab395a6454cd0891fb0a058d44d9839cc702a080e931e",
    ),
    "tiny": (
        "fe45f837f45642989e917b1bd204aa2366750deb16ccf4498b31e4dfd8110051",
        "893bdc2065b01a319523526d61e5676633593da40c2166be8c742d2a59a71c23",
    ),
}
"""The same configs as new runs take them today: `reduction = "tree"` in the fingerprint."""
DEFAULT_DICT_SHA256 = "7728d64b2fef103a6c57794fa2790ae75321d908c7e6c7bec76a929c46ce7ea2"
"""sha256 of `json.dumps(TrainConfig().to_dict())` before `reduction`, `deterministic_parts`
and `eval_tasks_every` were appended: its values
and its key order, the bytes a checkpoint's metadata and a log header hold (JSON objects keep
their insertion order)."""
DEFAULT_DICT_NOW_SHA256 = "d63b2fed8de2a02e4809839ed9fe3074c06a0068ad193826bc1e3160d2815ed3"


def test_every_shipped_config_is_pinned() -> None:
    assert sorted(SHIPPED) == shipped_configs()


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_shipped_config_keeps_its_fingerprints(name: str) -> None:
    keys, _ = read_toml(name, sweep=True)
    old = TrainConfig(**keys, reduction="collective")
    assert (old.fingerprint_for(1), old.fingerprint_for(4)) == SHIPPED[name]
    cfg = TrainConfig(**keys)
    assert (cfg.fingerprint_for(1), cfg.fingerprint_for(4)) == SHIPPED_TREE[name]


def test_the_golden_run_folder_keeps_its_fingerprint() -> None:
    """The config its header records, rebuilt today, has the fingerprint that run recorded."""
    from octlm.trainer.resume import settled_defaults

    header = json.loads(GOLDEN_LOG.read_text().splitlines()[0])
    unset = TrainConfig(**header["config"])
    # As a resume settles it: the folder's trajectory has no `reduction` (collective sums).
    cfg = settled_defaults(unset, SimpleNamespace(trajectory={"fused": False}))  # type: ignore
    assert cfg.hardware.reduction == "collective"
    assert cfg.fingerprint_for(header["world"]) == header["fingerprints"]["config"]
    # An older octlm wrote fewer keys: each it wrote has its value, in the order it wrote them.
    written = [k for k in cfg.to_dict() if k in header["config"]]
    assert {k: cfg.to_dict()[k] for k in written} == header["config"]
    assert written == list(header["config"])


def test_the_flat_config_keeps_its_bytes() -> None:
    """New keys are appended: the bytes before them are the earlier bytes."""
    flat = TrainConfig().to_dict()
    raw = json.dumps(flat).encode()
    assert hashlib.sha256(raw).hexdigest() == DEFAULT_DICT_NOW_SHA256
    assert list(flat)[-3:] == ["reduction", "deterministic_parts", "eval_tasks_every"]
    assert flat.pop("eval_tasks_every") is None and flat.pop("deterministic_parts") is None
    assert flat.pop("reduction") is None
    assert hashlib.sha256(json.dumps(flat).encode()).hexdigest() == DEFAULT_DICT_SHA256


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
    assert TrainConfig(**load_toml(path)).fingerprint_for(1) == SHIPPED_TREE[name][0]
    text = path.read_text(encoding="utf-8")
    assert ("muon_lr" in text) == (cfg.optim.optimizer == "muon")
    assert text.startswith("# shape\n") and "\n# optim\n" in text
