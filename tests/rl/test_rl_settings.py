"""RL's settings are a part of the one settings system: every key it shares with `octlm train`
has training's rule and refusal, and RL gets training's doors: `--config` TOML, `--print-config`
(which `--config` reads back to the same run), the Python API (`octlm.train_rl`), and `octlm
verify-resume` on its settings file. Run end to end against the straight run of
tests/rl/test_rl_runs.py's settings, each with a control that must differ."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

import octlm
from octlm.config import checks
from octlm.config.rl import EXACT_KERNEL, KEY_ORDER, SECTIONS, RLConfig
from octlm.config.rules import ConfigError, field_rule
from octlm.config.train import FIELDS, TrainConfig
from octlm.errors import OctlmError
from tests.cli_in_process import main as cli_main
from tests.e2e.helpers import end_hash
from tests.e2e.helpers import octlm as run_octlm
from tests.rl.helpers import RL, chat_source
from tests.shared import shared

SHARED = sorted(set(KEY_ORDER) & set(FIELDS))
RL_FIELDS = {f.name: f for cls in SECTIONS.values() for f in dataclasses.fields(cls)}


def test_rl_shares_sixteen_keys_with_training_each_with_its_rule_and_role():
    assert (
        sorted(
            [
                "ckpt_every",
                "device",
                "dist_timeout",
                "grad_clip",
                "hash_every",
                "keep_last",
                "log_to",
                "lr",
                "out",
                "profile_steps",
                "progress",
                "resume",
                "seed",
                "skip_nonfinite",
                "stop_at",
                "steps",
            ]
        )
        == SHARED
    )
    for key in SHARED:
        assert field_rule(RL_FIELDS[key]) == field_rule(FIELDS[key]), key
        assert RL_FIELDS[key].metadata == FIELDS[key].metadata, key


BAD = {
    "seed": 2**53,
    "keep_last": 0,
    "ckpt_every": -1,
    "lr": float("nan"),
    "grad_clip": -1.0,
    "dist_timeout": 8 * 24 * 3600.0,
    "device": "gpu",
    "log_to": "mlflow",
    "steps": 0,
    "resume": "yes",
    "progress": 1,
    "out": "",
    "skip_nonfinite": "yes",
    "hash_every": -1,
    "profile_steps": "3:2",
}


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_shared_key_is_refused_in_trainings_words(key):
    """The same bad value, the same line from both configs (stop_at: checked against steps)."""
    with pytest.raises(ConfigError) as train:
        TrainConfig(**{key: BAD[key]})
    with pytest.raises(ConfigError) as rl:
        RLConfig(**{"source": "runs/ft", "task": "addition", "out": "runs/rl", key: BAD[key]})
    assert str(rl.value) == str(train.value)
    assert f"{key}=" in str(rl.value) or key in str(rl.value)


def test_every_shared_key_is_tried():
    assert set(BAD) | {"stop_at"} == set(SHARED)
    # Control: a good value of each passes both.
    good = RLConfig(source="s", task="count", out="o", seed=2**53 - 1, stop_at=3, steps=3)
    assert good.seed == 2**53 - 1 and good.stop_at == 3


def test_rl_config_refuses_missing_source_task_and_unknown_keys():
    with pytest.raises(ConfigError, match="needs the run to start from"):
        RLConfig(task="count")
    with pytest.raises(ConfigError, match="needs a task"):
        RLConfig(source="runs/ft")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) sample \(did you mean samples\?\)"):
        RLConfig(source="runs/ft", task="count", sample=3)
    with pytest.raises(ConfigError, match="stop_at=9 must be between 1 and steps=4"):
        RLConfig(source="runs/ft", task="count", steps=4, stop_at=9)


@pytest.mark.slow  # two real commands
def test_the_seed_past_json_is_refused_by_rl_as_by_train(tmp_path):
    """One line, the same words, nothing written (the source need not even exist: settings are
    checked before anything is read)."""
    big = "9007199254740992"
    train = run_octlm("train", "--seed", big, "--out", str(tmp_path / "t"), check=False)
    rl = run_octlm(
        "rl", "ft", "--task", "count", "--seed", big, "--out", str(tmp_path / "r"), check=False
    )
    for proc in (train, rl):
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert "--seed 9007199254740992 must be an integer from 0 to 2**53 - 1" in rl.stderr
    assert rl.stderr.split("error: ")[1] == train.stderr.split("error: ")[1]
    assert not (tmp_path / "t").exists() and not (tmp_path / "r").exists()


def test_rl_help_groups_its_flags_by_section(capsys):
    with pytest.raises(SystemExit) as done:  # in this process: argparse's help exits 0
        cli_main(["rl", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for name in SECTIONS:
        assert f"{name} settings" in text
    assert "--keep-last" in text and "--print-config" in text and "--config" in text
    # A shared key without an RL docstring has training's.
    assert "Full checkpoints kept" in " ".join(text.split())


@pytest.fixture(scope="module")
def source(tiny_tokenizer, tmp_path_factory) -> Path:
    return chat_source(tiny_tokenizer, tmp_path_factory)


@pytest.fixture(scope="module")
def straight(source, tmp_path_factory) -> Path:
    def build(root: Path) -> None:
        run_octlm("rl", str(source), *RL, "--out", str(root / "run"))

    return shared(tmp_path_factory, "rl-straight", build) / "run"


@pytest.mark.slow
def test_print_config_then_config_reproduces_the_run(source, straight, tmp_path):
    printed = run_octlm("rl", str(source), *RL, "--out", "ignored", "--print-config").stdout
    assert not Path("ignored").exists()
    assert [line for line in printed.splitlines() if line.startswith("# ")] == [
        f"# {name}" for name in SECTIONS
    ]
    toml = tmp_path / "r.toml"
    toml.write_text(printed)
    assert tomllib.loads(printed)["task"] == "addition:1"
    run_octlm("rl", "--config", str(toml), "--out", str(tmp_path / "again"))
    assert end_hash(tmp_path / "again") == end_hash(straight)
    # Control: the file with another seed is another run.
    toml.write_text(printed.replace("seed = 0", "seed = 1"))
    run_octlm("rl", "--config", str(toml), "--out", str(tmp_path / "other"))
    assert end_hash(tmp_path / "other") != end_hash(straight)


@pytest.mark.slow
def test_the_python_api_runs_the_same_rl_run(source, straight, tmp_path):
    toml = tmp_path / "r.toml"
    toml.write_text(run_octlm("rl", str(source), *RL, "--print-config").stdout)
    result = octlm.train_rl(toml, out=str(tmp_path / "api"), progress=False)
    assert result.weights_sha256 == end_hash(straight) and not result.stopped_early
    with pytest.raises(OctlmError, match="samples=0 must be"):
        octlm.train_rl(toml, out=str(tmp_path / "bad"), samples=0)
    assert not (tmp_path / "bad").exists()
    with pytest.raises(OctlmError, match="needs a folder to write"):
        octlm.train_rl(toml)


@pytest.mark.slow
def test_verify_resume_takes_an_rl_settings_file(source, tmp_path):
    toml = tmp_path / "r.toml"
    toml.write_text(run_octlm("rl", str(source), *RL, "--print-config").stdout)
    proc = run_octlm(
        "verify-resume", "--config", str(toml), "--split", "3", "--workdir", str(tmp_path)
    )
    assert "split@3" in proc.stdout and proc.stdout.strip().endswith("bit for bit")
    wrong = run_octlm(
        "verify-resume", "--config", str(toml), "--split", "3", "--lr", "0.1", check=False
    )
    assert wrong.returncode == 1 and "--lr is octlm train's" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_rl_section_rules_come_from_checks():
    """Every RL key's rule is one of config/checks.py's (no private range check)."""
    for key, f in RL_FIELDS.items():
        assert isinstance(field_rule(f), checks.Int | checks.Number | checks.Bool | checks.Text), (
            key
        )


def test_the_exact_kernel_is_settled_like_the_sampler():
    """A new run takes the newest exact kernel and records it; a resume of a run without the key
    (written before it) takes kernel 1, which its trajectory leaves out (its fingerprint stays);
    a plain sampler records none; a kernel out of range is refused in one line."""
    base = RLConfig(source="s", task="count", out="o")
    new = base.resolved(None)
    assert (new.sampler, new.exact_kernel) == ("exact", EXACT_KERNEL)
    assert new.trajectory()["exact_kernel"] == EXACT_KERNEL == 3
    old = base.resolved({"sampler": "exact"})
    assert old.exact_kernel == 1 and "exact_kernel" not in old.trajectory()
    unsettled = RLConfig(source="s", task="count", out="o", sampler="exact")  # as before the key
    assert old.fingerprint({}) == unsettled.fingerprint({}) != new.fingerprint({})
    assert base.resolved({"sampler": "exact", "exact_kernel": 2}).exact_kernel == 2
    plain = RLConfig(source="s", task="count", out="o", sampler="plain").resolved(None)
    assert "exact_kernel" not in plain.trajectory()
    for bad in (0, 4, "two"):
        with pytest.raises(ConfigError, match="exact_kernel") as refused:
            RLConfig(source="s", task="count", out="o", exact_kernel=bad)
        assert "\n" not in str(refused.value)
