"""A screen for answers no user should get: empty, repeating, gibberish, off-topic or offensive.

Model-independent checks on an answer's text, each returning advice to fix it (as the
verifiers do), so a Reflexion agent can retry and a guard can refuse what still fails:
- empty: no word at all;
- repetition: a sentence said twice, a four-word run said three times, a word four times in a
  row, or a long answer with few distinct words (a knowledge-base passage pasted five times);
- gibberish: many "words" no language has (no vowel, five consonants in a row, 20+ letters);
- off-topic: most content words are neither in the domain's vocabulary (its knowledge base,
  prompts and model answers, plus everyday words) nor in the question;
- offensive: a word or phrase of the abuse lexicon, or a religion, ethnicity or nationality
  the question did not raise (a triage answer has no reason to bring one up).
The lexicons are data (`data/screen_lexicon.json`), reviewed by hand; the false-positive rate
on good answers is measured in the tests and the README.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

LEXICON = Path(__file__).parent / "data" / "screen_lexicon.json"
STOPWORDS = frozenset(
    "a an and are as at be been but by can could did do does for from had has have he her him "
    "his how i if in into is it its me my no not of on or our she so than that the their them "
    "then there these they this those to up us was we were what when where which who why will "
    "with would you your yours im ive dont its".split()
)


@cache
def lexicon() -> dict[str, tuple[str, ...]]:
    """The screen's word lists: `abuse`, `identity`, `common` (lower case)."""
    data = json.loads(LEXICON.read_text(encoding="utf-8"))
    return {k: tuple(w.lower() for w in v) for k, v in data.items() if not k.startswith("_")}


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", re.sub(r"['’]", "", (text or "").lower()))


def stem(word: str) -> str:
    """A light stem so `headaches`, `headache` and `headached` meet."""
    for ending in ("ing", "ed", "es", "s"):
        if len(word) > len(ending) + 3 and word.endswith(ending):
            return word[: -len(ending)]
    return word


@dataclass(frozen=True)
class Screen:
    """The checks above for one domain (`Screen.of(texts)`: its vocabulary from those texts)."""

    domain: frozenset[str]
    min_on_topic: float = 0.5
    """Least share of an answer's content words found in the domain or the question."""

    @classmethod
    def of(cls, *texts: str, min_on_topic: float = 0.5) -> Screen:
        vocab = {stem(w) for t in texts for w in words(t)}
        vocab |= {stem(w) for w in lexicon()["common"]}
        return cls(frozenset(vocab), min_on_topic)

    def __call__(self, question: str, answer: str) -> list[str]:
        """What is wrong with `answer` (empty: nothing), each as advice to fix it."""
        said = words(answer)
        if not said:
            return ["write an answer: it is empty"]
        return [
            p
            for p in (
                offensive(question, answer),
                repetition(answer, said),
                gibberish(said),
                self.off_topic(question, said),
            )
            if p
        ]

    def off_topic(self, question: str, said: list[str]) -> str | None:
        content = [stem(w) for w in said if w not in STOPWORDS and len(w) > 2]
        if len(content) < 3:
            return None
        asked = {stem(w) for w in words(question)}
        share = sum(w in self.domain or w in asked for w in content) / len(content)
        if share < self.min_on_topic:
            return f"stay on the question: only {share:.0%} of the answer is about it"
        return None


def offensive(question: str, answer: str) -> str | None:
    """Abuse, or a group identity the question did not raise."""
    text = " " + " ".join(words(answer)) + " "
    asked = " " + " ".join(words(question)) + " "
    abuse = [w for w in lexicon()["abuse"] if f" {w} " in text]
    if abuse:
        return "remove offensive language"
    groups = [w for w in lexicon()["identity"] if f" {w} " in text and f" {w} " not in asked]
    if groups:
        return f"do not bring up religion, ethnicity or nationality ({groups[0]})"
    return None


def repetition(answer: str, said: list[str]) -> str | None:
    """A repeated sentence, four-word run or word, or a long answer of few distinct words."""
    sentences = [" ".join(words(s)) for s in re.split(r"[.!?\n]+", answer)]
    counts = Counter(s for s in sentences if len(s.split()) >= 4)
    if counts and counts.most_common(1)[0][1] > 1:
        return "do not repeat yourself: a sentence is said more than once"
    grams = Counter(tuple(said[i : i + 4]) for i in range(len(said) - 3))
    if grams and grams.most_common(1)[0][1] >= 3:
        return "do not repeat yourself: the same words come three times"
    if any(len(set(said[i : i + 4])) == 1 for i in range(len(said) - 3)):
        return "do not repeat a word over and over"
    if len(said) >= 40 and len(set(said)) / len(said) < 0.35:
        return "do not repeat yourself: the answer says the same few words"
    return None


def gibberish(said: list[str]) -> str | None:
    """Many words that no language has."""
    odd = [w for w in said if _not_a_word(w)]
    if len(odd) >= 2 and len(odd) / len(said) > 0.15:
        return f"write real words (not {' '.join(odd[:3])})"
    return None


def _not_a_word(word: str) -> bool:
    if len(word) >= 20:
        return True
    if len(word) >= 3 and not re.search(r"[aeiouy]", word):
        return True
    return bool(re.search(r"[bcdfghjklmnpqrstvwxz]{5,}", word))
