"""Tests for `octlm report` / `octlm playground` without a browser: the JavaScript schedule
against Python's (in node), the run data, the escaping of the embedded JSON, and bad input.

The pages in a real browser: tests/browser/test_report_page.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from octlm.config.files import load_toml
from octlm.config.train import TrainConfig
from octlm.rl.run import KIND
from octlm.runlog.writer import RunLog
from octlm.tools.report import report as page
from octlm.tools.report.presets import SCHEDULE_KEYS, schedule_defaults, schedule_presets
from octlm.tools.report.runs import RL_KIND, chance_of, load_run, load_runs
from octlm.trainer.schedule import learning_rate
from tests.cli_in_process import main
from tests.tools.helpers import write_rl_log

REPO = Path(__file__).resolve().parents[2]
SCHEDULE_JS = REPO / "octlm" / "tools" / "report" / "assets" / "schedule.js"
SHIPPED = sorted((REPO / "octlm" / "configs").glob("*.toml"))
NODE = shutil.which("node")
EVIL = "</script><script>alert(1)</script><!-- \u2028 & </SCRIPT >"

# Reads [[cfg, step], ...] as JSON on stdin; prints learningRate for each (shortest round trip).
NODE_PROGRAM = """
const { learningRate } = require(process.argv[1]);
let input = "";
process.stdin.on("data", (c) => (input += c)).on("end", () => {
  const cases = JSON.parse(input);
  process.stdout.write(JSON.stringify(cases.map(([cfg, step]) => learningRate(step, cfg))));
});
"""


def js_rates(cases: list[tuple[dict, int]]) -> list[float]:
    if NODE is None:
        pytest.skip("node is not installed: the JavaScript schedule cannot be compared")
    result = subprocess.run(
        [NODE, "-e", NODE_PROGRAM, str(SCHEDULE_JS)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout)


def schedule(path: Path) -> dict:
    values = {**schedule_defaults(), **load_toml(path)}
    return {k: values[k] for k in SCHEDULE_KEYS}


def full(cfg: dict) -> dict:
    """A schedule as the page holds one: every key, cosine unless it says otherwise."""
    return {**schedule_defaults(), **cfg}


def edge_steps(cfg: dict) -> list[int]:
    w, n = cfg["warmup"], cfg["steps"]
    # Warmup edges, the cosine's midpoint, the run's middle, the end and past it.
    return sorted({0, max(0, w - 1), w, w + 1, w + (n - w) // 2, n // 2, n - 1, n, n + 1, n + 100})


EDGE_CONFIGS = [
    {"lr": 1e-3, "warmup": 0, "steps": 10, "min_lr_ratio": 0.1},  # no warmup: starts at the peak
    {"lr": 1e-3, "warmup": 10, "steps": 10, "min_lr_ratio": 0.1},  # all warmup: max(1, 0)
    {"lr": 6e-4, "warmup": 0, "steps": 1, "min_lr_ratio": 0.0},
    {"lr": 3e-3, "warmup": 7, "steps": 33, "min_lr_ratio": 1.0},  # flat after warmup
    {"lr": 1, "warmup": 3, "steps": 9, "min_lr_ratio": 0},  # integers, as TOML may give them
]
WSD = {"schedule": "wsd"}
WSD_CONFIGS = [
    {"lr": 1e-3, "warmup": 10, "steps": 110, "min_lr_ratio": 0.1, **WSD, "decay_steps": 40},
    {"lr": 3e-3, "warmup": 7, "steps": 33, "min_lr_ratio": 0.0, **WSD, "decay_steps": 26},
    {"lr": 1, "warmup": 0, "steps": 9, "min_lr_ratio": 0, **WSD, "decay_steps": 1},  # integers
]
WSD_CONFIGS += [{**c, "decay_shape": "1-sqrt"} for c in WSD_CONFIGS]


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [schedule(p) for p in SHIPPED] + list(map(full, EDGE_CONFIGS)))
def test_js_learning_rate_equals_python_exactly_at_the_edges(cfg: dict) -> None:
    steps = edge_steps(cfg)
    expected = [learning_rate(s, SimpleNamespace(**cfg)) for s in steps]
    assert js_rates([(cfg, s) for s in steps]) == expected  # the same doubles, bit for bit


@pytest.mark.slow
def test_js_learning_rate_within_1e15_at_every_step_of_the_shipped_configs() -> None:
    # Math.cos (V8) and the C library's cos may round a few arguments differently (1 ulp of the
    # cosine): exact at the edges above, relatively within 1e-15 everywhere.
    cases = [(c, s) for c in map(schedule, SHIPPED) for s in range(c["steps"] + 2)]
    got = js_rates(cases)
    for (cfg, s), js in zip(cases, got, strict=True):
        py = learning_rate(s, SimpleNamespace(**cfg))
        assert abs(js - py) <= 1e-15 * abs(py), (cfg, s, js, py)


@pytest.mark.slow
def test_js_wsd_equals_python_exactly_at_every_step() -> None:
    # Only + - * / and sqrt, all correctly rounded in both languages: no tolerance at all.
    cases = [(full(c), s) for c in WSD_CONFIGS for s in range(c["steps"] + 3)]
    expected = [learning_rate(s, SimpleNamespace(**c)) for c, s in cases]
    assert js_rates(cases) == expected
    assert len(set(expected)) > 20  # warmup, stable and both decays, not one constant


def test_a_wsd_run_is_a_playground_preset_with_its_decay() -> None:
    wsd = {"steps": 50, "warmup": 5, "schedule": "wsd", "decay_steps": 10, "decay_shape": "1-sqrt"}
    data = page.page_data([{"name": "w", "path": "/w", "config": wsd}], "t")
    preset = data["presets"][0]
    assert preset["name"] == "run: w"
    assert {k: preset[k] for k in wsd} == wsd


def test_every_shipped_config_is_a_preset_with_its_schedule() -> None:
    presets = {p["name"]: p for p in schedule_presets()}
    assert {p.stem for p in SHIPPED} <= set(presets)
    for path in SHIPPED:
        assert {k: presets[path.stem][k] for k in schedule(path)} == schedule(path)
    assert presets["tiny"]["min_lr_ratio"] == 0.1  # left out of tiny.toml: the default


def write_run(folder: Path, steps: int = 6, clip: float = 1.0, **header) -> Path:
    """A log as the trainer wrote one before `log_schema` (steps numbered from 0, read shifted
    to today's numbering): header, steps (one non-finite), vals, a resume, end."""
    log = RunLog(folder)
    log.open()
    config = {"steps": steps, "warmup": 2, "lr": 1e-3, "min_lr_ratio": 0.1, "grad_clip": clip}
    log.write("header", config=config, tokens_per_step=64, params=1000, **header)
    for s in range(steps):
        loss = float("nan") if s == 2 else 5.0 - s / 10
        log.write(
            "step",
            step=s,
            loss=loss,
            lr=1e-3,
            grad_norm=0.5 + s / 4,
            tokens=64 * (s + 1),
            dt=0.1,
            tok_per_s=640.0,
            mfu=None,
            elapsed=0.1 * (s + 1),
        )
        if s % 2 == 1:
            log.write("val", step=s, val_loss=5.5 - s / 10, val_ppl=200.0, val_bpb=2.0)
        if s == 3:
            log.write("event", event="resume", step=4, checkpoint="ckpt", notes=[])
    log.write("end", step=steps, weights_sha256="ab" * 32)
    log.close()
    return folder


def test_load_run_reads_columns_gaps_events_and_samples(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a")
    with open(run / "log.jsonl", "a", encoding="utf-8") as f:
        f.write('{"type": "step", "step": 6, "lo')  # a line cut short by a crash
    (run / "samples.txt").write_text("ROMEO: " + EVIL + "\n", encoding="utf-8")
    data = load_run(run)
    assert data["name"] == "a" and data["bad_lines"] == 1
    assert data["steps"]["step"] == list(range(1, 7))
    assert data["steps"]["loss"][2] is None  # "nan" in the log: a gap in the chart
    assert data["steps"]["mfu"] == [None] * 6
    assert data["val"]["step"] == [2, 4, 6] and data["val"]["tokens"] == [128, 256, 384]
    assert [e["event"] for e in data["events"]] == ["resume"]
    assert data["grad_clip"] == 1.0 and data["end"]["step"] == 6
    assert data["samples"] == [{"source": "samples.txt", "text": "ROMEO: " + EVIL}]


def test_a_garbled_line_mid_log_is_skipped_and_counted(tmp_path: Path, capsys) -> None:
    run = write_run(tmp_path / "a")
    lines = (run / "log.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[3:3] = ["\x00\x00 not json\n", "[1, 2]\n", '{"type": "step", "step": "x"}\n']
    (run / "log.jsonl").write_text("".join(lines), encoding="utf-8")
    data = load_run(run)
    assert data["bad_lines"] == 2  # the garbage and the JSON that is no record
    steps = data["steps"]["step"]
    assert steps.count(None) == 1 and [s for s in steps if s is not None] == list(range(1, 7))
    assert data["val"]["step"] == [2, 4, 6] and data["end"]["step"] == 6
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    assert capsys.readouterr().err == ""


def test_runs_without_samples_have_none_and_same_names_are_told_apart(tmp_path: Path) -> None:
    a = write_run(tmp_path / "x" / "run")
    b = write_run(tmp_path / "y" / "run")
    runs = load_runs([a, b / "log.jsonl"])
    assert [r["name"] for r in runs] == ["x/run", "y/run"]
    assert all(r["samples"] == [] for r in runs)


def test_embedded_json_cannot_close_the_script_and_parses_back() -> None:
    data = {"text": EVIL, "n": [1.5, None, float("nan")]}
    embedded = page.embed_json(data)
    assert not re.search(r"[<>&\u2028\u2029]", embedded)
    assert json.loads(embedded) == {"text": EVIL, "n": [1.5, None, "nan"]}


def test_report_page_is_self_contained_and_escapes_log_text(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", git_commit=EVIL)
    (run / "samples.txt").write_text(EVIL, encoding="utf-8")
    html = page.build_report([run])
    # Exactly one </script> per inlined script and one for the data: the sample closed none.
    assert html.lower().count("</script") == len(page.SCRIPTS) + 1
    assert "Content-Security-Policy" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing to fetch
    data = json.loads(re.search(r'id="octlm-data">(.*?)</script>', html, re.S).group(1))
    assert data["runs"][0]["samples"][0]["text"] == EVIL
    assert data["runs"][0]["git_commit"] == EVIL
    assert data["presets"][0]["name"] == "run: run"  # the run's own schedule comes first
    for name in ("learningRate", "drawChart", "setupRuns", "setupSchedule", "setupClipping"):
        assert f"function {name}(" in html


def test_an_asset_with_a_script_close_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(page, "asset", lambda name: "const s = '</script>';")
    with pytest.raises(AssertionError, match="must not contain"):
        page.inline_script("x.js")


def test_cli_report_writes_into_a_new_folder(tmp_path: Path, capsys) -> None:
    run = write_run(tmp_path / "run")
    out = tmp_path / "new" / "deeper" / "report.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    assert out.is_file() and f"wrote {out}" in capsys.readouterr().out


def test_cli_playground_page_has_presets_and_no_runs(tmp_path: Path) -> None:
    out = tmp_path / "play.html"
    assert main(["playground", "-o", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="octlm-data">(.*?)</script>', html, re.S).group(1))
    assert data["runs"] == [] and {p["name"] for p in data["presets"]} >= {"tiny", "main88"}


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda d: d, "no run log at"),  # a folder without log.jsonl
        (lambda d: d / "missing", "no run log at"),
        (lambda d: (d / "log.jsonl").write_text('{"type": "step"}\n') and d, "no header record"),
    ],
    ids=["empty-folder", "missing-path", "no-header"],
)
def test_cli_report_bad_input_is_one_error_line(tmp_path: Path, capsys, make, expected) -> None:
    target = make(tmp_path)
    assert main(["report", str(target), "-o", str(tmp_path / "r.html")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("octlm: error: ") and expected in err[0], err
    assert not (tmp_path / "r.html").exists()


def test_cli_report_out_is_a_folder_is_one_error_line(tmp_path: Path, capsys) -> None:
    run = write_run(tmp_path / "run")
    assert main(["report", str(run), "-o", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith(f"octlm: error: {tmp_path} is a folder")


@pytest.mark.slow
def test_cli_report_error_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "octlm", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"octlm: error: no run log at {tmp_path / 'log.jsonl'}; name a run folder written by "
        "`octlm train` (it holds log.jsonl), or the log itself"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", page.SCRIPTS)
def test_every_script_asset_is_valid_javascript(name: str) -> None:
    if NODE is None:
        pytest.skip("node is not installed: the page's scripts are not syntax-checked")
    path = SCHEDULE_JS.parent / name
    result = subprocess.run([NODE, "--check", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_settings_show_the_shape_a_preset_decided(tmp_path: Path) -> None:
    """A run that left the shape to its preset logs None for those keys; the page shows the
    model's values, and a key the config set stays as it was set."""
    model = {"n_layers": 4, "d_model": 192, "n_heads": 6, "qk_norm": False, "vocab_size": 512}
    run = write_run(tmp_path / "a", model_config=model)
    lines = (run / "log.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    header = json.loads(lines[0])
    header["config"].update(n_layers=None, d_model=None, n_heads=6)
    lines[0] = json.dumps(header) + "\n"
    (run / "log.jsonl").write_text("".join(lines), encoding="utf-8")
    config = load_run(run)["config"]
    assert (config["n_layers"], config["d_model"], config["n_heads"]) == (4, 192, 6)
    assert "vocab_size" not in config  # not a config key: it stays in the Model group


def test_the_settings_are_grouped_by_section_without_keys_that_do_not_apply(
    tmp_path: Path,
) -> None:
    """The report's settings table: one group per section of the config, in the sections'
    order; Muon's keys only for a Muon run, the wsd decay's only for wsd, and every other key
    of the header in its section."""
    run = write_run(tmp_path / "a")
    lines = (run / "log.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    header = json.loads(lines[0])
    header["config"] = TrainConfig(model="micro", context=32).to_dict()  # every key
    (run / "log.jsonl").write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    config, sections = load_run(run)["config"], load_run(run)["config_sections"]
    assert list(sections)[:3] == ["shape", "optim", "lr_schedule"]
    assert "muon_lr" not in sections["optim"] and "decay_steps" not in sections["lr_schedule"]
    assert sections["optim"]["optimizer"] == config["optimizer"] == "adamw"
    shown = {k for keys in sections.values() for k in keys}
    hidden = {"muon_lr", "muon_momentum", "muon_ns_steps", "muon_gram", "muon_ns_dtype"}
    hidden |= {"decay_steps", "decay_shape", "doc_mask"}
    assert shown == set(config) - hidden
    header["config"].update(optimizer="muon", schedule="wsd", decay_steps=2)
    (run / "log.jsonl").write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    sections = load_run(run)["config_sections"]
    assert {"muon_lr", "muon_ns_dtype"} <= set(sections["optim"])
    assert sections["lr_schedule"]["decay_steps"] == 2


def test_the_header_packing_record_reaches_the_page(tmp_path: Path) -> None:
    packing = {"train": {"packing": "bos", "rows": 100, "cropped": 0.0, "padded": 0.0}}
    run = write_run(tmp_path / "a", packing=packing)
    assert load_run(run)["packing"] == packing
    assert load_run(write_run(tmp_path / "b"))["packing"] is None


def write_suite_run(folder: Path) -> Path:
    """Three validations with --eval-tasks' fields (evaluate/tasks.py `task_fields`): suite `s`
    (an accuracy task, a bpb task) at all three, suite `t` at the first two only, and a task
    file `next_line` (acc/NAME, acc_norm/NAME) that is no suite."""
    log = RunLog(folder)
    log.open()
    log.header({"config": {"steps": 6}, "tokens_per_step": 64})
    accs = [(0.5, 1 / 3), (0.25, 0.0), (1.0, 1.0)]  # chance 1/4; acc 1 tells none
    for k, (acc, centered) in enumerate(accs):
        fields = {"acc/s/mc": acc, "centered/s/mc": centered, "bpb/s/mc": 2.0 + k}
        fields |= {"bpb/s/gen": float("nan") if k == 1 else 4.0 - k}
        fields |= {"centered/s": centered, "bpb/s": float("nan") if k == 1 else 4.0 - k}
        if k < 2:
            fields |= {"acc/t/yes": 0.5, "centered/t/yes": 0.0, "bpb/t/yes": 1.0 + k}
            fields |= {"centered/t": 0.1 * k}
        fields |= {"acc/next_line": 0.5, "acc_norm/next_line": 0.75}
        log.write("val", step=2 * (k + 1), val_loss=5.0, **fields)
    log.close()
    return folder


def test_standard_suites_are_collected_per_validation_and_at_the_latest(tmp_path: Path) -> None:
    data = load_run(write_suite_run(tmp_path / "a"))
    assert data["suite_centered"] == {"s": [1 / 3, 0.0, 1.0], "t": [0.0, 0.1, None]}
    assert data["suite_bpb"] == {"s": [4.0, None, 2.0]}  # NaN: a gap; `t` logs no bpb/t
    assert data["val_tasks"] == {"next_line": [0.75] * 3}  # the task file, as before
    s, t = data["suites"]
    assert (s["name"], s["step"], s["centered"], s["bpb"]) == ("s", 6, 1.0, 2.0)
    assert s["tasks"] == [
        {"task": "mc", "format": "accuracy", "acc": 1.0, "centered": 1.0, "chance": 0.25,
         "bpb": 4.0},
        {"task": "gen", "format": "bpb", "acc": None, "centered": None, "chance": None,
         "bpb": 2.0},
    ]  # fmt: skip
    assert (t["name"], t["step"], t["centered"], t["bpb"]) == ("t", 4, 0.1, None)
    assert [(r["task"], r["chance"], r["bpb"]) for r in t["tasks"]] == [("yes", 0.5, 2.0)]
    assert chance_of(0.5, -0.3157894736842105) == 0.62 and chance_of(1.0, 1.0) is None
    plain = load_run(write_run(tmp_path / "b"))  # no suite fields: nothing new on the page
    assert plain["suites"] == [] and plain["suite_centered"] == plain["suite_bpb"] == {}


def test_an_rl_run_has_its_sectioned_settings_rollouts_and_pass_at_k(
    tmp_path: Path,
) -> None:
    assert RL_KIND == KIND  # the report does not import torch to read it
    data = load_run(write_rl_log(tmp_path / "rl"))
    rl = data["rl"]
    assert rl["settings"]["task"] == "addition" and rl["source"]["step"] == 30 and rl["world"] == 2
    assert rl["steps"]["reward"] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert rl["steps"]["cut"] == [0.0, 0.0, None, 0.0]  # NaN: a gap
    assert list(rl["pass_at"]) == ["pass@1", "pass@4", "pass@16"]  # K ascending, not as text
    assert rl["pass_at"]["pass@16"] == [None, 1.0]
    assert rl["val"]["heldout_reward"] == [0.5, 0.5]
    assert data["val"]["tokens"] == [80, 160]  # the sampled tokens by then
    assert data["config"] == {}  # no empty training shape
    sections = data["config_sections"]  # RL's sections (config/rl.py), beside training's
    assert sections["policy"]["task"] == "addition" and list(sections)[0] == "policy"
    assert data["grad_clip"] == 0.5  # the RL run's own clipping
    names = [p["name"] for p in page.page_data([data], "t")["presets"]]
    assert not any(n.startswith("run: ") for n in names)  # its linear lr is no preset
    assert load_run(write_run(tmp_path / "train"))["rl"] is None
