"""Bad input at the doors that name an output or a measurement (`merge`, `export`, `plot`,
`report`, `playground`, `bench peak`, the profile's OUT/profile/, the RoPE base) and long
values: one stderr line `octlm: error: PROBLEM; FIX`, a non-zero exit, no traceback, and nothing
on disk changed (the run folder byte for byte as it was, nothing new appears). In-process
through `octlm.cli.main.main`, as tests/test_bad_input.py; the faults (a damaged checkpoint, a
non-finite tensor, a write that fails) are caused on purpose at a chosen point.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tests.cli_in_process import main
from tests.test_bad_input import TINY, tree

LONG = "x" * 16_000
MERGE = ["merge", "a.safetensors", "b.safetensors"]

# (arguments; what the error line must say): refused before any checkpoint is read, so the
# checkpoint files may be stand-ins
MERGE_ARGS = {
    "weight_nan": ([*MERGE, "--weights", "nan,1", "-o", "m"], "--weights nan: each must be"),
    "weight_inf": ([*MERGE, "--weights", "1,inf", "-o", "m"], "--weights inf: each must be"),
    "weight_negative": ([*MERGE, "--weights", "1,-1", "-o", "m"], "--weights -1.0: each must"),
    "weight_zero": ([*MERGE, "--weights", "0,1", "-o", "m"], "--weights 0.0: each must be"),
    "weights_all_zero": ([*MERGE, "--weights", "0,0", "-o", "m"], "each must be a finite"),
    "weights_overflow": ([*MERGE, "--weights", "1e308,1e308", "-o", "m"], "from 1e-06 to 1e+06"),
    "weight_vanishes": ([*MERGE, "--weights", "1e6,0.5", "-o", "m"], "under a millionth"),
    "weight_denormal": ([*MERGE, "--weights", "1e-320,1e-320", "-o", "m"], "--weights 1e-320:"),
    "weights_count": ([*MERGE, "--weights", "1,2,3", "-o", "m"], "3 weight(s) for 2 checkp"),
    "weights_not_numbers": ([*MERGE, "--weights", "a,b", "-o", "m"], "is not a list of numbers"),
    "last_zero": (["merge", "run", "--last", "0", "-o", "m"], "--last 0 must be an integer"),
    "last_negative": (["merge", "run", "--last", "-3", "-o", "m"], "--last -3 must be an"),
    "last_huge": (["merge", "run", "--last", str(10**30), "-o", "m"], "must be an integer from 2"),
    "last_more_than_kept": (["merge", "run", "--last", "1000", "-o", "m"], "fewer than --last"),
    "out_the_run": ([*MERGE, "-o", "run"], "-o run is a run folder"),
    "out_the_run_forced": ([*MERGE, "-o", "run", "--force"], "-o run is a run folder"),
    "out_inside_the_run": ([*MERGE, "-o", "run/merged"], "is inside the run folder"),
    "out_inside_checkpoints": ([*MERGE, "-o", "run/checkpoints/m"], "inside the run folder"),
    "out_not_empty": ([*MERGE, "-o", "busy"], "-o busy already exists and is not empty"),
    "out_not_a_merge_forced": ([*MERGE, "-o", "busy", "--force"], "was not written by this"),
    "out_a_file": ([*MERGE, "-o", "a.safetensors"], "-o a.safetensors is a file"),
    "out_under_a_file": ([*MERGE, "-o", "a.safetensors/m"], "lies under a.safetensors, which"),
    "eval_batches_negative": ([*MERGE, "-o", "m", "--eval-batches", "-1"], "--eval-batches -1"),
}

EXPORT = {
    "out_the_run": (["export", "run", "run", "--force"], "OUT run is a run folder"),
    "out_inside_the_run": (["export", "run", "run/hf"], "OUT run/hf is inside the run folder"),
    "file_in_the_run": (
        ["export", "run", "run/checkpoints/step_000008.safetensors", "--format", "safetensors"],
        "is inside the run folder",
    ),
    "out_not_empty": (["export", "run", "busy"], "OUT busy already exists and is not empty"),
    "out_a_file_hf": (["export", "run", "a.safetensors"], "is a file; name a folder for --f"),
    "out_a_file_plain": (["export", "run", "tok.json", "--format", "safetensors"], "is a file"),
    "file_exists": (
        ["export", "run", "a.safetensors", "--format", "safetensors"],
        "a.safetensors already exists and is not empty",
    ),
    "file_is_a_folder": (["export", "run", "d.safetensors", "--format", "safetensors"], "folder"),
    "out_under_a_file": (["export", "run", "tok.json/hf"], "lies under tok.json, which is a f"),
}

PAGES = {
    "plot_out_a_folder": (["plot", "run", "-o", "busy"], "busy is a folder; name a file"),
    "plot_out_not_an_image": (["plot", "run", "-o", "loss.txt"], "ends in '.txt', a format"),
    "plot_over_the_log": (["plot", "run", "-o", "run/log.jsonl"], "ends in '.jsonl'"),
    "plot_under_a_file": (["plot", "run", "-o", "tok.json/p.png"], "lies under tok.json"),
    "report_out_a_folder": (["report", "run", "-o", "busy"], "busy is a folder"),
    "report_over_the_log": (["report", "run", "-o", "run/log.jsonl"], "is not an HTML page"),
    "report_under_a_file": (["report", "run", "-o", "tok.json/r.html"], "lies under tok.json"),
    "playground_out_a_folder": (["playground", "-o", "run"], "run is a folder"),
    "playground_over_a_file": (["playground", "-o", "tok.json"], "is not an HTML page"),
}

PEAK = {
    "seconds_nan": (["--seconds", "nan"], "--seconds nan must be a number in (0, 3600]"),
    "seconds_inf": (["--seconds", "inf"], "--seconds inf must be a number in (0, 3600]"),
    "seconds_negative": (["--seconds", "-1"], "--seconds -1.0 must be a number in (0, 3600]"),
    "seconds_zero": (["--seconds", "0"], "--seconds 0.0 must be a number in (0, 3600]"),
    "seconds_negative_zero": (["--seconds=-0.0"], "--seconds -0.0 must be a number in (0,"),
    "seconds_a_day": (["--seconds", "86400"], "--seconds 86400.0 must be a number in (0, 3600]"),
    "seconds_huge": (["--seconds", "1e308"], "--seconds 1e+308 must be a number in (0, 3600]"),
    "dtype_unknown": (["--dtype", "fp8"], "invalid choice: 'fp8'"),
    "device_unknown": (["--device", "tpu"], "invalid choice: 'tpu'"),
}

# Train flags, with a profile folder that cannot be written (`fresh/` holds what the case says)
PROFILE = {
    "profile_a_file": (["--profile-steps", "1:2"], "profile", "which is a file"),
    "snapshot_profile_a_file": (["--memory-snapshot"], "profile", "which is a file"),
    "trace_a_folder": (["--profile-steps", "1:2"], "profile/trace.json/", "which is a folder"),
    "ops_a_folder": (["--profile-steps", "2:3"], "profile/ops.txt/", "ops.txt, which is a fol"),
    "out_under_a_file": (["--profile-steps", "1:2", "--out", "tok.json/r"], None, "a file"),
}

ROPE = {
    "tiny": ("1e-30", "--rope-base 1e-30 must be a number in [2, 1e+30]"),
    "denormal": ("1e-320", "--rope-base 1e-320 must be a number in [2, 1e+30]"),
    "below_one": ("0.5", "--rope-base 0.5 must be a number in [2, 1e+30]"),
    "one": ("1", "--rope-base 1.0 must be a number in [2, 1e+30]"),
    "near_one": ("1.0001", "RoPE's frequencies base^(-2i/d) must fall"),
    "past_float32": ("1e31", "--rope-base 1e+31 must be a number in [2, 1e+30]"),
    "zero": ("0", "--rope-base 0.0 must be a finite number > 0"),
}

LONG_VALUES = {
    "merge_weights": ([*MERGE, "--weights", LONG, "-o", "m"], "--weights 'xxxx"),
    "merge_out_long": ([*MERGE, "-o", "tok.json/" + LONG], "File name too long"),
    "merge_run": (["merge", "r" * 16_000, "--last", "2", "-o", "m"], "'rrrr"),
    "profile_steps": (["train", *TINY, "--profile-steps", "9" * 16_000], "--profile-steps '9999"),
    "plot_suffix": (["plot", "run", "-o", "p." + LONG], "File name too long: 'p.xxxx"),
    "plot_long_suffix": (["plot", "run", "-o", "p." + "x" * 200], "ends in '.xxxx"),
    "report_long": (["report", "run", "-o", "tok.json/" + LONG], "File name too long"),
    "report_under_a_file": (["report", "run", "-o", "tok.json/" + "x/" * 400], "under tok.json"),
    "export_format": (["export", "run", "tok.json/" + "y" * 16_000], "'tok.json/yyyy"),
    "out_newline": ([*MERGE, "-o", "busy\n/m", "--weights", "1,0"], "--weights 0.0"),
}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    """The current folder of each case: a run folder (a log, a listed checkpoint), a busy
    folder, stand-in checkpoint files, a file where a folder could be."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    header = {"type": "header", "config": {}}
    (tmp_path / "run" / "log.jsonl").write_text(json.dumps(header) + "\n")
    (tmp_path / "run" / "checkpoints" / "step_000008.safetensors").write_bytes(b"weights")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("keep me")
    (tmp_path / "d.safetensors").mkdir()
    for name in ("a.safetensors", "b.safetensors"):
        (tmp_path / name).write_bytes(b"stand-in")
    (tmp_path / "tok.json").write_text("{}")
    return tmp_path


