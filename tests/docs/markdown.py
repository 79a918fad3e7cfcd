"""The manual as the tests read it: README.md, DEVELOPERS.md and every page under docs/."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The top-level folders and files a path in the docs may start with.
TOP = ("agents", "tools", "learner", "deploy", "bench", "tests", "docs")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.DOTALL | re.MULTILINE)
MARK = re.compile(r"<!-- example: (.+?) -->\s*\n```", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    page: str
    lang: str
    code: str
    mark: str | None  # the `<!-- example: ... -->` just above it, if any


def pages() -> dict[str, str]:
    """Page name (relative to the repository) -> its text."""
    paths = [ROOT / "README.md", ROOT / "DEVELOPERS.md", *sorted(DOCS.rglob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths}


def prose(text: str) -> str:
    """A page without its fenced code blocks (their backticks are code, not names)."""
    return FENCE.sub("", text)


def blocks(page: str, text: str) -> list[Block]:
    """The page's fenced code blocks, each with the example marker above it."""
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip()
        mark = re.search(r"<!-- example: (.+?) -->$", before)
        found.append(Block(page, match.group(1), match.group(2), mark and mark.group(1)))
    return found


def named_paths(text: str) -> set[str]:
    """Backticked repository paths (`agents/packs/medical.py`, `learner/gate/`) and dotted
    module names (`deploy.credentials.sign_user_token`) in a page's prose."""
    names = set()
    for span in re.findall(r"`([^`\n]+)`", prose(text)):
        span = span.strip()
        if any(c in span for c in " <>*{}$:|,=()'\"") or "..." in span:
            continue  # a command, a pattern or a placeholder, not a name
        head = re.split(r"[/.]", span, maxsplit=1)[0]
        if head in TOP and ("/" in span or "." in span):
            names.add(span)
    return names


def resolves(name: str) -> bool:
    """Whether a named path exists: a file or folder, or a dotted module whose every part but
    the last is a module or package (the last may be an attribute)."""
    if "/" in name or name.endswith((".py", ".md", ".toml", ".txt", ".json", ".yaml", ".sh")):
        return (ROOT / name.rstrip("/")).exists()
    parts = name.split(".")
    for keep in (len(parts), len(parts) - 1):
        base = ROOT.joinpath(*parts[:keep])
        if keep >= 2 and (base.with_suffix(".py").exists() or (base / "__init__.py").exists()):
            return True
    return False
