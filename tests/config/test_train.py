"""Tests for octlm.config.train: precedence, validation, the trajectory fingerprint, shipped
configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from octlm.config.diff import changed_keys, trajectory_changes
from octlm.config.files import field_docs, load_toml, make_config
from octlm.config.train import (
    NON_TRAJECTORY_KEYS,
    OMITTED_AT_DEFAULT,
    ConfigError,
    TrainConfig,
    config_keys,
)
from octlm.errors import OctlmError
from tests.cli_in_process import main

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "octlm" / "configs").glob("*.toml"))

# Keys the spec names as not deciding any computed number.
NOT_TRAJECTORY = {
    "out",
    "data",
    "val_every",
    "ckpt_every",
    "keep_ckpts",
    "stop_at",
    "resume",
    "progress",
    "device",
    "peak_tflops",
    "hash_every",
    "hash_tensors",
    "eval_tasks_every",
}
TRAJECTORY = {
    "model",
    "steps",
    "warmup",
    "lr",
    "min_lr_ratio",
    "micro_batch",
    "accum",
    "context",
    "beta1",
    "beta2",
    "eps",
    "weight_decay",
    "grad_clip",
    "dropout",
    "seed",
    "overfit_blocks",
    "dtype",
    "compile",
    "fused",
    "deterministic",
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_flags_override_toml_which_overrides_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, 'model = "tiny"\ncontext = 64\nsteps = 50\nlr = 2e-3\ncompile = true\n')
    cfg = make_config(path, lr=5e-4, steps=None, compile=False, seed=None)
    assert cfg.lr == 5e-4  # flag beats TOML
    assert cfg.steps == 50  # TOML beats default; a None flag means "not given"
    assert cfg.compile is False  # a False flag is given, not skipped
    assert cfg.warmup == TrainConfig().warmup  # default
    assert cfg.seed == TrainConfig().seed
    assert (cfg.model, cfg.context) == ("tiny", 64)


def test_no_toml_means_defaults_plus_flags() -> None:
    assert make_config(None, lr=1e-4) == TrainConfig(lr=1e-4)
    assert make_config() == TrainConfig()


def test_unknown_toml_key_is_an_error_naming_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "steps = 10\nlearning_rate = 1e-3\n")
    with pytest.raises(ConfigError, match="learning_rate"):
        load_toml(path)
    with pytest.raises(ConfigError, match="learning_rate"):
        make_config(path)


def test_missing_and_malformed_toml_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        make_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        make_config(write(tmp_path, "steps = = 3\n"))


def test_wrongly_typed_toml_value_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        make_config(write(tmp_path, 'lr = "fast"\n'))
    with pytest.raises(ConfigError, match="steps"):
        make_config(write(tmp_path, 'steps = "10"\n'))
    with pytest.raises(ConfigError, match="steps"):
        make_config(write(tmp_path, "steps = true\n"))


def test_hash_tensors_is_logging_and_must_be_a_bool(tmp_path: Path, capsys) -> None:
    on = TrainConfig(hash_tensors=True)
    assert "hash_tensors" not in on.trajectory()
    assert on.fingerprint_for(1) == TrainConfig().fingerprint_for(1)
    with pytest.raises(ConfigError, match="hash_tensors='yes' must be true or false"):
        make_config(write(tmp_path, 'hash_tensors = "yes"\n'))
    assert main(["train", "--config", str(tmp_path / "run.toml"), "--print-config"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "octlm: error: hash_tensors='yes' must be true or false (hash_tensors set in "
        f"{tmp_path / 'run.toml'}); change it on the command line or in --config"
    ]


@pytest.mark.parametrize(
    ("changes", "word"),
    [
        ({"steps": 0}, "steps"),
        ({"steps": -3}, "steps"),
        ({"accum": 0}, "accum"),
        ({"warmup": -1}, "warmup"),
        ({"lr": 0.0}, "lr"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio"),
        ({"beta2": 1.0}, "beta"),
        ({"grad_clip": -1.0}, "grad_clip"),
        ({"dropout": 1.0}, "dropout"),
        ({"dtype": "fp8"}, "fp8"),
        ({"model": "huge"}, "huge"),
        ({"model": "tiny", "context": 512}, "context"),
        ({"steps": 10, "warmup": 2, "stop_at": 11}, "stop_at"),
        ({"steps": 10, "warmup": 2, "stop_at": 0}, "stop_at"),
        ({"steps": 10, "warmup": 11}, "warmup"),
        ({"keep_last": 0}, "keep_last"),
        ({"eval_tasks_every": -1}, "eval_tasks_every"),
        ({"val_every": 20, "eval_tasks_every": 30}, "not a multiple of val_every=20"),
        ({"val_every": 0, "eval_tasks_every": 20}, "not a multiple of val_every=0"),
    ],
)
def test_bad_values_are_config_errors(changes: dict, word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        TrainConfig(**changes)
    with pytest.raises(ConfigError, match=word):
        make_config(None, **changes)


def test_config_error_is_a_user_facing_octlm_error() -> None:
    with pytest.raises(OctlmError) as info:
        TrainConfig(model="tiny", context=512)
    assert info.value.fix  # a fix is offered, not only the problem
    assert "256" in info.value.message


def test_edge_values_are_accepted() -> None:
    cfg = TrainConfig(model="tiny", context=256, steps=10, stop_at=10, warmup=0, grad_clip=0.0)
    assert cfg.stop_at == 10


def test_replace_revalidates() -> None:
    cfg = TrainConfig(model="tiny", context=64)
    assert cfg.replace(steps=7, warmup=2).steps == 7
    with pytest.raises(ConfigError):
        cfg.replace(steps=0)


def test_trajectory_excludes_paths_intervals_and_logging() -> None:
    traj = TrainConfig().trajectory()
    assert not NOT_TRAJECTORY & set(traj)
    assert set(traj) >= TRAJECTORY
    omitted = set(OMITTED_AT_DEFAULT)  # trajectory keys newer than some run folders
    assert set(traj) == set(config_keys()) - set(NON_TRAJECTORY_KEYS) - omitted
    assert traj["lr"] == TrainConfig().lr


def test_init_from_joins_the_trajectory_only_when_given() -> None:
    """No --init-from keeps every existing fingerprint; a source is part of what the run is."""
    base = TrainConfig(model="tiny", context=64)
    assert OMITTED_AT_DEFAULT["init_from"] is None and "init_from" not in base.trajectory()
    other = base.replace(init_from="runs/pretrained")
    assert other.trajectory()["init_from"] == "runs/pretrained"
    assert other.fingerprint_for(1) != base.fingerprint_for(1)


def test_order_joins_the_trajectory_only_when_it_is_not_the_default() -> None:
    """Run folders written before --order existed keep their fingerprint: the default order
    is left out of the trajectory, any other order is in it."""
    base = TrainConfig(model="tiny", context=64)
    assert base.order == "random" and "order" not in base.trajectory()
    assert OMITTED_AT_DEFAULT["order"] == "random"
    epoch = base.replace(order="epoch")
    assert epoch.trajectory(2)["order"] == "epoch"
    assert epoch.fingerprint_for(1) != base.fingerprint_for(1)
    assert trajectory_changes(base.trajectory(), epoch.trajectory()) == [
        "order: 'random' -> 'epoch'"
    ]
    assert trajectory_changes(epoch.trajectory(), base.trajectory()) == [
        "order: 'epoch' -> 'random'"
    ]


def test_a_shape_key_left_unset_reads_as_the_presets_in_a_change() -> None:
    base = TrainConfig(model="tiny", context=64, n_layers=2)
    unset = base.replace(n_layers=None)
    assert trajectory_changes(base.trajectory(), unset.trajectory()) == [
        "n_layers: 2 -> the preset's"
    ]


def test_an_unknown_order_is_one_line_naming_the_orders() -> None:
    with pytest.raises(ConfigError, match="order 'shuffled' is unknown") as info:
        TrainConfig(order="shuffled")
    assert "random" in str(info.value) and "epoch" in str(info.value)
    assert "\n" not in str(info.value)


def test_fingerprint_changes_with_lr_but_not_with_val_every() -> None:
    base = TrainConfig(model="tiny", context=64)
    assert base.fingerprint_for(1) == TrainConfig(model="tiny", context=64).fingerprint_for(1)
    assert len(base.fingerprint_for(1)) == 64
    for key, value in [("lr", 2e-3), ("seed", 1), ("dtype", "fp32"), ("accum", 3)]:
        assert base.replace(**{key: value}).fingerprint_for(1) != base.fingerprint_for(1), key
    for key, value in [
        ("val_every", 7),
        ("out", "elsewhere"),
        ("ckpt_every", 3),
        ("stop_at", 5),
        ("device", "cpu"),
        ("resume", True),
        ("progress", False),
        ("peak_tflops", 100.0),
        ("keep_ckpts", True),
        ("data", "/tmp/data"),
        ("eval_tasks_every", 100),
    ]:
        assert base.replace(**{key: value}).fingerprint_for(1) == base.fingerprint_for(1), key


def test_tasks_are_scored_at_every_validation_unless_told_otherwise() -> None:
    """eval_tasks_every: unset, the validation interval; 0, none before the last step."""
    cfg = TrainConfig(val_every=25)
    assert cfg.evaluation.task_interval == 25
    assert cfg.replace(eval_tasks_every=100).evaluation.task_interval == 100
    assert cfg.replace(eval_tasks_every=0).evaluation.task_interval == 0
    assert cfg.replace(val_every=0, eval_tasks_every=0).evaluation.task_interval == 0


def test_changed_keys_names_what_differs() -> None:
    old = TrainConfig().trajectory()
    new = TrainConfig(lr=1e-4).trajectory()
    assert changed_keys(old, new) == [f"lr: {old['lr']!r} -> 0.0001"]
    assert changed_keys(old, old) == []


def test_tokens_per_step() -> None:
    assert TrainConfig(micro_batch=4, accum=3, context=128).tokens_per_step == 4 * 3 * 128


def test_shipped_configs_exist() -> None:
    assert any(p.name == "tiny.toml" for p in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads_into_a_valid_train_config(path: Path) -> None:
    cfg = make_config(path)
    assert isinstance(cfg, TrainConfig)
    for key, value in load_toml(path).items():
        assert getattr(cfg, key) == value
    # Flags still override a shipped config.
    assert make_config(path, seed=cfg.seed + 1).seed == cfg.seed + 1


def test_every_field_has_a_docstring() -> None:
    docs = field_docs()
    missing = [k for k in config_keys() if not docs.get(k, "").strip()]
    assert missing == []
    assert set(docs) == set(config_keys())
    assert docs["lr"] == "Peak learning rate."


def test_every_field_says_whether_it_is_part_of_the_trajectory() -> None:
    """A new field must choose: `trajectory(...)` joins the resume fingerprint, `setting(...)`
    does not; the list of non-trajectory keys is derived from those marks."""
    from octlm.config.train import FIELDS

    marks = {key: f.metadata.get("trajectory") for key, f in FIELDS.items()}
    assert all(isinstance(m, bool) for m in marks.values()), marks
    assert set(NON_TRAJECTORY_KEYS) == {k for k, m in marks.items() if not m}


def test_toml_written_by_to_toml_reads_back() -> None:
    from octlm.config.files import read_toml, to_toml

    values = {"model": "tiny", "lr": 3e-3, "compile": True, "out": 'a "q" \\ b', "stop_at": None}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.toml"
        path.write_text(to_toml(values) + "[sweep]\nrepeats = 2\n")
        keys, table = read_toml(path, sweep=True)
        assert keys == {k: v for k, v in values.items() if v is not None}
        assert table == {"repeats": 2}
        with pytest.raises(ConfigError, match="unknown key"):
            load_toml(path)  # a [sweep] table belongs to `octlm sweep` only


# Written by octlm before the shape and schedule keys existed (commit c5245af): adding keys
# must not move the fingerprint of a run that sets none of them.
OLD_FINGERPRINTS = {
    1: "723be556c9d1db7cc7b268dd713a546b7f0d7e97fcb8ac46ef245695743a15e9",  # tiny, context 64
    2: "7c9dd663885cf6b89e3b8ccbaf15f79c44e35c3f1b769d18301a666674dc3005",  # defaults, 2 ranks
}


def test_new_keys_leave_the_fingerprints_of_older_runs_as_they_were() -> None:
    # Those runs had fused = false (the default then); a resume settles an unset `fused` to
    # the checkpoint's value (resume.settled_defaults) before the fingerprint is taken; so is
    # an unset `reduction` (they ran the collective sums).
    old = {"fused": False, "reduction": "collective"}
    assert TrainConfig(model="tiny", context=64, **old).fingerprint_for(1) == OLD_FINGERPRINTS[1]
    assert TrainConfig(**old).fingerprint_for(2) == OLD_FINGERPRINTS[2]
    explicit = {"schedule": "cosine", "decay_shape": "linear", "n_layers": None}
    assert (
        TrainConfig(model="tiny", context=64, **old, **explicit).fingerprint_for(1)
        == (OLD_FINGERPRINTS[1])
    )


def test_a_new_run_with_fused_unset_is_another_run_than_an_unfused_one() -> None:
    assert TrainConfig(model="tiny", context=64).fingerprint_for(1) != OLD_FINGERPRINTS[1]
    assert TrainConfig(model="tiny", context=64).fingerprint_for(1) == (
        TrainConfig(model="tiny", context=64, fused=True).fingerprint_for(1)
    )


def test_shape_resolves_to_the_preset_under_the_keys_set() -> None:
    from octlm.config.shape import PRESETS

    tiny = PRESETS["tiny"]
    cfg = TrainConfig(model="tiny", context=64, d_model=256, n_heads=8, rope_base=5e5)
    shape = cfg.shape.resolved()
    assert (shape["d_model"], shape["n_heads"], shape["rope_base"]) == (256, 8, 5e5)
    assert (shape["n_layers"], shape["d_ff"], shape["init_std"]) == (
        tiny.n_layers,
        tiny.d_ff,
        tiny.init_std,
    )
    resolved = cfg.resolved()
    assert resolved.n_layers == tiny.n_layers and resolved.d_model == 256
    assert resolved.fingerprint_for(1) == cfg.fingerprint_for(1)  # writing it out: same run


def test_a_shape_key_joins_the_fingerprint_only_when_it_differs_from_the_preset() -> None:
    base = TrainConfig(model="tiny", context=64)
    wide = base.replace(d_model=256, n_heads=8)
    assert wide.fingerprint_for(1) != base.fingerprint_for(1)
    assert wide.trajectory()["d_model"] == 256 and "n_layers" not in wide.trajectory()
    same = base.replace(d_model=192, n_heads=6)  # tiny's own values
    assert same.fingerprint_for(1) == base.fingerprint_for(1)
    assert trajectory_changes(base.trajectory(), wide.trajectory()) == [
        "d_model: the preset's -> 256",
        "n_heads: the preset's -> 8",
    ]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"d_model": 100}, "d_model 100 is not divisible by n_heads 6"),
        (
            {"n_heads": 4, "n_kv_heads": 3, "d_model": 192},
            "n_heads 4 is not divisible by n_kv_heads 3",
        ),
        ({"d_model": 198}, "head size d_model / n_heads = 33 is odd"),
        ({"n_layers": 0}, "n_layers=0 must be an integer from 1 to"),
        ({"d_ff": -4}, "d_ff=-4 must be an integer from 1 to"),
        ({"d_model": "256"}, "d_model='256' must be an integer from 1 to"),
        ({"norm_eps": 0.0}, "norm_eps=0.0 must be a number in \\(0, 1\\]"),
        ({"init_std": float("inf")}, "init_std=inf must be a number in \\(0, 1\\]"),
        ({"context": 512}, "context 512 exceeds the tiny model's 256"),
    ],
)
def test_each_bad_shape_is_one_line(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        TrainConfig(**{"model": "tiny", "context": 64, **changes})
    assert "\n" not in str(info.value)


def test_shape_keys_come_from_toml_and_flags_win(tmp_path) -> None:
    path = tmp_path / "shape.toml"
    path.write_text('model = "micro"\ncontext = 32\nd_model = 64\nn_layers = 3\n')
    cfg = make_config(path, n_layers=1)
    assert (cfg.model, cfg.d_model, cfg.n_layers, cfg.shape.resolved()["n_heads"]) == (
        "micro",
        64,
        1,
        4,
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schedule": "linear"}, "schedule 'linear' is unknown"),
        ({"schedule": "wsd"}, "--schedule wsd needs --decay-steps"),
        ({"schedule": "wsd", "decay_steps": 101}, "decay_steps=101 does not fit the 100 steps"),
        ({"schedule": "wsd", "decay_steps": 0}, "decay_steps=0 must be an integer from 1 to"),
        ({"schedule": "wsd", "decay_steps": 5, "decay_shape": "cos"}, "decay_shape 'cos'"),
        ({"decay_steps": 5}, "decay_steps and decay_shape are for --schedule wsd"),
        ({"decay_shape": "1-sqrt"}, "are for --schedule wsd, not cosine"),
    ],
)
def test_each_bad_schedule_is_one_line(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        TrainConfig(steps=110, warmup=10, **changes)
    assert "\n" not in str(info.value)


def test_wsd_joins_the_fingerprint_and_its_decay_settings_too() -> None:
    base = TrainConfig(model="tiny", context=64, steps=100, warmup=10)
    wsd = base.replace(schedule="wsd", decay_steps=20)
    prints = {
        c.fingerprint_for(1)
        for c in (base, wsd, wsd.replace(decay_steps=30), wsd.replace(decay_shape="1-sqrt"))
    }
    assert len(prints) == 4
    assert wsd.replace(decay_steps=90).decay_steps == 90  # all of steps - warmup is allowed


# -- what a config refuses, and why ----------------------------------------------------------------
def test_a_config_takes_its_settings_by_known_name_only() -> None:
    with pytest.raises(ConfigError, match=r"unknown key\(s\) warm_up \(did you mean warmup\?\)"):
        TrainConfig(warm_up=3)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) bogus"):
        TrainConfig().replace(bogus=1)
    with pytest.raises(ConfigError, match="takes its settings by name"):
        TrainConfig("tiny")  # type: ignore[misc]


def test_a_negative_zero_is_the_same_run_as_zero() -> None:
    base = TrainConfig(model="tiny", context=64)
    minus = base.replace(beta1=-0.0, grad_clip=-0.0, weight_decay=-0.0)
    plus = base.replace(beta1=0.0, grad_clip=0.0, weight_decay=0.0)
    assert str(minus.beta1) == "0.0" and minus.fingerprint_for(1) == plus.fingerprint_for(1)


def test_every_number_has_a_range_and_every_field_a_rule() -> None:
    from octlm.config.shape import SHAPE_KEYS
    from octlm.config.train import FIELD_RULES

    assert set(FIELD_RULES) == set(config_keys()) - set(SHAPE_KEYS)


@pytest.mark.parametrize("name", ["micro", "tiny", "small", "main"])
def test_the_parameter_count_is_the_models(name: str) -> None:
    import torch

    from octlm.config.shape import SHAPE_KEYS, parameter_count, preset
    from octlm.model.gpt import GPT

    for changes in ({}, {"vocab_size": 300}, {"n_kv_heads": 1, "d_ff": 40}):
        config = preset(name, **changes)
        with torch.device("meta"):  # counted, never allocated
            model = GPT(config)
        shape = {k: getattr(config, k) for k in SHAPE_KEYS}
        assert parameter_count(shape, config.vocab_size) == model.num_params(), changes


def test_a_model_too_big_for_the_machine_is_refused_from_its_count(monkeypatch) -> None:
    """16 bytes a parameter under ddp (fp32 weights, gradients, two AdamW moments), 4 under
    fsdp (the full weights each process builds), plus the micro-batch's activations, against
    the machine's memory: refused with the numbers, before anything is built."""
    from octlm.config import checks
    from octlm.config.shape import parameter_count

    tiny = TrainConfig(model="tiny", context=64, micro_batch=4)
    params = parameter_count(tiny.shape.resolved(), 4096)  # 2.36M: the embedded corpus' vocabulary
    activations = 4 * 64 * (192 * 4 + 4096) * 4  # block inputs and logits, fp32, per token
    monkeypatch.setattr(checks, "machine_memory", lambda: params * 16 + activations)
    assert tiny.replace(micro_batch=4) == tiny  # just fits
    with pytest.raises(ConfigError) as info:
        tiny.replace(micro_batch=5)
    message = str(info.value)
    assert "training this model needs at least 44.0 MB, more than this machine's 42.8 MB" in message
    assert f"{params:,} parameters x 16 bytes (ddp)" in message and "\n" not in message
    assert "lower --micro-batch" in message
    monkeypatch.setattr(checks, "machine_memory", lambda: params * 4 + activations)
    assert tiny.replace(parallel="fsdp").parallel == "fsdp"
    with pytest.raises(ConfigError, match=r"x 16 bytes \(ddp\)"):
        tiny.replace(steps=10, warmup=0)
    monkeypatch.setattr(checks, "machine_memory", lambda: None)  # unknown: no refusal
    assert TrainConfig(n_layers=10**6).n_layers == 10**6


