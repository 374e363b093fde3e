"""Bad input at every door of the commands that take settings (`train`, `sweep`, `prepare`,
`tokenizer train`): one stderr line `octlm: error: ...` naming the value and what it may be, a
non-zero exit, no traceback, and nothing on disk changed (an existing run folder, sweep folder
and dataset stay byte for byte as they were, and nothing new appears). In-process through
`octlm.cli.main.main`; tests/test_cli_data.py runs a few of the data ones as real processes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cli_in_process import main

TINY = ("--model", "tiny", "--context", "32", "--steps", "4", "--warmup", "1")
HUGE = str(10**30)
MAX_INT = "2**53 - 1"

# (arguments after `octlm train` / the TOML text; what the error line must say)
TRAIN_FLAGS = {
    "lr_nan": (["--lr", "nan"], "--lr nan must be a finite number > 0"),
    "lr_inf": (["--lr", "inf"], "--lr inf must be a finite number > 0"),
    "lr_negative_zero": (["--lr", "-0.0"], "--lr -0.0 must be a finite number > 0"),
    "beta1_nan": (["--beta1", "nan"], "--beta1 nan must be a number in [0, 1)"),
    "beta2_one": (["--beta2", "1"], "--beta2 1.0 must be a number in [0, 1)"),
    "eps_inf": (["--eps", "inf"], "--eps inf must be a finite number > 0"),
    "eps_zero": (["--eps", "0"], "--eps 0.0 must be a finite number > 0"),
    "weight_decay_inf": (
        ["--weight-decay", "inf"],
        "--weight-decay inf must be a finite number >= 0",
    ),
    "weight_decay_negative": (["--weight-decay", "-0.1"], "--weight-decay -0.1 must be a finite"),
    "grad_clip_inf": (["--grad-clip", "inf"], "--grad-clip inf must be a finite number >= 0"),
    "dropout_nan": (["--dropout", "nan"], "--dropout nan must be a number in [0, 1)"),
    "min_lr_ratio_nan": (
        ["--min-lr-ratio", "nan"],
        "--min-lr-ratio nan must be a number in [0, 1]",
    ),
    "dist_timeout_zero": (
        ["--dist-timeout", "0"],
        "--dist-timeout 0.0 must be a number in (0, 604800]",
    ),
    "dist_timeout_nan": (["--dist-timeout", "nan"], "--dist-timeout nan must be a number in (0,"),
    "dist_timeout_year": (["--dist-timeout", "31536000"], "must be a number in (0, 604800]"),
    "peak_tflops_inf": (["--peak-tflops", "inf"], "--peak-tflops inf must be a finite number > 0"),
    "seed_negative": (["--seed", "-1"], f"--seed -1 must be an integer from 0 to {MAX_INT}"),
    "seed_2_64": (["--seed", str(2**64)], f"--seed {2**64} must be an integer from 0 to {MAX_INT}"),
    "steps_huge": (["--steps", HUGE], f"--steps {HUGE} must be an integer from 1 to {MAX_INT}"),
    "micro_batch_huge": (["--micro-batch", HUGE], f"--micro-batch {HUGE} must be an integer"),
    "accum_zero": (["--accum", "0"], f"--accum 0 must be an integer from 1 to {MAX_INT}"),
    "val_batches_zero": (["--val-batches", "0"], "--val-batches 0 must be an integer from 1 to"),
    "val_every_huge": (["--val-every", HUGE], f"--val-every {HUGE} must be an integer from 0"),
    "ckpt_every_negative": (["--ckpt-every", "-1"], "--ckpt-every -1 must be an integer from 0"),
    "keep_last_huge": (["--keep-last", HUGE], f"--keep-last {HUGE} must be an integer from 1"),
    "hash_every_negative": (["--hash-every", "-1"], "--hash-every -1 must be an integer from 0"),
    "eval_tasks_every_off_the_validations": (
        ["--val-every", "20", "--eval-tasks-every", "30"],
        "--eval-tasks-every 30 is not a multiple of --val-every 20; tasks are scored at",
    ),
    "overfit_blocks_huge": (["--overfit-blocks", HUGE], "--overfit-blocks 1000000000000000000000"),
    "stop_at_zero": (["--stop-at", "0"], "--stop-at 0 must be an integer from 1"),
    "warmup_huge": (["--warmup", HUGE], f"--warmup {HUGE} must be an integer from 0"),
    "out_empty": (["--out", ""], "--out '' must be a non-empty path"),
    "data_empty": (["--data", ""], "--data '' must be a non-empty path"),
    "init_from_empty": (["--init-from", ""], "--init-from '' must be a non-empty path"),
    "blocks_blank": (["--blocks", "  "], "--blocks '  ' must be a non-empty path"),
    "device_empty": (["--device", ""], "--device '' must be a non-empty string"),
    "device_unknown": (["--device", "tpu"], "--device 'tpu' is unknown; use cpu, cuda, cuda:N"),
    "model_unicode": (["--model", "tïny"], "--model 'tïny' is unknown"),
    "n_layers_million": (
        ["--n-layers", "1000000"],
        "parameters x 16 bytes (ddp) and",
    ),
    "d_model_huge": (["--d-model", str(2**40), "--n-heads", "8", "--n-kv-heads", "8"], "at least"),
    "rope_base_huge_int": (["--rope-base", "1e400"], "--rope-base inf must be a finite number > 0"),
    "init_std_above_one": (["--init-std", "2"], "--init-std 2.0 must be a number in (0, 1]"),
    "norm_eps_zero": (["--norm-eps", "-0.0"], "--norm-eps -0.0 must be a number in (0, 1]"),
    "micro_batch_beyond_memory": (
        ["--micro-batch", str(2**40)],
        "of activations for --micro-batch 1099511627776 x context 32",
    ),
    "config_empty": (["--config", ""], "--config '' must be a non-empty path"),
    "requeue_exit_code_256": (["--requeue-exit-code", "256"], "--requeue-exit-code 256 must be"),
    "requeue_exit_code_zero": (["--requeue-exit-code", "0"], "0 reads as success"),
    "nproc_fork_bomb": (["--nproc", "100000"], "--nproc 100000 must be an integer from 1 to"),
    "out_a_file": (["--out", "tok.json"], "--out tok.json is a file; name a folder"),
    "optimizer_unknown": (["--optimizer", "sgd"], "--optimizer 'sgd' is unknown; use one of"),
    "muon_lr_zero": (["--optimizer", "muon", "--muon-lr", "0"], "--muon-lr 0.0 must be a number"),
    "muon_lr_without_muon": (["--muon-lr", "0.05"], "--muon-lr is for --optimizer muon, not adamw"),
    "muon_momentum_one": (
        ["--optimizer", "muon", "--muon-momentum", "1"],
        "--muon-momentum 1.0 must be a number in [0, 1)",
    ),
    "muon_gram_without_muon": (["--muon-gram"], "--muon-gram is for --optimizer muon, not adamw"),
    "muon_ns_dtype_unknown": (
        ["--optimizer", "muon", "--muon-ns-dtype", "fp16"],
        "--muon-ns-dtype 'fp16' is unknown; use one of ('auto', 'fast', 'fp32', 'bf16')",
    ),
    "muon_ns_dtype_without_muon": (
        ["--muon-ns-dtype", "bf16"],
        "--muon-ns-dtype is for --optimizer muon, not adamw",
    ),
    "softcap_negative": (["--logit-softcap", "-1"], "--logit-softcap -1.0 must be a number in [0,"),
    "softcap_below_one": (["--logit-softcap", "0.5"], "squashes every logit into (-1, 1)"),
    "softcap_nan": (["--logit-softcap", "nan"], "--logit-softcap nan must be a number in [0,"),
    "z_loss_inf": (["--z-loss", "inf"], "--z-loss inf must be a number in [0, 1]"),
    "z_loss_negative": (["--z-loss=-1e-4"], "--z-loss -0.0001 must be a number in [0, 1]"),
    "deterministic_parts_unknown": (
        ["--deterministic-parts", "algorithms,cudnn"],
        "--deterministic-parts 'algorithms,cudnn' names unknown part(s) cudnn; use a",
    ),
    "deterministic_parts_blank": (
        ["--deterministic-parts", ","],
        "--deterministic-parts ',' names no part; use a comma-separated list of algorithms,",
    ),
    "deterministic_parts_beside_deterministic": (
        ["--deterministic", "--deterministic-parts", "attention"],
        "--deterministic is every part already; --deterministic-parts 'attention' names some",
    ),
    "deterministic_parts_all": (
        ["--deterministic-parts", "inductor,attention,algorithms"],
        "names every part; pass --deterministic instead",
    ),
}

TRAIN_TOML = {
    "string_for_int": ('steps = "10"', "steps='10' must be an integer from 1"),
    "bool_for_int": ("steps = true", "steps=True must be an integer from 1"),
    "float_for_int": ("steps = 10.0", "steps=10.0 must be an integer from 1"),
    "list_for_int": ("steps = [10]", "steps=[10] must be an integer"),
    "table_for_int": ("[steps]\nx = 1", "steps={'x': 1} must be an integer"),
    "array_of_tables": ("[[accum]]\nx = 1", "accum=[{'x': 1}] must be an integer"),
    "date_for_int": ("seed = 1979-05-27", "seed=datetime.date(1979, 5, 27) must be an integer"),
    "bool_for_float": ("lr = true", "lr=True must be a finite number > 0"),
    "string_for_float": ('lr = "1e-3"', "lr='1e-3' must be a finite number > 0"),
    "toml_nan": ("lr = nan", "lr=nan must be a finite number > 0"),
    "toml_inf": ("grad_clip = inf", "grad_clip=inf must be a finite number >= 0"),
    "toml_negative_inf": ("weight_decay = -inf", "weight_decay=-inf must be a finite"),
    "int_past_float": (f"eps = {10**400}", f"eps={'1' + '0' * 56}... must be a finite number"),
    "string_for_bool": ('compile = "yes"', "compile='yes' must be true or false"),
    "int_for_bool": ("fused = 0", "fused=0 must be true or false"),
    "string_for_optional_bool": ('progress = "no"', "progress='no' must be true or false"),
    "list_for_str": ('dtype = ["bf16"]', "dtype=['bf16'] must be a non-empty string"),
    "int_for_str": ("log_to = 5", "log_to=5 must be a non-empty string"),
    "nul_in_path": ('data = "a\\u0000b"', "data='a\\x00b' must be a non-empty path"),
    "unknown_key": ("learning_rate = 1e-3", "unknown key(s) learning_rate"),
    "misspelt_key": ("warm_up = 3", "unknown key(s) warm_up (did you mean warmup?)"),
    "sweep_table_in_train": ("[sweep]\nrepeats = 2", "unknown key(s) sweep"),
    "not_toml": ("steps = = 3", "is not valid TOML"),
    "shape_float_for_int": ("n_layers = 2.0", "n_layers=2.0 must be an integer from 1"),
    "string_for_qk_norm": ('qk_norm = "yes"', "qk_norm='yes' must be true or false"),
    "int_for_zero_init": ("zero_init_residual = 1", "zero_init_residual=1 must be true or false"),
    "int_for_value_residual": ("value_residual = 0", "value_residual=0 must be true or false"),
    "string_for_muon_gram": ('muon_gram = "yes"', "muon_gram='yes' must be true or false"),
    "bool_for_muon_ns_dtype": ("muon_ns_dtype = true", "muon_ns_dtype=True must be a non-empty"),
    "bool_for_softcap": ("logit_softcap = true", "logit_softcap=True must be a number in [0,"),
    "string_for_optimizer": ("optimizer = 1", "optimizer=1 must be a non-empty string"),
}

SWEEP = {
    # (flags after `octlm sweep ... --out sw`; the [sweep] table or None; the error line)
    "grid_not_a_table": ([], "grid = 5", "[sweep] grid = 5 must be a table of lists"),
    "grid_value_not_a_list": ([], "grid = { lr = 1e-3 }", "grid.lr = 0.001 must be a non-empty"),
    "grid_empty_list": ([], "grid = { lr = [] }", "[sweep] grid.lr = [] must be a non-empty list"),
    "grid_empty_table": ([], "grid = {}", "[sweep] grid = {} must be a table of lists"),
    "grid_mixed_types": ([], 'grid = { lr = [1e-3, "3e-3"] }', "lr = '3e-3' must be a number"),
    "grid_bool_for_int": ([], "grid = { warmup = [true] }", "warmup = True must be an integer"),
    "grid_string_for_bool": ([], 'grid = { fused = ["true"] }', "fused = 'true' must be true or"),
    "grid_nested_list": ([], "grid = { lr = [[1e-3]] }", "lr = [0.001] must be a number"),
    "grid_nested_table": ([], "grid = { lr = { a = 1 } }", "grid.lr = {'a': 1} must be a non-e"),
    "grid_unknown_key": ([], "grid = { bogus = [1] }", "unknown setting 'bogus' in a sweep"),
    "grid_not_sweepable": ([], 'grid = { out = ["a"] }', "'out' cannot be swept"),
    "grid_nan": ([], "grid = { lr = [nan] }", "lr=nan must be a finite number > 0"),
    "grid_duplicate_values": ([], "grid = { lr = [1e-3, 0.001] }", "are both lr=0.001-r0"),
    "sets_not_a_list": ([], "sets = { lr = 1e-3 }", "[sweep] sets = {'lr': 0.001} must be a non"),
    "sets_of_numbers": ([], "sets = [1]", "[sweep] sets = [1] must be a non-empty list of tables"),
    "sets_empty": ([], "sets = []", "[sweep] sets = [] must be a non-empty list of tables"),
    "sets_unknown_key": ([], "sets = [{ bogus = 1 }]", "unknown setting 'bogus' in a sweep"),
    "repeats_string": (
        [],
        'repeats = "2"',
        "[sweep] repeats='2' must be an integer from 1 to 10000",
    ),
    "repeats_float": ([], "repeats = 2.5", "[sweep] repeats=2.5 must be an integer from 1"),
    "repeats_bool": ([], "repeats = true", "[sweep] repeats=True must be an integer from 1"),
    "repeats_huge": ([], f"repeats = {10**21}", "repeats=1000000000000000000000 must be an"),
    "unknown_sweep_key": ([], "repeat = 2", "unknown [sweep] key(s) repeat"),
    "sweep_not_a_table": ([], None, "sweep = 5 must be a table"),
    "jobs_zero": (["--jobs", "0"], "", "--jobs 0 must be an integer from 1 to"),
    "jobs_negative": (["--jobs", "-3"], "", "--jobs -3 must be an integer from 1 to"),
    "jobs_huge": (["--jobs", "100000"], "", "--jobs 100000 must be an integer from 1 to"),
    "repeats_flag_zero": (["--repeats", "0"], "", "--repeats 0 must be an integer from 1 to 10000"),
    "repeats_flag_huge": (["--repeats", str(10**9)], "", "--repeats 1000000000 must be"),
    "too_many_runs": (
        [
            "--grid",
            "lr=" + ",".join(f"{i}e-5" for i in range(1, 201)),
            "--grid",
            "warmup=" + ",".join(map(str, range(51))),
        ],
        "",
        "the sweep plans 10,200 runs, more than 10,000",
    ),
    "grid_twice": (["--grid", "lr=1e-3", "--grid", "lr=2e-3"], "", "--grid lr is given twice"),
    "set_key_twice": (["--set", "lr=1e-3,lr=2e-3"], "", "lr is given twice"),
    "grid_empty_value": (["--grid", "lr=1e-3,"], "", "lr='' is not a valid float"),
    "grid_no_key": (["--grid", "=1"], "", "unknown setting '' in a sweep"),
    "out_empty": (["--out", ""], "", "--out '' must be a non-empty path"),
    "out_a_file": (["--out", "dataset/manifest.json"], "", "is a file; choose a folder"),
    "base_too_big": (["--n-layers", "1000000"], "", "parameters x 16 bytes"),
}

DOCS = ["prepare", "docs", "--out", "new"]
PAIRS = ["prepare", "pairs.jsonl", "--format", "prompt-completion", "--tokenizer", "tok.json"]
PAIRS += ["--out", "new"]
TOKENIZER = ["tokenizer", "train", "docs", "--out", "t.json"]
BIG = "1000000000000000019884624838656"  # 1e30 read as a whole number
PREPARE = {
    "out_empty": ([*DOCS, "--out", ""], "--out '' must be a non-empty path"),
    "out_current_folder": ([*DOCS, "--out", "."], "--out is the current folder"),
    "input_empty": (["prepare", "", "--out", "new"], "input='' must be a non-empty path"),
    "tokenizer_empty": ([*DOCS, "--tokenizer", ""], "--tokenizer '' must be a non-empty path"),
    "workers_zero": ([*DOCS, "--workers", "0"], "--workers 0 must be an integer from 1 to"),
    "workers_fork_bomb": ([*DOCS, "--workers", "100000"], "--workers 100000 must be an integer"),
    "shard_tokens_huge": ([*DOCS, "--shard-tokens", "1e30"], f"--shard-tokens {BIG} must be an"),
    "context_huge": ([*DOCS, "--context", "1048577"], "--context 1048577 must be an integer"),
    "context_zero": ([*DOCS, "--context", "0"], "--context 0 must be an integer from 1 to"),
    "vocab_size_zero": ([*DOCS, "--vocab-size", "0"], "vocabulary size 0 cannot hold"),
    "max_chars_huge": ([*DOCS, "--tokenizer-max-chars", "1e30"], f"-max-chars {BIG} must be"),
    "doc_cap_negative_zero": ([*DOCS, "--tokenizer-doc-cap", "-0"], "-doc-cap 0 must be an"),
    "text_field_empty": ([*DOCS, "--text-field", ""], "--text-field '' must be a non-empty"),
    "split_on_empty": ([*DOCS, "--split-on", ""], "--split-on '' must be a non-empty string"),
    "val_fraction_nan": ([*DOCS, "--val-fraction", "nan"], "validation fraction nan is not in"),
    "pairs_context_zero": ([*PAIRS, "--context", "0"], "--context 0 must be an integer from 1"),
    "pairs_shard_tokens_zero": ([*PAIRS, "--shard-tokens", "0"], "--shard-tokens 0 must be an"),
    "pairs_context_huge": ([*PAIRS, "--context", HUGE], f"--context {HUGE} must be an integer"),
    "pairs_workers": ([*PAIRS, "--workers", "2"], "--workers has no effect with --format"),
    "pairs_prompt_field_empty": ([*PAIRS, "--prompt-field", ""], "--prompt-field '' must be"),
    "pairs_same_fields": ([*PAIRS, "--completion-field", "prompt"], "are both 'prompt'"),
    "chat_messages_field_empty": (
        [*PAIRS[:3], "chat", *PAIRS[4:], "--messages-field", ""],
        "--messages-field '' must be",
    ),
    "tokenizer_out_empty": ([*TOKENIZER, "--out", ""], "--out '' must be a non-empty path"),
    "tokenizer_out_a_folder": ([*TOKENIZER, "--out", "dataset", "--force"], "is a folder; name"),
    "tokenizer_input_empty": (["tokenizer", "train", "", "--out", "t.json"], "input='' must be"),
    "tokenizer_split_on_empty": ([*TOKENIZER, "--split-on", ""], "--split-on '' must be a non"),
    "tokenizer_text_field_empty": ([*TOKENIZER, "--text-field", ""], "--text-field '' must be"),
    "tokenizer_max_chars_huge": ([*TOKENIZER, "--max-chars", "1e30"], f"--max-chars {BIG} must"),
    "tokenizer_doc_cap_zero": ([*TOKENIZER, "--doc-cap", "0"], "--doc-cap 0 must be an integer"),
}


# The commands that use a trained run (`trained`, a copy of a finished tiny run)
USE = {
    "generate_tokens_absurd": (
        ["generate", "trained", "--prompt", "hi", "--max-new-tokens", "100000000"],
        "--max-new-tokens 100000000 is more than 1,048,576",
    ),
    "generate_seed_beyond_torch": (
        ["generate", "trained", "--prompt", "hi", "--seed", str(10**23)],
        f"--seed {10**23} is out of range",
    ),
    "eval_batches_negative": (["eval", "trained", "--batches", "-1"], "--batches -1 must be"),
    "eval_micro_batch_zero": (["eval", "trained", "--micro-batch", "0"], "--micro-batch 0 must"),
    "chat_not_a_chat_run": (["chat", "trained"], "was not trained on a chat dataset"),
    "chat_temperature_nan": (
        ["chat", "trained", "--temperature", "nan"],
        "--temperature nan is not a finite number >= 0",
    ),
    "chat_top_k_zero": (["chat", "trained", "--top-k", "0"], "--top-k 0 keeps no token"),
}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    """The current folder of each case: an existing run, sweep and dataset folder, inputs."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "log.jsonl").write_text('{"type": "header"}\n')
    (tmp_path / "sw" / "runs").mkdir(parents=True)
    (tmp_path / "sw" / "summary.md").write_text("| old summary |\n")
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "manifest.json").write_text("{}\n")
    (tmp_path / "docs").mkdir()
    for i in range(3):
        (tmp_path / "docs" / f"d{i}.txt").write_text(f"document {i} " * 50)
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "a", "completion": "b"}\n' * 3)
    (tmp_path / "tok.json").write_text("{}")
    return tmp_path


def tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")
    }


def assert_refused(args: list[str], expected: str, root: Path, capsys) -> None:
    before = tree(root)
    code = main(args)
    out, err = capsys.readouterr()
    assert code != 0, out
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("octlm: error: ") and expected in lines[0], lines[0]
    assert "; " in lines[0]  # a problem, then its fix
    assert tree(root) == before  # nothing written, nothing lost


@pytest.mark.parametrize("case", TRAIN_FLAGS, ids=TRAIN_FLAGS)
def test_a_bad_train_flag_is_one_line(case, workdir, capsys) -> None:
    args, expected = TRAIN_FLAGS[case]
    assert_refused(["train", *TINY, "--out", "run", *args], expected, workdir, capsys)


@pytest.mark.parametrize("case", TRAIN_TOML, ids=TRAIN_TOML)
def test_a_bad_toml_value_is_one_line(case, workdir, capsys) -> None:
    text, expected = TRAIN_TOML[case]
    (workdir / "run.toml").write_text('model = "tiny"\ncontext = 32\n' + text + "\n")
    commands = [["train", "--out", "run"], ["train", "--print-config"], ["sweep"]]
    for command in commands[:2] if case == "sweep_table_in_train" else commands:
        assert_refused([*command, "--config", "run.toml"], expected, workdir, capsys)


@pytest.mark.parametrize("case", SWEEP, ids=SWEEP)
def test_a_bad_sweep_is_one_line(case, workdir, capsys) -> None:
    flags, table, expected = SWEEP[case]
    head = 'model = "tiny"\ncontext = 32\nsteps = 4\nwarmup = 1\n'
    sweep = "sweep = 5\n" if table is None else f"[sweep]\n{table}\n"
    (workdir / "sweep.toml").write_text(head + sweep)
    args = ["sweep", "--config", "sweep.toml", "--out", "sw", *flags]
    assert_refused(args, expected, workdir, capsys)


@pytest.mark.parametrize("case", PREPARE, ids=PREPARE)
def test_a_bad_data_command_is_one_line(case, workdir, capsys) -> None:
    args, expected = PREPARE[case]
    assert_refused(args, expected, workdir, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("case", USE, ids=USE)
def test_a_bad_use_of_a_trained_run_is_one_line(case, workdir, straight_run, capsys) -> None:
    shutil.copytree(straight_run(), workdir / "trained")
    args, expected = USE[case]
    assert_refused(args, expected, workdir, capsys)
