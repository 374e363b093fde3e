"""The Python API (`import octlm`): the facade's names, the README's "From Python" snippet, and
a run in this process: from a thread, stopped by a SIGINT, its signal handlers put back."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tqdm.auto import tqdm

import octlm
from octlm import api
from octlm.config.train import TrainConfig
from octlm.errors import OctlmError
from octlm.prepare import text as prepare_text
from octlm.runlog.reader import read_log
from octlm.trainer import loop
from octlm.trainer.checkpoint import read_latest
from octlm.trainer.guards import StopFlag

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def small(tiny_dataset: Path, out: Path, **changes) -> TrainConfig:
    sizes = {"context": 32, "micro_batch": 2, "val_every": 0, "val_batches": 2, "ckpt_every": 0}
    base = {"model": "micro", "data": str(tiny_dataset), "out": str(out), "warmup": 0}
    return TrainConfig(**{**base, **sizes, "progress": False, "steps": 3, **changes})


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_import_octlm_is_cheap_and_names_the_api() -> None:
    code = (
        "import json, sys, octlm; before = 'torch' in sys.modules; names = dir(octlm); "
        "from octlm.generation.trained import load_model; import octlm.cli.main; "
        "print(json.dumps([before, names, callable(octlm.load), octlm.train.__module__]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    torch_loaded, names, load_callable, train_module = json.loads(out.stdout)
    assert not torch_loaded
    assert {"TrainConfig", "train", "load", "generate", "read_log"} <= set(names)
    assert load_callable and train_module == "octlm.api"


def test_the_facade_names_are_the_functions_even_after_their_submodules_load() -> None:
    assert (octlm.train, octlm.load, octlm.generate) == (api.train, api.load, api.generate)
    assert octlm.read_log is read_log and octlm.TrainConfig is TrainConfig
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        octlm.nope  # noqa: B018


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_every_module_is_reachable_by_its_dotted_name_beside_the_api() -> None:
    """No module hides behind an API name, nor an API name behind a module: every public name
    is resolved first (which binds them all on the package), then every module is imported by
    its dotted path; each module is then reachable by that path, and every public name is
    still the API's object. (Resolving after the imports alone hid `octlm.chat`: the module
    `octlm/chat.py` beside the function.)"""
    names = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "octlm").rglob("*.py")
        if p.name != "__main__.py"
    )
    code = (
        "import functools, importlib, json, octlm, sys; mods = json.loads(sys.argv[1]); "
        "first = {n: getattr(octlm, n) for n in octlm.__all__}; "
        "[importlib.import_module(m) for m in mods]; "
        "bad = [m for m in mods if functools.reduce(getattr, m.split('.')[1:], octlm) "
        "is not sys.modules[m]]; "
        "moved = [n for n in first if getattr(octlm, n) is not first[n]]; "
        "api = {n: getattr(octlm, n).__module__ for n in ('train', 'load', 'generate', 'chat')}; "
        "print(json.dumps([bad, moved, api]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(names)], capture_output=True, text=True, check=True
    )
    bad, moved, api_modules = json.loads(proc.stdout)
    assert len(names) > 80 and bad == [] and moved == []
    assert set(api_modules.values()) == {"octlm.api"}


def test_the_chat_module_and_the_chat_function_live_side_by_side() -> None:
    """The regression the check above now catches: after an API name resolves, the chat
    session is still `octlm.generation.chat.ChatSession`, and `octlm.chat` is the function."""
    import octlm.generation.chat as chat_module

    assert octlm.train is api.train  # resolves every public name
    assert octlm.chat is api.chat and callable(octlm.chat)
    assert (
        octlm.generation.chat is chat_module and chat_module.ChatSession.__name__ == "ChatSession"
    )


def test_the_progress_bars_are_tqdm_auto() -> None:
    assert loop.tqdm is tqdm and prepare_text.tqdm is tqdm  # a widget in Jupyter


def readme_snippet() -> str:
    section = README.read_text(encoding="utf-8").split("\n## From Python\n", 1)[1]
    return re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)[0]


@pytest.mark.slow
def test_the_readme_snippet_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", readme_snippet()],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout  # the progress bar's validation line comes first
    assert re.search(r"^20 steps, val loss \d+\.\d{3}, weights [0-9a-f]{12}\nROMEO:", out, re.M)
    assert re.search(r"^train loss \d+\.\d\d -> \d+\.\d\d$", out, re.M)


def test_train_returns_the_run_and_takes_overrides(tiny_dataset: Path, tmp_path: Path) -> None:
    cfg = small(tiny_dataset, tmp_path / "run", val_every=3)
    result = octlm.train(cfg, steps=4, warmup=1)  # overrides apply to a TrainConfig too
    assert result.out == tmp_path / "run" and result.step == 4 and not result.stopped_early
    assert result.weights_sha256 == read_log(result.out)[-1]["weights_sha256"]
    assert result.val_loss is not None and result.last_loss is not None
    model, tokenizer, meta = octlm.load(result.out)
    assert meta["train_state"]["step"] == 4 and not model.training
    first = octlm.generate(result.out, "the", max_new_tokens=8, temperature=1.0, top_k=5, seed=3)
    again = octlm.generate((model, tokenizer, meta), "the", max_new_tokens=8, seed=3)
    assert first.startswith("the") and again.startswith("the")
    kw = {"max_new_tokens": 8, "temperature": 1.0, "top_k": 5, "seed": 3}
    batch = octlm.generate(result.out, ["the", "And so the king"], **kw)  # one batch
    assert batch == [first, octlm.generate(result.out, "And so the king", **kw)]
    with pytest.raises(OctlmError, match="already holds a run"):
        octlm.train(cfg)


def test_train_from_a_thread_installs_no_handler(tiny_dataset: Path, tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    results: list = []
    worker = threading.Thread(
        target=lambda: results.append(octlm.train(small(tiny_dataset, tmp_path / "t")))
    )
    worker.start()
    worker.join(timeout=120)
    assert [r.step for r in results] == [3] and results[0].weights_sha256
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def interrupt_after_steps(log: Path, steps: int) -> threading.Thread:
    """Send this process a SIGINT once the log holds `steps` step records."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log.is_file() and log.read_text().count('"type": "step"') >= steps:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_sigint_stops_an_in_process_run_with_a_checkpoint(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "stopped"
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    watcher = interrupt_after_steps(out / "log.jsonl", 2)
    result = octlm.train(small(tiny_dataset, out, steps=100_000))
    watcher.join()
    assert result.stopped_early and result.weights_sha256 is None and 2 <= result.step < 100_000
    assert read_latest(out)[-1]["step"] == result.step  # the checkpoint of the step it stopped at
    stop = read_log(out)[-1]
    assert (stop["event"], stop["reason"], stop["step"]) == ("stop", "SIGINT", result.step)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert octlm.load(out).meta["train_state"]["step"] == result.step