def test_the_memory_rule_leaves_data_and_init_from_their_own_vocabulary(monkeypatch) -> None:
    """The vocabulary is the data's: the embedded corpus' is the preset's, another dataset's
    at least 256 (its byte tokens); an --init-from source brings its own shape."""
    from octlm.config import checks

    small = {"model": "small", "context": 64, "micro_batch": 1}
    monkeypatch.setattr(checks, "machine_memory", lambda: 200_000_000)  # 12.5M params at 16 B
    with pytest.raises(ConfigError, match="22,"):  # 22.0M with its 32768-token vocabulary
        TrainConfig(**small)
    assert TrainConfig(**small, data="some/dataset").data == "some/dataset"  # 9.5M at 256
    assert TrainConfig(**small, init_from="runs/base").init_from == "runs/base"


def test_bos_packing_and_the_doc_mask_join_the_fingerprint_and_need_each_other() -> None:
    base = TrainConfig(model="tiny", context=64)
    bos = base.replace(packing="bos")
    masked = bos.replace(doc_mask=True)
    assert "packing" not in base.trajectory() and "doc_mask" not in base.trajectory()
    assert len({c.fingerprint_for(1) for c in (base, bos, masked)}) == 3
    with pytest.raises(ConfigError, match="--doc-mask masks the documents of --packing bos"):
        base.replace(doc_mask=True)
    with pytest.raises(ConfigError, match="packing 'best' is unknown"):
        base.replace(packing="best")
    with pytest.raises(ConfigError, match="--packing bos reads a prepared --data"):
        bos.replace(blocks="text.txt")
