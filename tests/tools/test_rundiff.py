"""`octlm diff`: the first step where two logs part (the step and the field), a divergence seen
only in the weights hash, identical runs, runs with no common step, and logs a kill or a bad
disk left damaged (read as far as they are readable, never a traceback)."""

from __future__ import annotations

from pathlib import Path

from octlm.runlog.reader import read_log
from octlm.runlog.writer import RunLog
from octlm.tools.rundiff import diff_folders, diff_runs, format_diff
from tests.cli_in_process import main
from tests.tools.helpers import CUT_LINE, GARBAGE_LINE, append_line, insert_line, write_log


def test_identical_runs_match_on_every_step(tmp_path: Path) -> None:
    a, b = write_log(tmp_path / "a"), write_log(tmp_path / "b")
    result = diff_runs(read_log(a), read_log(b))
    assert result.first is None and result.details == [] and result.max_loss_diff == 0.0
    assert (result.common_steps, result.steps_a, result.steps_b) == (6, 6, 6)
    assert format_diff(result, "a", "b") == [
        "match: 6 common steps identical (loss, grad_norm, hashes)"
    ]


def test_the_first_divergence_is_reported_at_its_step_and_field(tmp_path: Path) -> None:
    a = write_log(tmp_path / "a")
    b = write_log(tmp_path / "b", losses={4: 4.6 + 1e-7, 6: 9.0}, hashes={4: "f" * 64})
    result = diff_runs(read_log(a), read_log(b))
    assert (result.first.step, result.first.field) == (4, "loss")
    assert (result.first.a, result.first.b) == (4.6, 4.6 + 1e-7)
    assert [d.field for d in result.details] == ["loss", "weights_sha256"]  # all of step 4
    assert result.max_loss_diff == abs(9.0 - 4.4)  # over every common step, not the first
    lines = format_diff(result, "a", "b")
    assert lines[0] == "the runs part at step 4:"
    assert lines[1].split()[:4] == ["loss", "4.6", "vs", repr(4.6 + 1e-7)]


def test_a_divergence_only_in_the_weights_hash_is_found(tmp_path: Path) -> None:
    a = write_log(tmp_path / "a")
    b = write_log(tmp_path / "b", hashes={2: "e" * 64})
    result = diff_runs(read_log(a), read_log(b))
    assert (result.first.step, result.first.field) == (2, "weights_sha256")
    assert result.max_loss_diff == 0.0
    # The end record's hash stands for the last step.
    c = write_log(tmp_path / "c", hashes={6: "d" * 64})
    result = diff_runs(read_log(a), read_log(c))
    first = result.first
    assert (first.step, first.field, first.b) == (6, "weights_sha256", "d" * 64)


def test_runs_with_no_common_step_do_not_match(tmp_path: Path, capsys) -> None:
    a = write_log(tmp_path / "a", steps=3)
    b = write_log(tmp_path / "b", steps=6, first=4)
    assert diff_runs(read_log(a), read_log(b)).common_steps == 0
    lines, same = diff_folders(a, b)
    assert lines == [f"{a} and {b} share no step"] and not same
    assert main(["diff", str(a), str(b)]) == 1


def test_a_shorter_run_matches_on_the_steps_both_logged(tmp_path: Path) -> None:
    a, b = write_log(tmp_path / "a"), write_log(tmp_path / "b", steps=4, end=False)
    lines, same = diff_folders(a, b)
    assert same and lines == [
        "match: 4 common steps identical (loss, grad_norm, hashes)",
        f"note: {a} logged 6 steps, {b} 4",
    ]


def test_a_log_cut_by_a_kill_or_garbled_mid_file_is_compared_on_what_is_readable(
    tmp_path: Path, capsys
) -> None:
    a, b = write_log(tmp_path / "a"), write_log(tmp_path / "b")
    append_line(a, CUT_LINE, newline=False)  # killed mid-line
    insert_line(b, 4, GARBAGE_LINE)
    insert_line(b, 6, '{"type": "step", "loss": 1.0}')  # parses, but no step: not a step record
    assert main(["diff", str(a), str(b)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        "match: 6 common steps identical (loss, grad_norm, hashes)",
        f"note: {a} has 1 unreadable line(s), skipped",
        f"note: {b} has 1 unreadable line(s), skipped",
    ]


def test_a_missing_log_is_one_error_line(tmp_path: Path, capsys) -> None:
    a = write_log(tmp_path / "a")
    assert main(["diff", str(a), str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"octlm: error: no run log at {tmp_path / 'nope'}")


def _digests(run: Path, grads: dict[int, dict[str, str]], weights: dict[int, dict[str, str]]):
    """Append a `tensors` record for steps 1..6: every digest "0"s, but the ones given."""
    log = RunLog(run)
    log.open()
    names = ["emb", "l0", "l1", "head"]  # the model's parameter order
    for n in range(1, 7):
        g = {name: grads.get(n, {}).get(name, "0" * 16) for name in names}
        w = {name: weights.get(n, {}).get(name, "0" * 16) for name in names}
        log.tensor_digests(n, w, g)
    log.close()


def test_the_first_tensor_is_the_first_differing_gradient_in_backward_order(tmp_path) -> None:
    a, b = write_log(tmp_path / "a"), write_log(tmp_path / "b", losses={4: 9.0})
    _digests(a, {}, {})
    _digests(b, {3: {"l0": "1" * 16, "l1": "1" * 16}}, {3: {"l0": "2" * 16, "emb": "2" * 16}})
    lines, same = diff_folders(a, b)
    assert not same and lines[0] == "the runs part at step 3:"
    assert lines[1] == "  tensors        2 gradient(s), 2 weight(s)"
    assert lines[3:6] == [
        "step 3: l1's gradient differs first; the loss matched",  # l1 is computed before l0
        "  gradients that differ (backward order): l1, l0",
        "  weights that differ: emb, l0",
    ]


def test_with_every_gradient_equal_the_first_differing_weight_is_named(tmp_path) -> None:
    a, b = write_log(tmp_path / "a"), write_log(tmp_path / "b", losses={2: 9.0})
    _digests(a, {}, {})
    _digests(b, {}, {2: {"head": "2" * 16, "l1": "2" * 16}})
    lines, _ = diff_folders(a, b)
    want = "step 2: l1's weights differ first (every gradient matched); the loss differed too"
    assert want in lines and "  gradients that differ (backward order): none" in lines


def test_without_digests_a_parting_hints_at_hash_tensors(tmp_path) -> None:
    a, b = write_log(tmp_path / "a"), write_log(tmp_path / "b", losses={4: 9.0})
    lines, _ = diff_folders(a, b)
    assert lines[-1] == "  hint: run both with --hash-tensors --hash-every 1 to name the tensor"
