"""kb_search: chunking, titles and sources, BM25 ranking, caps, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import KbSearch, ToolError, ToolRegistry
from tools.kb_search import KbSearchArgs

FEVER = """# Fever in adults
Source: https://example.org/fever

## When to seek care
Seek urgent care if a fever above 39.4 C lasts more than three days, or comes with a stiff neck,
confusion or a rash that does not fade under a glass.

## Self-care
Rest, drink plenty of fluids, and use paracetamol as the leaflet says.
"""

HEADACHE = """# Headaches
Source: NHS, "Headaches", 2023

Most headaches go away on their own and are not a sign of anything serious.

A sudden, severe headache ("the worst ever") needs emergency care straight away.
"""

SPRAIN = "Sprains and strains\n\nRest the ankle, apply ice wrapped in a towel, and elevate it.\n"


@pytest.fixture
def kb_dir(tmp_path: Path) -> Path:
    (tmp_path / "fever.md").write_text(FEVER)
    (tmp_path / "headache.md").write_text(HEADACHE)
    sub = tmp_path / "injuries"
    sub.mkdir()
    (sub / "ankle_sprain.txt").write_text(SPRAIN)
    (tmp_path / "notes.pdf").write_text("not indexed")
    return tmp_path


def test_chunks_carry_title_source_and_section(kb_dir):
    kb = KbSearch(kb_dir)
    stiff = next(p for p in kb.passages if "stiff neck" in p.text)
    assert (stiff.title, stiff.source, stiff.section) == (
        "Fever in adults",
        "https://example.org/fever",
        "When to seek care",
    )
    assert "\n" not in stiff.text and "lasts more than three days" in stiff.text
    sprain = next(p for p in kb.passages if "ankle" in p.text)
    assert (sprain.title, sprain.source) == ("ankle sprain", "ankle_sprain.txt")
    assert len(kb.passages) == 6  # 2 fever sections, 2 headache paragraphs, 2 sprain paragraphs
    assert not any("Source:" in p.text or "Fever in adults" in p.text for p in kb.passages)


def test_ranking_puts_the_relevant_passage_first(kb_dir):
    kb = KbSearch(kb_dir)
    assert "worst ever" in kb.search("sudden severe headache", k=1)[0].text
    assert "stiff neck" in kb.search("fever for three days and stiff neck")[0].text
    assert "ice" in kb.search("sprained ankles swelling")[0].text  # plural folded to singular
    assert len(kb.search("fever headache ankle", k=10)) <= 10


async def test_run_renders_passages_with_source(kb_dir):
    out = await KbSearch(kb_dir).run(KbSearchArgs(query="headache emergency", k=2))
    first = out.split("\n\n")[0]
    assert first.startswith("[1] Headaches\nSource: NHS")
    assert "worst ever" in first


async def test_no_match_is_a_clear_observation(kb_dir):
    out = await KbSearch(kb_dir).run(KbSearchArgs(query="quantum chromodynamics"))
    assert out.startswith("No passage matches 'quantum chromodynamics'")
    assert "No passage matches" in await KbSearch(kb_dir).run(KbSearchArgs(query="the of and"))


async def test_output_stays_under_the_sandbox_cap(tmp_path):
    long = " ".join(f"Fever sentence number {i} about temperature." for i in range(400))
    for n in range(12):
        (tmp_path / f"doc{n}.md").write_text(f"# Doc {n}\n\n{long}\n")
    kb = KbSearch(tmp_path)
    assert all(len(p.text) <= 700 for p in kb.passages)
    out = await kb.run(KbSearchArgs(query="fever temperature", k=10))
    assert out.count("Source: doc") == 10
    assert len(out) <= kb.max_output_chars
    result = await ToolRegistry([kb]).call("kb_search", {"query": "fever", "k": 10}, "c")
    assert not result.truncated


async def test_k_is_bounded_by_the_sandbox(kb_dir):
    result = await ToolRegistry([KbSearch(kb_dir)]).call("kb_search", {"query": "x", "k": 11}, "c")
    assert result.error == "invalid_arguments" and "k" in result.output


def test_missing_or_empty_directory_fails_at_construction(tmp_path):
    with pytest.raises(ToolError, match="does not exist"):
        KbSearch(tmp_path / "nope")
    (tmp_path / "empty.md").write_text("# Only a title\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    with pytest.raises(ToolError, match="no .md or .txt document"):
        KbSearch(tmp_path)