def assert_refused(args: list[str], expected: str, root: Path, capsys) -> None:
    """One `octlm: error:` line naming `expected`, a non-zero exit (argparse's 2 included), no
    traceback, the tree as it was."""
    before = tree(root)
    try:
        code = main(args)
    except SystemExit as exc:  # argparse: its usage line, then the one error line
        code = exc.code
    out, err = capsys.readouterr()
    assert code not in (0, None), out
    lines = [line for line in err.splitlines() if not line.startswith("usage:")]
    assert len(lines) == 1 and "Traceback" not in err, err[:2000]
    assert lines[0].startswith("octlm: error: ") and expected in lines[0], lines[0][:2000]
    assert "; " in lines[0] and len(lines[0]) <= 600, lines[0][:2000]
    assert tree(root) == before  # nothing written, nothing lost


OUTPUTS = {
    f"{kind}-{name}": case
    for kind, table in (("merge", MERGE_ARGS), ("export", EXPORT), ("pages", PAGES))
    for name, case in table.items()
}
OUTPUTS.update({f"long-{name}": case for name, case in LONG_VALUES.items()})


@pytest.mark.parametrize("case", OUTPUTS, ids=OUTPUTS)
def test_a_bad_output_or_merge_is_one_line(case, workdir, capsys) -> None:
    args, expected = OUTPUTS[case]
    assert_refused(args, expected, workdir, capsys)