def test_a_second_signal_in_process_raises_keyboard_interrupt_and_restores() -> None:
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), StopFlag() as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.requested == "SIGINT"
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_the_cli_s_second_signal_still_exits_at_once() -> None:
    code = (
        "import signal\nfrom octlm.trainer.guards import StopFlag\n"
        "with StopFlag(hard_exit=True):\n"
        "    signal.raise_signal(signal.SIGINT)\n    signal.raise_signal(signal.SIGINT)\n"
        "print('not reached')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 128 + signal.SIGINT and "not reached" not in proc.stdout


# Every bad argument is an OctlmError with the CLI's one-line message (no TypeError from a
# dataclass, no traceback from deep inside), raised before anything is read or written.
BAD_CALLS = {
    "train_config_int": (lambda run: octlm.train(123), "config=123 is not a TrainConfig"),
    "train_config_none": (lambda run: octlm.train(None), "config=None is not a TrainConfig"),
    "train_config_empty": (lambda run: octlm.train(""), "config='' must be a non-empty path"),
    "train_unknown_keyword": (
        lambda run: octlm.train(TrainConfig(out=str(run)), learning_rate=1e-3),
        "unknown key(s) learning_rate",
    ),
    "train_misspelt_keyword": (
        lambda run: octlm.train("tiny", out=str(run), warm_up=3),
        "unknown key(s) warm_up (did you mean warmup?)",
    ),
    "train_string_for_int": (
        lambda run: octlm.train("tiny", out=str(run), steps="5"),
        "steps='5' must be an integer from 1 to 2**53 - 1",
    ),
    "train_bool_for_int": (
        lambda run: octlm.train(TrainConfig(out=str(run)), accum=True),
        "accum=True must be an integer from 1",
    ),
    "train_nan": (
        lambda run: octlm.train("tiny", out=str(run), lr=float("nan")),
        "lr=nan must be a finite number > 0",
    ),
    "train_none_for_required": (
        lambda run: octlm.train(TrainConfig(out=str(run)), steps=None),
        "steps=None must be an integer",
    ),
    "config_positional": (lambda run: TrainConfig("tiny"), "takes its settings by name"),
    "config_list_for_str": (lambda run: TrainConfig(model=["tiny"]), "model=['tiny'] must be"),
    "load_int": (lambda run: octlm.load(5), "run=5 must be a non-empty path"),
    "load_empty": (lambda run: octlm.load(""), "run='' must be a non-empty path"),
    "load_device_int": (lambda run: octlm.load(run, device=0), "device=0 must be a non-empty"),
    "load_data_empty": (lambda run: octlm.load(run, data=""), "data='' must be a non-empty path"),
    "generate_bytes_prompt": (lambda run: octlm.generate(run, b"x"), "prompt=b'x' must be a str"),
    "generate_empty_list": (lambda run: octlm.generate(run, []), "prompt=[] must be a string"),
    "generate_list_of_int": (lambda run: octlm.generate(run, ["a", 1]), "prompt=['a', 1] must"),
    "generate_string_count": (
        lambda run: octlm.generate(run, "x", max_new_tokens="5"),
        "max_new_tokens='5' must be an integer from 0",
    ),
    "generate_negative_count": (
        lambda run: octlm.generate(run, "x", max_new_tokens=-1),
        "--max-new-tokens -1 is negative",
    ),
    "generate_nan_temperature": (
        lambda run: octlm.generate(run, "x", temperature=float("nan")),
        "--temperature nan is not a finite number >= 0",
    ),
    "generate_top_k_zero": (lambda run: octlm.generate(run, "x", top_k=0), "--top-k 0 keeps no"),
    "generate_float_top_k": (
        lambda run: octlm.generate(run, "x", top_k=2.5),
        "top_k=2.5 must be an integer from 1",
    ),
    "generate_seed_past_64_bits": (
        lambda run: octlm.generate(run, "x", seed=2**64),
        f"seed={2**64} must be an integer from",
    ),
    "generate_bad_tuple": (
        lambda run: octlm.generate((1, 2), "x"),
        "run=(1, 2) is not what octlm.load returns",
    ),
    "read_log_none": (lambda run: octlm.read_log(None), "run=None must be a non-empty path"),
    "read_log_int": (lambda run: octlm.read_log(3), "run=3 must be a non-empty path"),
}


@pytest.mark.parametrize("case", BAD_CALLS, ids=BAD_CALLS)
def test_a_bad_argument_is_an_octlm_error_with_one_line(case, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_text('{"type": "header"}\n')
    call, expected = BAD_CALLS[case]
    with pytest.raises(OctlmError) as info:
        call(run)
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert info.value.fix  # a fix, as the CLI prints after "; "
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["log.jsonl", "run"]
    assert (run / "log.jsonl").read_text() == '{"type": "header"}\n'
