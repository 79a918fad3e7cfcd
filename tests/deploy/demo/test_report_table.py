"""The demo's closing lines: the table per version fits an 80-column terminal without cutting
a word, and a run on the tiny model says last that it is not expected to improve and what the
full demo shows instead."""

import io
from pathlib import Path

import pytest
from rich.console import Console

from deploy.demo.report import Report, VersionRow, markdown
from deploy.demo.run import print_report


def _report(model: str) -> Report:
    rows = [
        VersionRow("v0", None, "retired", "base", eval_solved=5, eval_n=12, eval_low=0.19,
                   eval_high=0.68, eval_answer_tokens=12.0, thumbs_up=3, thumbs_down=5,
                   user_reward=-0.25),
        VersionRow("v1", "v0", "champion", "pass", eval_solved=12, eval_n=12, eval_low=0.74,
                   eval_high=1.0, eval_answer_tokens=11.5, thumbs_up=10, thumbs_down=2,
                   user_reward=0.5, train_reward=-0.125, kl=0.0123),
    ]  # fmt: skip
    return Report(rows, "v1", None, {"thumbs": 20}, options={"model": model}, seconds={"total": 42})


def _printed(report: Report, width: int) -> list[str]:
    out = io.StringIO()
    print_report(report, Path("reports/demo-1"), Console(file=out, width=width))
    return out.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 100])
def test_the_table_fits_a_narrow_terminal_without_cutting_a_word(width):
    lines = _printed(_report("smollm2"), width)
    assert max(map(len, lines)) <= width
    text = "\n".join(lines)
    assert "…" not in text
    v1 = next(line for line in lines if line.startswith("v1*"))  # the champion, marked
    assert v1.split() == ["v1*", "v0", "pass", "12/12", "[74-100%]", "83%/12", "0.50", "-0.12",
                          "0.0123", "11.5"]  # fmt: skip
    assert "* the champion" in text and "held-out" in text and "[95% CI]" in text


def test_a_wide_terminal_keeps_the_full_table():
    text = "\n".join(_printed(_report("smollm2"), 160))
    assert "held-out success (95% CI)" in text and "12/12 = 100% [74%, 100%]" in text


def test_the_tiny_model_says_last_that_it_is_not_expected_to_improve():
    lines = _printed(_report("tiny"), 80)
    last = " ".join(" ".join(lines[-5:]).split())
    assert "tiny test model" in last and "it is not expected to improve" in last
    assert "The full demo (`arloop demo`: SmolLM2-135M" in last and "excludes zero" in last
    assert "not expected" not in " ".join(_printed(_report("smollm2"), 80))
    assert "it is not expected to improve" in markdown(_report("tiny"))