@pytest.mark.parametrize("case", PEAK, ids=PEAK)
def test_a_bad_peak_measurement_is_one_line(case, workdir, capsys) -> None:
    args, expected = PEAK[case]
    assert_refused(["bench", "peak", "--device", "cpu", *args], expected, workdir, capsys)


@pytest.mark.parametrize("case", PROFILE, ids=PROFILE)
def test_an_unwritable_profile_is_refused_before_the_run(case, workdir, capsys) -> None:
    flags, blocker, expected = PROFILE[case]
    if blocker is not None:  # a file, or a folder where a file goes ("name/")
        path = workdir / "fresh" / blocker
        path.mkdir(parents=True) if blocker.endswith("/") else path.parent.mkdir(parents=True)
        if not blocker.endswith("/"):
            path.write_text("not a folder")
    for command in (["train", "--out", "fresh"], ["train", "--out", "fresh", "--print-config"]):
        assert_refused([*command, *TINY, *flags], expected, workdir, capsys)


@pytest.mark.parametrize("case", ROPE, ids=ROPE)
def test_a_rope_base_that_cannot_rotate_is_one_line(case, workdir, capsys) -> None:
    value, expected = ROPE[case]
    for command in (["train", "--out", "new"], ["train", "--print-config"]):
        assert_refused([*command, *TINY, "--rope-base", value], expected, workdir, capsys)


