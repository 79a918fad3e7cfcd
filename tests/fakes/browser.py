"""Headless Chromium for the page tests: Debian's `chromium`, driven by playwright.

No browser is downloaded at run time (playwright's own download cannot work offline): the
system browser is used (`ARLOOP_CHROMIUM`, else `chromium` on PATH). A machine without it
fails these tests with the command that installs it, never skips them.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
INSTALL = "apt-get install -y chromium chromium-driver (as root; `make test` does it)"


def chromium_path() -> str:
    path = os.environ.get("ARLOOP_CHROMIUM") or shutil.which("chromium")
    if not path:
        pytest.fail(f"no chromium on PATH for the browser tests: {INSTALL}", pytrace=False)
    return path


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module, each test opening its own context.

    Not for the whole session: while playwright's sync API is open its event loop counts as
    running in this thread, and the asyncio tests of later modules could not run theirs.
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is missing: pip install -e '.[dev]'", pytrace=False)
    with sync_playwright() as p:  # launch() gives the browser a fresh profile folder itself
        b = p.chromium.launch(executable_path=chromium_path(), args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    yield context.new_page()
    context.close()


# Recorded in each document before its own scripts run: what its Content-Security-Policy refused.
RECORD_REFUSALS = """
window.__refused = [];
document.addEventListener("securitypolicyviolation", (e) => window.__refused.push(
  e.violatedDirective + " refused " + (e.blockedURI || "inline") + " at " + e.sourceFile + ":" + e.lineNumber));
"""
REFUSAL_WORDS = re.compile(r"Content Security Policy|Trusted ?Type|Permissions-Policy", re.I)


def watch_refusals(page) -> Callable[[], list[str]]:
    """Call before `page.goto`; returns `refused()`: what the current document's CSP refused
    (inline script or style, eval, markup written outside the Trusted Types policy) and what
    Chromium's console said of CSP, Trusted Types or a header it could not parse, so far."""
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if REFUSAL_WORDS.search(m.text) else None)
    page.add_init_script(RECORD_REFUSALS)

    def refused() -> list[str]:
        # a task later: a violation already queued has been dispatched, and its console line sent
        later = "() => new Promise((done) => setTimeout(() => done(window.__refused || []), 0))"
        return page.evaluate(later) + console

    return refused
