"""The report of a real `octlm rl` run (stopped and resumed) beside the chat fine-tune it
started from, in headless Chromium: the RL charts (reward and share correct, replies cut, reply
length, held-out pass@1 and pass@k) show the logged values under the mouse, the page says what
the RL run is (task, source, P, G) instead of empty training settings, the fine-tune keeps its
training view, and nothing errs. A screenshot goes to test-artifacts/report-rl.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from octlm.runlog.reader import read_log
from tests.browser.helpers import ARTIFACTS, embedded, hover, js_number, open_page
from tests.e2e.helpers import octlm
from tests.rl.helpers import chat_source

pytestmark = pytest.mark.slow

P, G, K, CAP, STEPS, STOP = 2, 3, 2, 6, 4, 2
RL = ("--task", "addition:1", "--steps", str(STEPS), "--prompts", str(P), "--samples", str(G))
RL += ("--max-new-tokens", str(CAP), "--eval-every", "2", "--eval-prompts", "4")
RL += ("--pass-k", str(K), "--ckpt-every", "2", "--no-progress")


@pytest.fixture(scope="module")
def source(tiny_tokenizer, tmp_path_factory) -> Path:
    return chat_source(tiny_tokenizer, tmp_path_factory)


@pytest.fixture(scope="module")
def rl_run(source: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rl_report") / "rl"
    octlm("rl", str(source), *RL, "--out", str(out), "--stop-at", str(STOP))
    octlm("rl", str(source), *RL, "--out", str(out), "--resume")
    return out


@pytest.fixture(scope="module")
def report(source: Path, rl_run: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rl_page") / "report.html"
    octlm("report", str(source), str(rl_run), "-o", str(out))
    return out


def records(run: Path, kind: str) -> list[dict]:
    return [r for r in read_log(run) if r["type"] == kind]


def cells(page, css: str) -> list[list[str]]:
    """The text of each cell of each row `css` selects."""
    return [[c.strip() for c in r.split("\t")] for r in page.locator(css).all_inner_texts()]


def tip_values(text: str) -> tuple[int, dict[str, str]]:
    """A tooltip's step and its `NAME: VALUE` lines."""
    first, *rest = text.splitlines()
    return int(first.removeprefix("step ")), dict(line.split(": ", 1) for line in rest)


def test_the_rl_run_is_embedded_with_its_own_columns(report: Path, rl_run: Path) -> None:
    data = embedded(report)
    ft, rl = data["runs"]
    assert ft["rl"] is None and ft["config_sections"]  # the fine-tune: a training run
    steps, vals = records(rl_run, "step"), records(rl_run, "val")
    assert rl["rl"]["steps"]["reward"] == [r["reward"] for r in steps]
    assert rl["rl"]["steps"]["cut"] == [r["cut"] for r in steps]
    assert list(rl["rl"]["pass_at"]) == ["pass@1", f"pass@{K}"]
    assert rl["rl"]["pass_at"]["pass@1"] == [v["pass@1"] for v in vals]
    assert (rl["rl"]["settings"]["prompts"], rl["rl"]["settings"]["samples"]) == (P, G)
    assert rl["config_sections"]["policy"]["task"] == "addition:1" and rl["grad_clip"] == 1.0
    assert [e["event"] for e in rl["events"]] == ["resume"]
    presets = [p["name"] for p in data["presets"]]
    assert "run: ft" in presets and "run: rl" not in presets  # RL's lr is no schedule preset


def test_the_rl_charts_show_the_logged_values(browser, report: Path, rl_run: Path) -> None:
    seen = open_page(browser, report)
    page = seen.page
    steps = {r["step"]: r for r in records(rl_run, "step")}
    vals = records(rl_run, "val")
    assert [v["step"] for v in vals] == [2, 4]
    for card in ("reward", "pass", "cut", "len"):
        assert page.locator(f"#card-rl-{card}").is_visible()
    assert page.locator(f"#chart-rl-reward path.series[data-n='{STEPS}']").count() == 2
    assert page.locator("#chart-rl-reward line.vline").count() == 1  # the resume
    assert page.locator("#chart-rl-pass circle.point").count() == 2 * len(vals)
    assert page.locator("#chart-rl-len line.hline").count() == 1  # the length cap

    # Steps 1 to 4 across the plot: step k at (k - 1) / 3 of its width (lines speak near one).
    step, shown = tip_values(hover(page, "#chart-rl-reward", 1 / 3))
    assert step == 2
    assert shown == {
        "rl reward": js_number(steps[step]["reward"]),
        "rl correct": js_number(steps[step]["correct"]),
    }
    step, shown = tip_values(hover(page, "#chart-rl-cut", 2 / 3))
    assert step == 3
    assert shown == {"rl cut": js_number(steps[step]["cut"])}
    step, shown = tip_values(hover(page, "#chart-rl-len", 0.01))
    assert step == 1
    assert shown == {"rl reply length": js_number(steps[step]["reply_len"])}
    step, shown = tip_values(hover(page, "#chart-rl-pass", 0.98))
    assert step == vals[-1]["step"] == STEPS
    assert shown == {f"rl {k}": js_number(vals[-1][k]) for k in ("pass@1", f"pass@{K}")}

    page.click("#x-tokens")  # the same points against the sampled tokens, the resume too
    assert page.locator("#chart-rl-pass circle.point").count() == 2 * len(vals)
    assert page.locator("#chart-rl-reward line.vline").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report-rl.png"), full_page=True)
    assert page.locator("#js-error").is_hidden()
    assert seen.errors == []
    assert all(u.startswith(("file:", "data:")) for u in seen.requests), seen.requests
    page.close()


def test_the_page_says_what_the_rl_run_is(browser, report: Path, rl_run: Path, source) -> None:
    seen = open_page(browser, report)
    page = seen.page
    header = read_log(rl_run)[0]
    last = records(rl_run, "val")[-1]
    (row,) = cells(page, "#rl-runs tbody tr")
    src = header["source"]
    assert row[:7] == ["rl", "addition:1", f"{src['path']} · step {src['step']}", str(P), str(G),
                       str(CAP), "1"]  # fmt: skip
    assert row[7] == js_number(records(rl_run, "step")[-1]["reward"])
    assert row[9] == f"{js_number(last['pass@1'])} (step {STEPS})"
    assert row[10] == f"pass@{K}: {js_number(last[f'pass@{K}'])} (step {STEPS})"
    ft, rl = cells(page, "#summary tbody tr")
    assert ft[:2] == [source.name, "finished"]  # the fine-tune: no "(RL)"
    assert rl[:2] == ["rl (RL)", "finished"]
    assert page.locator("#loss-note").is_visible()
    settings = page.locator("#settings").inner_text()
    assert "Settings: policy" in settings and "RL source" in settings
    assert "Settings: optim" in settings  # the fine-tune's, beside
    assert page.locator("#sched-preset option", has_text="run: rl").count() == 0
    assert seen.errors == []
    page.close()


def test_a_training_run_alone_shows_nothing_of_rl(browser, source, tmp_path) -> None:
    out = tmp_path / "report.html"
    octlm("report", str(source), "-o", str(out))
    seen = open_page(browser, out)
    page = seen.page
    for hidden in ("#card-rl-reward", "#card-rl-pass", "#card-rl-cut", "#card-rl-len"):
        assert page.locator(hidden).is_hidden()
    assert page.locator("#rl-box").is_hidden() and page.locator("#loss-note").is_hidden()
    assert "RL" not in page.locator("#settings").inner_text()
    assert seen.errors == []
    page.close()
