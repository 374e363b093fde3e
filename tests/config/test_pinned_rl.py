"""RL's settings bytes, pinned as training's are (tests/config/test_pinned.py): what an RL
checkpoint and log header record of its settings (`rl`), its trajectory, and its resume
fingerprint over the trajectory and a source. Taken with the code before RL's settings became
a section of the one settings system (commit 7cbaa24); a change to any of them means RL run
folders users have would no longer resume, or no longer be the same bytes. Machine-independent
values (sha256 over JSON), so literals are right here."""

from __future__ import annotations

import hashlib
import json

import pytest

from octlm.config.rl import RLConfig

SOURCE = {
    "path": "/runs/ft/ckpt.safetensors",
    "kind": "rl source",
    "step": 30,
    "weights_sha256": "ab" * 32,
}
CASES = {
    "defaults": {"source": "runs/ft", "task": "addition:1", "out": "runs/rl"},
    "tests": {
        "source": "runs/ft",
        "task": "addition:1",
        "out": "runs/rl",
        "prompts": 4,
        "samples": 4,
        "max_new_tokens": 8,
        "steps": 6,
        "lr": 3e-4,
        "seed": 3,
        "eval_every": 3,
        "eval_prompts": 8,
        "pass_k": 2,
        "ckpt_every": 2,
        "keep_last": 3,
        "stop_at": 3,
        "resume": True,
        "log_to": "tensorboard",
        "progress": False,
        "device": "cpu",
        "dist_timeout": 60.0,
    },
    "top_k": {
        "source": "runs/ft",
        "task": "count",
        "out": "o",
        "temperature": 0.7,
        "top_k": 5,
        "grad_clip": 0.0,
        "seed": 12345,
    },
}
# name: (sha256 of the recorded settings' JSON, of the trajectory's JSON, the fingerprint)
PINNED = {
    "defaults": (
        "3101c7d30ddbe610412b7fc02bb431245957729a8c0926882c653c2d1ac52f81",
        "7802ef63dc0f66ed5ec0bc5bc4783452d63e5d49cbd687ecc5ebd00ba9bf5b97",
        "f302d4fe3379b597c420a91e46e12660326e3760aa7b031fda03e465bdf455dd",
    ),
    "tests": (
        "54088cc405e50a717babf4905c6f57eef930b73799a1cbf258c5df822413290e",
        "be3c6c91fe54e511231de5f62d589fae5b29280af90f4e86decfffe4a5d2ea74",
        "76839c3ef499e30cd2838b9f85695cf8fab703b16c133da47afa69a4f67277c4",
    ),
    "top_k": (
        "d67fa221fcf342640d53a1cbc5c5a83ca6cae9d2d920ed5f708b9c86ec3d6818",
        "3491247efb5a3bd6e99e91223eed265e2ee366e68c7ecbca853721750fdb00a1",
        "adb3ce5913433b7bc9f63c8f420a206fd2cf5d0c457f4d40267a0dc2c36042c9",
    ),
}
RECORDED_KEYS = [
    "source",
    "task",
    "out",
    "prompts",
    "samples",
    "max_new_tokens",
    "temperature",
    "top_k",
    "steps",
    "lr",
    "grad_clip",
    "seed",
    "eval_every",
    "eval_prompts",
    "pass_k",
    "ckpt_every",
    "keep_last",
    "stop_at",
    "resume",
    "log_to",
    "progress",
    "device",
    "dist_timeout",
]


def _sha(value: object) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(CASES))
def test_rl_settings_bytes_are_pinned(name):
    cfg = RLConfig(**CASES[name])
    assert list(cfg.to_dict()) == RECORDED_KEYS  # the order a checkpoint records them in
    assert (_sha(cfg.to_dict()), _sha(cfg.trajectory()), cfg.fingerprint(SOURCE)) == PINNED[name]


def test_the_pins_see_a_change():
    """Control: one trajectory value more moves all three; an interval moves only the record."""
    base = RLConfig(**CASES["tests"])
    other = RLConfig(**{**CASES["tests"], "samples": 5})
    assert other.fingerprint(SOURCE) != base.fingerprint(SOURCE)
    assert _sha(other.trajectory()) != _sha(base.trajectory())
    later = RLConfig(**{**CASES["tests"], "ckpt_every": 5})
    assert later.fingerprint(SOURCE) == base.fingerprint(SOURCE)
    assert _sha(later.to_dict()) != _sha(base.to_dict())
