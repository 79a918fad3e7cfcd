"""The README stays a front door (STYLE.md 15): short, readable lines, no dated figures."""

from __future__ import annotations

import re

from tests.docs.markdown import ROOT

README = (ROOT / "README.md").read_text()


def test_the_readme_is_under_300_lines():
    assert len(README.splitlines()) < 300


def test_no_readme_line_runs_past_300_characters():
    long = [n for n, line in enumerate(README.splitlines(), 1) if len(line) > 300]
    assert long == []


def test_the_readme_quotes_no_dated_measurement():
    """A figure's date and command live on the figures page, quoted once."""
    assert re.findall(r"\b20\d\d-\d\d-\d\d\b", README) == []
    assert "docs/figures.md" in README
