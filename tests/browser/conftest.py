"""The browser the page tests drive: Debian's /usr/bin/chromium through Playwright for Python
(never a downloaded browser), one per test module; the tests skip, with the reason, without
either."""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip(
            f"{CHROMIUM} is missing (Debian's chromium; `make test` installs it as root): "
            "the report is not checked in a browser"
        )
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright (the dev extra) is not installed"
    )
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),  # a fresh user-data-dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        yield context
        context.close()
