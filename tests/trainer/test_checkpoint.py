"""Tests for octlm.trainer.checkpoint and octlm.trainer.state: pickle-free safetensors files, atomic
saves, sha256 and version checks, the latest.json rotation, the v1 layout of a run's state,
optimizer and RNG round-trips, and a Run's state_dict/resume."""

from __future__ import annotations

import errno
import json
import pickle
import random
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save, save_file

from octlm.config.shape import preset
from octlm.config.train import TrainConfig
from octlm.hashing import file_checksum, file_sha256
from octlm.model.gpt import GPT
from octlm.trainer import checkpoint as ckpt
from octlm.trainer.checkpoint import (
    CKPT_DIR,
    FORMAT,
    FORMAT_VERSION,
    KEEP_LAST,
    LATEST,
    CheckpointError,
    find_checkpoint,
    flatten,
    load_checkpoint,
    optimizer_from_flat,
    optimizer_to_flat,
    pack,
    parse_info,
    read_latest,
    save_checkpoint,
    split_tensors,
    unflatten,
    unpack,
)
from octlm.trainer.loop import advance as advance_one
from octlm.trainer.run import Run, build_run, resume
from octlm.trainer.state import TrainState, load_rng_state_dict, rng_state_dict

TINY = preset(
    "tiny", vocab_size=512, context=32, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128
)
CPU = torch.device("cpu")


def run_config(tiny_dataset: Path, out: Path) -> TrainConfig:
    return TrainConfig(
        model="tiny",
        data=str(tiny_dataset),
        out=str(out),
        context=32,
        micro_batch=2,
        accum=2,
        steps=10,
        warmup=2,
        dtype="fp32",
        device="cpu",
        progress=False,
    )


def advance(run: Run, n: int = 1) -> None:
    """n real optimizer steps of a Run, as the loop takes them."""
    for _ in range(n):
        advance_one(run, validating=False)


@pytest.fixture(scope="module")
def saved_run(tiny_dataset, tmp_path_factory) -> tuple[Run, Path]:
    """A real run after one step, checkpointed. Read-only: copy the folder to change it."""
    out = tmp_path_factory.mktemp("ckpt_run") / "run"
    run = build_run(run_config(tiny_dataset, out))
    advance(run)
    run.save()
    run.saver.wait()
    return run, find_checkpoint(out)[0]


def small_tensors(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4, 4), value), "n": torch.arange(3)}


