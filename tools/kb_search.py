"""`kb_search`: BM25 over a local folder of .md/.txt documents, chunked by heading and paragraph."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field
from rank_bm25 import BM25Okapi

from tools.base import Tool, ToolError

MAX_CHUNK_CHARS = 700
MAX_PASSAGE_CHARS = 600
SUFFIXES = (".md", ".txt")

_STOPWORDS = frozenset(
    "a an and are as at be but by can do does for from has have how i if in is it its me my of "
    "on or so than that the their them then there these they this to was what when where which "
    "who why will with would you your should could".split()
)
_SOURCE_LINE = re.compile(r"^\s*source\s*:\s*(.+?)\s*$", re.IGNORECASE)


class KbSearchArgs(BaseModel):
    query: str = Field(min_length=1, max_length=500, description="What to look up, in words.")
    k: int = Field(default=3, ge=1, le=10, description="How many passages to return (1-10).")


@dataclass(frozen=True)
class Passage:
    """One chunk of a document, with where it came from."""

    title: str
    source: str
    section: str
    text: str


class KbSearch(Tool):
    """Search the knowledge base; the index is built once, when the tool is constructed."""

    name = "kb_search"
    description = (
        "Search the knowledge base for passages relevant to a query. Returns the best passages "
        "with their title and source; cite the source when you use a passage."
    )
    Args = KbSearchArgs

    def __init__(
        self,
        directory: str | Path,
        *,
        max_passages: int = 10,
        passage_chars: int = MAX_PASSAGE_CHARS,
    ) -> None:
        """`max_passages` caps what one call returns whatever `k` asks; `passage_chars` cuts
        each passage (at a sentence end when one is near): short results, short prompts."""
        self.max_passages, self.passage_chars = max_passages, passage_chars
        self.passages = load_passages(Path(directory))
        self._tokens = [tokenize(f"{p.title} {p.section} {p.text}") for p in self.passages]
        self._index = BM25Okapi(self._tokens)

    async def run(self, args: KbSearchArgs) -> str:
        hits = self.search(args.query, min(args.k, self.max_passages))
        if not hits:
            return f"No passage matches {args.query!r}. Try other words (e.g. a symptom or topic)."
        # Share the sandbox's output cap between the passages so none is cut mid-way by it.
        budget = min(self.passage_chars, (self.max_output_chars - 200) // len(hits) - 220)
        return "\n\n".join(_render(i, p, budget) for i, p in enumerate(hits, start=1))

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """The top `k` passages sharing at least one term with the query, best first."""
        terms = tokenize(query)
        if not terms:
            return []
        scores = self._index.get_scores(terms)
        wanted = set(terms)
        # BM25's idf is 0 for a term in exactly half the chunks: overlap breaks such ties.
        matching = [i for i, tokens in enumerate(self._tokens) if wanted.intersection(tokens)]
        matching.sort(key=lambda i: (-scores[i], -len(wanted.intersection(self._tokens[i])), i))
        return [self.passages[i] for i in matching[:k]]


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens without stopwords, with a light plural strip (headaches→headache)."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return [_stem(w) for w in words if w not in _STOPWORDS]


def _stem(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def load_passages(directory: Path) -> list[Passage]:
    """Every chunk of every .md/.txt file under `directory`; a clear error when there is none."""
    if not directory.is_dir():
        raise ToolError(f"knowledge base directory {str(directory)!r} does not exist.")
    files = sorted(p for p in directory.rglob("*") if p.suffix.lower() in SUFFIXES and p.is_file())
    passages = [c for path in files for c in _chunk_file(path)]
    if not passages:
        raise ToolError(
            f"knowledge base directory {str(directory)!r} has no .md or .txt document with text."
        )
    return passages


def _chunk_file(path: Path) -> list[Passage]:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    title, source = path.stem.replace("_", " ").replace("-", " "), ""
    if lines and lines[0].startswith("# "):
        title, lines = lines[0][2:].strip(), lines[1:]
    for i, line in enumerate(lines[:5]):
        match = _SOURCE_LINE.match(line)
        if match:
            source, lines = match.group(1), lines[:i] + lines[i + 1 :]
            break
    return [
        Passage(title=title, source=source or path.name, section=section, text=text)
        for section, paragraph in _paragraphs(lines)
        for text in _split_long(paragraph)
    ]


def _paragraphs(lines: list[str]) -> list[tuple[str, str]]:
    """(section heading, paragraph) pairs: blank lines split paragraphs, headings open sections."""
    section, current, out = "", [], []

    def flush() -> None:
        if current:
            out.append((section, " ".join(current)))
            current.clear()

    for line in lines:
        stripped = line.strip()
        if re.match(r"#{1,6}\s", stripped):
            flush()
            section = stripped.lstrip("#").strip()
        elif not stripped:
            flush()
        else:
            current.append(stripped)
    flush()
    return out


def _split_long(paragraph: str) -> list[str]:
    """Paragraphs longer than a chunk are cut at sentence ends."""
    if len(paragraph) <= MAX_CHUNK_CHARS:
        return [paragraph]
    chunks, current = [], ""
    for sentence in re.split(r"(?<=[.!?])\s+", paragraph):
        if current and len(current) + len(sentence) + 1 > MAX_CHUNK_CHARS:
            chunks.append(current)
            current = ""
        current = f"{current} {sentence}".strip()
    chunks.append(current)
    # A single run-on sentence longer than a chunk is cut at the chunk size.
    return [c[i : i + MAX_CHUNK_CHARS] for c in chunks for i in range(0, len(c), MAX_CHUNK_CHARS)]


def _render(rank: int, passage: Passage, max_chars: int) -> str:
    text = _cap(passage.text, max_chars)
    where = f"{passage.title} — {passage.section}" if passage.section else passage.title
    return f"[{rank}] {_cap(where, 80)}\nSource: {_cap(passage.source, 120)}\n{text}"


def _cap(text: str, limit: int) -> str:
    """`text` within `limit` characters: cut after the last whole sentence that fits when one
    ends past half the limit, else at the limit with an ellipsis."""
    if len(text) <= limit:
        return text
    end = max(text.rfind(". ", 0, limit), text.rfind("! ", 0, limit), text.rfind("? ", 0, limit))
    if end > limit // 2:
        return text[: end + 1]
    return text[: limit - 1].rstrip() + "…"