def test_a_shipped_rope_base_still_trains(workdir, capsys) -> None:
    for value in ("2", "1024", "10000", "500000", "1e8"):
        assert main(["train", *TINY, "--rope-base", value, "--print-config"]) == 0
    capsys.readouterr()


# A real run's checkpoints: the faults are caused at a chosen point of the merge and export.
KEEP = ("--ckpt-every", "2", "--keep-ckpts")


@pytest.fixture
def trained(straight_run, workdir) -> Path:
    shutil.copytree(straight_run(*KEEP), workdir / "trained")
    return workdir / "trained"


def poisoned(snapshot: Path, out: Path) -> Path:
    """A copy of `snapshot` with one weight NaN (snapshots carry no checksum: it loads)."""
    with safe_open(str(snapshot), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        metadata = f.metadata()
    name = next(n for n, t in tensors.items() if t.is_floating_point() and "weight" in n)
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[3] = float("nan")
    save_file(tensors, str(out), metadata=metadata)
    return out


@pytest.mark.slow
def test_merge_faults_write_nothing(trained, workdir, capsys, monkeypatch) -> None:
    snaps = sorted((trained / "snapshots").glob("step_*.safetensors"))
    bad = poisoned(snaps[-1], workdir / "nan.safetensors")
    assert_refused(
        ["merge", str(snaps[0]), str(bad), "-o", "m"], "holds NaN or inf", workdir, capsys
    )
    # A listed checkpoint damaged past its first tensors: its checksum no longer matches.
    listed = sorted((trained / "checkpoints").glob("step_*.safetensors"))[-1]
    data = bytearray(listed.read_bytes())
    data[len(data) // 2] ^= 0xFF
    listed.write_bytes(bytes(data))
    assert_refused(["merge", "trained", "--last", "2", "-o", "m"], "checksum", workdir, capsys)
    # A write that fails halfway (a full disk) leaves no folder, and no staging, behind.
    import safetensors.torch

    def full_disk(*args, **kwargs) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    args = ["merge", str(snaps[0]), str(snaps[1]), "-o", "m", "--eval-batches", "0"]
    assert_refused(args, "No space left on device", workdir, capsys)
    assert_refused([*args[:3], "-o", "busy", "--force"], "was not written by", workdir, capsys)


@pytest.mark.slow
def test_export_of_non_finite_weights_writes_nothing(trained, workdir, capsys) -> None:
    snap = sorted((trained / "snapshots").glob("step_*.safetensors"))[-1]
    bad = poisoned(snap, workdir / "nan.safetensors")
    for fmt in ("hf", "safetensors"):
        args = ["export", str(bad), "out", "--format", fmt]
        assert_refused(args, "holds NaN or inf values; nothing was written", workdir, capsys)


@pytest.mark.slow
def test_merge_force_replaces_only_an_earlier_merge(trained, workdir, capsys) -> None:
    snaps = [str(p) for p in sorted((trained / "snapshots").glob("step_*.safetensors"))]
    args = ["merge", *snaps[:2], "-o", "m", "--eval-batches", "0"]
    assert main(args) == 0
    first = (workdir / "m" / "merge.json").read_bytes()
    assert_refused(args, "-o m already exists and is not empty", workdir, capsys)
    assert main([*args, "--weights", "1,3", "--force"]) == 0
    assert (workdir / "m" / "merge.json").read_bytes() != first
    assert not [p for p in workdir.iterdir() if p.name.startswith(".")]  # no staging left
    merged = safe_open(str(workdir / "m" / "model.safetensors"), framework="pt")
    assert all(torch.isfinite(merged.get_tensor(n)).all() for n in merged.keys())  # noqa: SIM118