def make_adamw(fused: bool, steps: int = 2) -> tuple[GPT, torch.optim.AdamW]:
    torch.manual_seed(0)
    model = GPT(TINY)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, fused=fused)
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        x = torch.randint(0, TINY.vocab_size, (2, TINY.context), generator=g)
        loss_sum, n = model(x, x.roll(-1, dims=1))
        (loss_sum / n).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def assert_optimizer_states_equal(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert sorted(a["state"]) == sorted(b["state"])
    for idx, state in a["state"].items():
        other = b["state"][idx]
        assert sorted(state) == sorted(other)
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == other[key].dtype, (idx, key)
                assert torch.equal(value, other[key]), (idx, key)
            else:
                assert value == other[key], (idx, key)


# --- the file format ---------------------------------------------------------------------------


def test_checkpoint_is_safetensors_with_a_plain_json_header(saved_run) -> None:
    _, path = saved_run
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    assert data[8:9] == b"{"
    header_bytes = data[8 : 8 + n]

    def no_nan(name: str) -> None:
        raise AssertionError(f"non-JSON constant {name} in the header")

    header = json.loads(header_bytes.decode("utf-8"), parse_constant=no_nan)
    # No pickle anywhere: no PROTO opcode, no torch/builtins class references.
    for marker in (b"\x80\x02", b"\x80\x04", b"\x80\x05", b"_rebuild", b"c__builtin__", b"torch._"):
        assert marker not in header_bytes
    meta = json.loads(header["__metadata__"]["octlm"], parse_constant=no_nan)
    assert (meta["format"], meta["format_version"]) == (FORMAT, FORMAT_VERSION)
    # Every other entry is a tensor whose bytes lie in the file; together they cover it.
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    assert {k.split(".", 1)[0] for k in entries} == {"model", "optim", "rng"}
    assert max(e["data_offsets"][1] for e in entries.values()) == len(data) - 8 - n


def test_loading_never_unpickles(saved_run, monkeypatch) -> None:
    _, path = saved_run

    def forbidden(*args, **kwargs):
        raise AssertionError("a checkpoint load reached pickle")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    read, tensors = load_checkpoint(path, file_sha256(path))
    meta = read.as_written()
    assert meta["train_state"]["step"] == 1


def test_load_returns_exactly_what_was_saved(saved_run) -> None:
    run, path = saved_run
    meta, tensors = pack(run.state_dict())
    read, loaded = load_checkpoint(*find_checkpoint(run.out))
    loaded_meta = read.as_written()
    assert find_checkpoint(run.out)[0] == path
    assert sorted(loaded) == sorted(tensors)
    for name, t in tensors.items():
        if not name.startswith("rng."):  # RNG moved on since the save (Run draws nothing, but)
            assert torch.equal(loaded[name], t), name
    assert loaded_meta["train_state"] == meta["train_state"]
    assert loaded_meta["sampler"] == json.loads(json.dumps(meta["sampler"]))
    assert loaded_meta["trajectory"] == meta["trajectory"]


def test_wrong_checksum_is_a_checkpoint_error(saved_run) -> None:
    _, path = saved_run
    with pytest.raises(CheckpointError, match="xxh3_128 checksum"):
        load_checkpoint(path, "xxh3_128:" + "0" * 32)
    with pytest.raises(CheckpointError, match="sha256 checksum"):  # a bare hex is a sha256
        load_checkpoint(path, "0" * 64)
    load_checkpoint(path, file_checksum(path))
    load_checkpoint(path, file_checksum(path, "sha256"))
    load_checkpoint(path, file_sha256(path))


def test_one_flipped_bit_fails_the_listed_checksum(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, {}, small_tensors(1.0))
    path, listed = find_checkpoint(tmp_path)
    assert listed == file_checksum(path) and listed.startswith("xxh3_128:")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10  # inside the last tensor: safetensors itself would not notice
    path.write_bytes(bytes(data))
    load_checkpoint(path, None)
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(path, listed)


def test_a_latest_json_of_octlm_0_1_with_sha256_entries_still_loads(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, {"s": 1}, small_tensors(1.0))
    folder = tmp_path / CKPT_DIR
    name = "step_000001.safetensors"
    old = {"checkpoints": [{"file": name, "step": 1, "sha256": file_sha256(folder / name)}]}
    (folder / LATEST).write_text(json.dumps(old))
    path, listed = find_checkpoint(tmp_path)
    assert listed == "sha256:" + file_sha256(folder / name)
    assert load_checkpoint(path, listed)[0].as_written()["s"] == 1
    save_checkpoint(tmp_path, 2, {"s": 2}, small_tensors(2.0))  # rewrites the list anew
    assert [e["checksum"].split(":")[0] for e in read_latest(tmp_path)] == ["sha256", "xxh3_128"]


@pytest.mark.parametrize("keep", [0, 4, 20, 0.5, -1], ids=["empty", "4B", "20B", "half", "-1B"])
def test_truncated_file_is_a_checkpoint_error(saved_run, tmp_path: Path, keep) -> None:
    _, path = saved_run
    data = path.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else (keep % len(data))
    bad = tmp_path / "step_000001.safetensors"
    bad.write_bytes(data[:n])
    with pytest.raises(CheckpointError):
        load_checkpoint(bad, None)
    with pytest.raises(CheckpointError):  # and the listed checksum catches it first
        load_checkpoint(bad, file_checksum(path))


def test_newer_format_version_is_a_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "future.safetensors"
    header = {"format": FORMAT, "format_version": FORMAT_VERSION + 1}
    save_file(small_tensors(1.0), str(path), metadata={"octlm": json.dumps(header)})
    with pytest.raises(CheckpointError, match="format version"):
        load_checkpoint(path, None)


@pytest.mark.parametrize(
    "metadata",
    [None, {"octlm": "not json"}, {"octlm": "[1, 2]"}, {"octlm": '{"format": "other"}'}],
    ids=["no-metadata", "not-json", "not-an-object", "foreign-format"],
)
def test_foreign_or_damaged_metadata_is_a_checkpoint_error(tmp_path: Path, metadata) -> None:
    path = tmp_path / "x.safetensors"
    save_file(small_tensors(1.0), str(path), metadata=metadata)
    with pytest.raises(CheckpointError):
        load_checkpoint(path, None)


def test_missing_checkpoint_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 3, {}, small_tensors(3.0))
    listed, sha = find_checkpoint(tmp_path)
    listed.unlink()  # still named by latest.json
    with pytest.raises(CheckpointError):
        load_checkpoint(listed, sha)
    with pytest.raises(CheckpointError):
        find_checkpoint(tmp_path / "elsewhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        find_checkpoint(tmp_path / "empty")


def test_corrupt_latest_json_is_a_checkpoint_error(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, {}, small_tensors(1.0))
    (tmp_path / CKPT_DIR / LATEST).write_text("{ half")
    with pytest.raises(CheckpointError, match="corrupt"):
        find_checkpoint(tmp_path)


# --- rotation and atomicity --------------------------------------------------------------------


def test_latest_json_keeps_the_last_entries_and_deletes_older_files(tmp_path: Path) -> None:
    steps = [1, 2, 3, 4, 5]
    for s in steps:
        save_checkpoint(tmp_path, s, {"s": s}, small_tensors(float(s)))
    folder = tmp_path / CKPT_DIR
    entries = read_latest(tmp_path)
    kept = steps[-KEEP_LAST:]
    assert [e["step"] for e in entries] == kept  # newest last
    names = {f"step_{s:06d}.safetensors" for s in kept}
    assert {p.name for p in folder.iterdir()} == names | {LATEST}
    for e in entries:
        assert e["checksum"] == file_checksum(folder / e["file"])
    path, sha = find_checkpoint(tmp_path)
    read, tensors = load_checkpoint(path, sha)
    meta = read.as_written()
    assert meta["s"] == 5
    assert torch.equal(tensors["w"], torch.full((4, 4), 5.0))


def test_saving_the_same_step_again_replaces_its_entry(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, {}, small_tensors(1.0))
    save_checkpoint(tmp_path, 2, {}, small_tensors(2.0))
    save_checkpoint(tmp_path, 2, {}, small_tensors(2.5))
    entries = read_latest(tmp_path)
    assert [e["step"] for e in entries] == [1, 2]
    _, tensors = load_checkpoint(*find_checkpoint(tmp_path))
    assert float(tensors["w"][0, 0]) == 2.5


def test_failed_write_leaves_the_previous_checkpoint_and_no_temp_file(
    tmp_path: Path, monkeypatch
) -> None:
    save_checkpoint(tmp_path, 1, {}, small_tensors(1.0))
    save_checkpoint(tmp_path, 2, {}, small_tensors(2.0))
    folder = tmp_path / CKPT_DIR
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def half_then_fail(filename, tensors, metadata):
        data = save(tensors, metadata=metadata)
        Path(filename).write_bytes(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "write_safetensors", half_then_fail)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint(tmp_path, 3, {}, small_tensors(3.0))
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert after == before  # same names (no temp file, no step 3), same bytes
    path, sha = find_checkpoint(tmp_path)
    _, tensors = load_checkpoint(path, sha)
    assert float(tensors["w"][0, 0]) == 2.0


# --- optimizer round-trip ----------------------------------------------------------------------


@pytest.mark.parametrize("fused", [False, True], ids=["adamw", "fused-adamw"])
def test_optimizer_flat_round_trip_is_exact(fused: bool) -> None:
    _, opt = make_adamw(fused)
    sd = opt.state_dict()
    meta, tensors = optimizer_to_flat(opt)
    assert all(k.startswith("optim.") for k in tensors)  # namespaced inside a checkpoint
    rebuilt = optimizer_from_flat(meta, split_tensors(tensors, "optim."))
    assert_optimizer_states_equal(rebuilt, sd)
    # And the rebuilt dict loads into a new optimizer, which then reports the same state.
    _, opt2 = make_adamw(fused, steps=0)
    opt2.load_state_dict(rebuilt)
    assert_optimizer_states_equal(opt2.state_dict(), sd)


@pytest.mark.parametrize("fused", [False, True], ids=["adamw", "fused-adamw"])
def test_optimizer_survives_a_checkpoint_file_and_continues_identically(
    fused: bool, tmp_path: Path
) -> None:
    model, opt = make_adamw(fused)
    meta, tensors = optimizer_to_flat(opt)
    weights = {f"model.{k}": v for k, v in model.state_dict().items()}
    path = save_checkpoint(tmp_path, 2, {"optimizer": meta}, {**tensors, **weights})
    read, loaded = load_checkpoint(path, file_sha256(path))
    loaded_meta = read.as_written()

    torch.manual_seed(99)
    model2 = GPT(TINY)
    model2.load_state_dict(split_tensors(loaded, "model."))
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3, weight_decay=0.1, fused=fused)
    opt2.load_state_dict(
        optimizer_from_flat(loaded_meta["optimizer"], split_tensors(loaded, "optim."))
    )
    assert_optimizer_states_equal(opt2.state_dict(), opt.state_dict())
    # One more identical step on each: bitwise equal weights.
    x = torch.randint(0, TINY.vocab_size, (2, TINY.context), generator=torch.Generator())
    for m, o in ((model, opt), (model2, opt2)):
        loss_sum, n = m(x, x.roll(-1, dims=1))
        (loss_sum / n).backward()
        o.step()
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, q)


