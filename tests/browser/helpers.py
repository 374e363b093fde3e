"""What the report's page tests share: a page opened with its console errors and requests
recorded, the tooltip a chart shows under the mouse, and numbers as the page prints them.
Test modules import from here, never from each other."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


def embedded(html_path: Path) -> dict:
    html = html_path.read_text(encoding="utf-8")
    return json.loads(re.search(r'id="octlm-data">(.*?)</script>', html, re.S).group(1))


def open_page(browser, path: Path) -> SimpleNamespace:
    """The page at `path`, with its console errors, uncaught exceptions and network requests."""
    seen = SimpleNamespace(errors=[], requests=[])
    page = browser.new_page()
    page.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: seen.errors.append(str(exc)))
    page.on("request", lambda r: seen.requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    seen.page = page
    return seen


def js_number(value: float) -> str:
    """What the page's fmtValue shows for a loss: 5 significant digits, shortest form."""
    text = repr(float(f"{value:.5g}"))
    return text[:-2] if text.endswith(".0") else text


def hover(page, selector: str, fraction: float) -> str:
    """Move the mouse over the chart's plot at `fraction` of its width; the tooltip's text."""
    page.locator(selector).scroll_into_view_if_needed()  # the mouse moves within the viewport
    box = page.locator(f"{selector} rect.overlay").bounding_box()
    page.mouse.move(box["x"] + box["width"] * fraction, box["y"] + box["height"] / 2)
    tip = page.locator(f"{selector} .tip")
    tip.wait_for(state="visible")
    return tip.inner_text()
