"""Build the report page: the HTML template with its CSS, JS and data inlined, in one file.

Nothing is fetched at view time (a Content-Security-Policy in the page forbids it). The data
goes in a `<script type="application/json">` with `<`, `>` and `&` escaped, so no string in a
log (a sample, a path) can close the script element.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from octlm import __version__
from octlm.config.checks import shown_path
from octlm.errors import OctlmError
from octlm.fsutil import atomic_write_bytes
from octlm.tools.outputs import check_file_out
from octlm.tools.report.presets import schedule_defaults, schedule_of, schedule_presets
from octlm.tools.report.runs import is_merge, load_merge, load_runs

# Inlined in this order, one <script> each: later files use the earlier ones' functions.
PAGE_SUFFIXES = (".html", ".htm")
SCRIPTS = ("schedule.js", "charts.js", "runs.js", "suites.js", "rl.js", "playground.js", "main.js")
_JSON_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",  # line separators: valid in JSON, not in older JS string literals
    "\u2029": "\\u2029",
}


def asset(name: str) -> str:
    folder = resources.files("octlm.tools.report").joinpath("assets")
    return folder.joinpath(name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """JSON safe inside a <script> element: no `</script>`, `<!--` or line separators."""
    text = json.dumps(_finite(data), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for char, escape in _JSON_ESCAPES.items():
        text = text.replace(char, escape)
    return text


def inline_script(name: str) -> str:
    code = asset(name)
    if "</script" in code.lower() or "<!--" in code:
        raise AssertionError(f"assets/{name} must not contain </script or <!--")  # our bug
    return f"<script>/* {name} */\n{code}</script>"


def render_page(data: dict[str, Any], title: str) -> str:
    page = Template(asset("template.html"))
    return page.substitute(
        title=html.escape(title),
        style=asset("style.css"),
        data=embed_json(data),
        scripts="\n".join(inline_script(n) for n in SCRIPTS),
    )


def page_data(
    runs: list[dict[str, Any]], title: str, merges: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    presets = [  # an RL run's learning rate (linear to 0) is not a training schedule
        {"name": f"run: {r['name']}", "source": r["path"], **schedule}
        for r in runs
        if r.get("rl") is None and (schedule := schedule_of(r.get("config") or {})) is not None
    ]
    shipped = schedule_presets() or [  # only if the shipped configs were deleted or all broken
        {"name": "defaults", "source": "TrainConfig", **schedule_defaults()}
    ]
    return {
        "title": title,
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "version": __version__,
        "runs": runs,
        "merges": merges or [],
        "presets": presets + shipped,
    }


def build_report(runs: Sequence[str | Path], title: str | None = None) -> str:
    """The page of `runs`: run folders, and `octlm merge` folders (listed, merged vs last)."""
    merges = [load_merge(r) for r in runs if is_merge(r)]
    loaded = load_runs([r for r in runs if not is_merge(r)])
    title = title or "octlm report: " + ", ".join(r["name"] for r in [*loaded, *merges])
    return render_page(page_data(loaded, title, merges), title)


def build_playground(title: str = "octlm playground: schedule and clipping") -> str:
    return render_page(page_data([], title), title)


def check_page_out(out: str | Path) -> Path:
    """-o before the page is built: not a folder, no file among its parents, and no existing
    file but a page (.html, .htm): a run's log.jsonl is never written over."""
    out = Path(out)
    check_file_out("-o", out)
    if out.exists() and out.suffix.lower() not in PAGE_SUFFIXES:
        raise OctlmError(
            f"-o {shown_path(out)} exists and is not an HTML page",
            "name a new file, or a page ending in .html to replace",
        )
    return out


def write_page(text: str, out: str | Path) -> Path:
    """Write atomically; a missing parent folder is created (as `octlm train --out` does)."""
    out = check_page_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, text.encode("utf-8"))
    return out


def _finite(value: Any) -> Any:
    # JSON has no NaN/inf: a stray one (a config value) is shown as text, never breaks parsing.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