def test_run_resume_restores_weights_optimizer_and_counters(saved_run, tmp_path: Path) -> None:
    run, _ = saved_run
    out = tmp_path / "run"
    shutil.copytree(run.out, out)
    fresh = build_run(run.cfg.replace(out=str(out), resume=True))
    resume(fresh)
    assert fresh.state.step == run.state.step == 1
    assert_optimizer_states_equal(fresh.optimizer.state_dict(), run.optimizer.state_dict())
    for (name, p), q in zip(
        run.model.state_dict().items(), fresh.model.state_dict().values(), strict=True
    ):
        assert torch.equal(p, q), name


# --- train state and RNG -----------------------------------------------------------------------


def draws() -> tuple:
    return (
        random.random(),
        random.gauss(0, 1),
        tuple(np.random.rand(3)),
        float(np.random.standard_normal()),
        tuple(torch.rand(3).tolist()),
        tuple(torch.randn(2).tolist()),
    )


def test_restore_rng_repeats_every_generators_draws() -> None:
    random.gauss(0, 1)  # leave a cached Gaussian in both Python's and NumPy's state
    np.random.standard_normal()
    state = rng_state_dict()
    first = draws()
    assert draws() != first  # the generators moved on
    load_rng_state_dict(state)
    assert draws() == first


def test_captured_rng_meta_is_json_and_restores_after_a_json_round_trip() -> None:
    meta, tensors = flatten(rng_state_dict(), "rng.")
    text = json.dumps(meta, allow_nan=False)
    first = draws()
    load_rng_state_dict(
        unflatten(json.loads(text), {k: v.clone() for k, v in tensors.items()}, "rng.")
    )
    assert draws() == first
    assert all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in tensors.values())


def test_rng_survives_a_checkpoint_file(tmp_path: Path) -> None:
    meta, tensors = flatten(rng_state_dict(), "rng.")
    path = save_checkpoint(tmp_path, 1, {"rng": meta}, tensors)
    first = draws()
    read, loaded = load_checkpoint(path, file_sha256(path))
    loaded_meta = read.as_written()
    load_rng_state_dict(unflatten(loaded_meta["rng"], loaded, "rng."))
    assert draws() == first


def test_train_state_round_trip() -> None:
    state = TrainState(step=7, tokens=7 * 4096, elapsed=12.5, skipped_steps=1)
    other = TrainState()
    other.load_state_dict(json.loads(json.dumps(state.state_dict())))
    assert other == state
    legacy = {k: v for k, v in state.state_dict().items() if k != "skipped_steps"}
    other.load_state_dict(legacy)
    assert other.skipped_steps == 0


# --- the v1 layout of a run's state ------------------------------------------------------------


def test_flatten_splits_tensors_from_json_and_unflatten_inverts_it() -> None:
    tree = {
        "layers.0.w": torch.ones(2),  # a name with dots of its own stays one entry
        "n": 3,
        "sub": {"a": torch.zeros(1), "b": [1, 2]},
        "only_tensors": {"t": torch.arange(2)},
    }
    meta, tensors = flatten(tree, "p.")
    assert meta == {"n": 3, "sub": {"b": [1, 2]}}  # a dict of tensors only leaves no JSON
    assert sorted(tensors) == ["p.layers.0.w", "p.only_tensors.t", "p.sub.a"]
    flat = unflatten(meta, {"p.layers.0.w": tensors["p.layers.0.w"]}, "p.")
    assert set(flat) == {"layers.0.w", "n", "sub"}
    deep = unflatten(meta, {k: v for k, v in tensors.items() if "layers" not in k}, "p.", depth=2)
    assert torch.equal(deep["sub"]["a"], torch.zeros(1)) and deep["sub"]["b"] == [1, 2]
    assert torch.equal(deep["only_tensors"]["t"], torch.arange(2))


def test_a_runs_state_packs_into_the_v1_names_and_unpacks_to_itself(saved_run) -> None:
    run, path = saved_run
    state = run.state_dict()
    meta, tensors = pack(state)
    # The names every octlm since 0.1 writes and reads (tests/golden holds such a file).
    assert {k.split(".", 1)[0] for k in tensors} == {"model", "optim", "rng"}
    assert set(meta) == {
        "train_state", "sampler", "optimizer", "scaler", "rng", "fingerprints", "trajectory",
        "config", "model_config", "data_dir", "build", "world", "rng_ranks",
    }  # fmt: skip
    assert meta["rng_ranks"] == [] and "torch_cpu" not in meta["rng"]
    assert sorted(meta["optimizer"]) == ["param_groups", "scalars"]
    back = unpack(json.loads(json.dumps(meta)), tensors)
    assert back["train_state"] == state["train_state"] and back["sampler"] == json.loads(
        json.dumps(state["sampler"])
    )
    assert_optimizer_states_equal(back["optimizer"], state["optimizer"])
    assert all(torch.equal(back["model"][k], v) for k, v in state["model"].items())
    assert torch.equal(back["rng"][0]["torch_cpu"], state["rng"][0]["torch_cpu"])
    # And the file on disk holds exactly the packed names.
    _, loaded = load_checkpoint(path, None)
    assert sorted(loaded) == sorted(tensors)


def test_golden_v1_checkpoint_unpacks_and_repacks_to_the_same_entries() -> None:
    golden = Path(__file__).parents[1] / "golden" / "v1-micro" / "run"
    read, tensors = load_checkpoint(*find_checkpoint(golden))
    meta = read.as_written()
    again_meta, again = pack(unpack(meta, tensors))
    assert sorted(again) == sorted(tensors)
    assert all(torch.equal(again[k], tensors[k]) for k in tensors)
    assert json.loads(json.dumps(again_meta)) == {
        k: v for k, v in meta.items() if k not in ("format", "format_version")
    }


def test_a_files_metadata_is_parsed_once_into_fields_and_handed_out_as_a_copy() -> None:
    parts = [{"file": "/m/step_000002.safetensors"}, {"file": "/m/step_000004.safetensors"}]
    meta = {"train_state": {"step": 4}, "merged_from": parts}  # a merge's snapshot header
    info = parse_info(Path("model.safetensors"), meta)
    assert (info.step, info.world, info.config, info.fingerprints) == (4, 1, None, {})
    assert info.merged_from == (Path(parts[0]["file"]), Path(parts[1]["file"]))
    written = info.as_written()
    written["train_state"]["step"] = 9  # the caller's copy: the view keeps what the file says
    assert info.as_written() == meta and info.step == 4
    with pytest.raises(CheckpointError, match="bad.safetensors has corrupt octlm metadata"):
        parse_info(Path("bad.safetensors"), {"world": "two"})
