"""The medical pack's rules applied to a message: red flags, the floor, a follow-up question.

The rules are data (`data/triage_discriminators.toml`, read by `agents.packs.triage_rules`),
independent of any model. `assess` reads a message once: its phrase groups (in one sentence,
or anywhere in the message), what it says about who is ill and what they measured
(`agents.packs.patient`), and returns the red flags (emergency rules), the least level the
other rules allow and the follow-up question worth asking. A phrase group matches when one of
its phrases occurs, in any order with the others, and is not negated. So "pain in my chest"
and "chest pain" read alike, and "my dad has crushing chest pain" fires as "I have" does (a
red flag about someone else still escalates).

Words are lower-cased, apostrophes dropped (`can't` -> `cant`), and a word of five letters or
more that no rule knows is corrected to the one rule word a single edit away (`chset`,
`unconcious`, `siezure`), unless it is a common word in its own right. A phrase is negated
when a negation cue ("no", "not", "denies", "without", "don't", ...) stands at most
`NEGATION_WINDOW` words before it in its clause; "but", "and", "however", ... and a comma end
the clause, except in a list that goes on to "or" ("denies chest pain, cough, or fever").
Phrases that carry their own negation ("can't breathe", "won't stop", "does not fade") are
symptoms, and their words are no cue for the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from agents.packs.patient import Profile, profile
from agents.packs.triage_rules import Ask, Groups, Rule, rules
from tools.verifiers import LEVELS

NEGATION_WINDOW = 8
"""Words between a negation cue and the start of the phrase it negates, at most."""

CUES = frozenset(
    "no not denies denied deny without never nor dont doesnt didnt isnt arent wasnt werent "
    "havent hasnt hadnt negative free none".split()
)
PSEUDO_CUES = (
    ("not", "sure"),
    ("not", "certain"),
    ("no", "idea"),
    ("dont", "know"),
    ("not", "only"),
)
"""Cue words that negate nothing: "not sure if it is a stroke" still names a stroke."""
CLAUSE_ENDS = frozenset(
    "but however although though yet except and now which who so because whereas".split()
)
COMMON = frozenset(
    "week weeks heat bread chess fact fine best rest test west fist bleed feeling feels gaping "
    "sweet swell sweep breed brain chair cheek heard health their there these those where "
    "while whole woman women words world wrong light night right sight might faint point "
    "stool stole strike stoke store storm".split()
)
"""Ordinary words never "corrected" into a rule word (each is one edit from one); the words of
the knowledge base and the cue words are never corrected either."""
KB_DIR = Path(__file__).parent / "kb" / "medical"


RULES: tuple[Rule, ...] = rules().rules
"""Every discriminator of the data file, red flags (`emergency`) and floors alike."""
ADVICE: dict[str, str] = rules().advice
"""What to do now, per red flag, beside calling emergency services (from the data file)."""


@dataclass(frozen=True)
class Finding:
    flag: str
    level: str
    source: str


@dataclass(frozen=True)
class Assessment:
    """What the rules make of a message: red flags, the least level, a question worth asking."""

    flags: tuple[str, ...]  # red flags (emergency findings), each once, in file order
    findings: tuple[Finding, ...]  # every rule that fired, highest level first, each flag once
    ask: Ask | None  # the first follow-up question whose fact the message lacks
    profile: Profile
    answered: tuple[str, ...]  # facts the message answers by a follow-up label (`Age: ...`)

    @property
    def floor(self) -> str | None:
        """The least level any answer may give (None: the rules set none)."""
        return self.findings[0].level if self.findings else None

    def reasons(self, level: str) -> list[str]:
        return [f.flag for f in self.findings if f.level == level]


def red_flags(message: str) -> list[str]:
    """The red flags a patient's message raises, each named once, in the data file's order."""
    return list(assess(message).flags)


@lru_cache(maxsize=4096)
def assess(message: str) -> Assessment:
    """The rules of the data file applied to a (scrubbed) message."""
    text = Text.of(message)
    person = profile(message)
    fired = [r for r in RULES if _rule_fires(r, text, person)]
    flags = list(dict.fromkeys(r.flag for r in fired if r.level == "emergency"))
    order = sorted(fired, key=lambda r: -LEVELS.index(r.level))
    seen: dict[str, Finding] = {}
    for r in order:
        seen.setdefault(r.flag, Finding(r.flag, r.level, r.source))
    answered = tuple(a.fact for a in rules().asks if _labelled(message, a.label))
    floor = LEVELS.index(order[0].level) if order else -1
    ask = None
    if not flags and not answered:  # one question per case: a reply is triaged
        worth = (a for a in rules().asks if LEVELS.index(a.raises_to) > floor)
        named = bool(fired) or text.anywhere(rules().groups["SPECIFIC_SYMPTOM"])
        ask = next((a for a in worth if _ask_fits(a, text, person, named)), None)
    return Assessment(tuple(flags), tuple(seen.values()), ask, person, answered)


@dataclass(frozen=True)
class Text:
    """A message read once: its sentences' corrected words and cue-holding symptom spans."""

    sentences: tuple[tuple[tuple[str, ...], tuple[tuple[int, int], ...]], ...]

    @classmethod
    def of(cls, message: str) -> Text:
        out = []
        for sentence in sentences(message):
            words = [correct(w) for w in tokens(sentence)]
            out.append((tuple(words), tuple(_symptom_spans(words))))
        return cls(tuple(out))

    def in_one_sentence(self, groups: Groups) -> bool:
        return any(_fires(groups, list(w), list(s)) for w, s in self.sentences)

    def anywhere(self, phrases: tuple[str, ...]) -> bool:
        return any(_fires((phrases,), list(w), list(s)) for w, s in self.sentences)


def _rule_fires(rule: Rule, text: Text, person: Profile) -> bool:
    if rule.reading is not None and not rule.reading.holds(person.reading(rule.reading.kind)):
        return False
    if not _who_fits(dict(rule.who), text, person):
        return False
    if rule.all and not text.in_one_sentence(rule.all):
        return False
    return all(text.anywhere(group) for group in rule.also)


def _who_fits(who: dict, text: Text, person: Profile, named: bool = True) -> bool:
    """Whether the person fits `who`; `named`: the message names a symptom (a rule that fired
    counts as one)."""
    age = person.age_months
    checks = {
        "age_below_months": lambda v: age is not None and age < v,
        "age_at_least_months": lambda v: age is not None and age >= v,
        "age_at_least_years": lambda v: age is not None and age >= 12 * v,
        "child": lambda v: person.child == v,
        "pregnant": lambda v: person.pregnant is v,
        "condition": lambda v: text.anywhere(rules().conditions[v]),
        "age_known": lambda v: (age is not None) == v,
        "could_be_pregnant": lambda v: person.could_be_pregnant == v,
        "glucose_known": lambda v: (person.glucose is not None) == v,
        "duration_known": lambda v: person.duration_known == v,
        "symptom_known": lambda v: named == v,
        "minor_ailment": lambda v: text.anywhere(rules().groups["MINOR"]) == v,
    }
    return all(checks[key](value) for key, value in who.items())


def _ask_fits(ask: Ask, text: Text, person: Profile, named: bool) -> bool:
    return _who_fits(dict(ask.who), text, person, named) and all(text.anywhere(g) for g in ask.when)


def _labelled(message: str, label: str) -> bool:
    """Whether a line of the message starts with a follow-up label (`Age: 3 weeks`)."""
    return bool(re.search(rf"(?im)^\s*{re.escape(label)}\s*:", message or ""))


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"[.!?;:\n]+", text or "") if s.strip()]


def tokens(sentence: str) -> list[str]:
    """Lower-case words and commas (`,` is kept: it can end a negation's clause)."""
    text = re.sub(r"['’`]", "", sentence.lower())
    return re.findall(r"[a-z0-9]+|,", text)


def correct(word: str) -> str:
    """The rule word one edit from `word` (only one), for unknown words of 5+ letters."""
    known = vocabulary()
    if len(word) < 5 or word in known or word in protected() or not word.isalpha():
        return word
    near = [w for w in known if abs(len(w) - len(word)) <= 1 and _one_edit(word, w)]
    return near[0] if len(near) == 1 else word


def _fires(groups: Groups, words: list[str], symptoms: list[tuple[int, int]]) -> bool:
    return all(
        any(not _negated(words, start, symptoms) for start in _starts(words, phrases))
        for phrases in groups
    )


def _starts(words: list[str], phrases: tuple[str, ...]) -> list[int]:
    """Where any of the phrases begins in `words`."""
    out = []
    for phrase in phrases:
        parts = phrase.split()
        for i in range(len(words) - len(parts) + 1):
            if all(_word_matches(words[i + j], p) for j, p in enumerate(parts)):
                out.append(i)
    return out


def _word_matches(word: str, pattern: str) -> bool:
    return word.startswith(pattern[:-1]) if pattern.endswith("*") else word == pattern


def _symptom_spans(words: list[str]) -> list[tuple[int, int]]:
    """Where phrases that hold a cue word match ("cant breathe"): those cues negate nothing."""
    spans = []
    for phrase in _cue_phrases():
        n = len(phrase.split())
        spans += [(i, i + n) for i in _starts(words, (phrase,))]
    return spans


@cache
def _cue_phrases() -> tuple[str, ...]:
    """The rules' phrases that hold a cue word ("cant breathe", "dont want to live")."""
    return tuple(p for p in _all_phrases() if CUES.intersection(p.split()))


@cache
def _all_phrases() -> tuple[str, ...]:
    data = rules()
    groups = [g for r in data.rules for g in r.all + r.also] + [
        g for a in data.asks for g in a.when
    ]
    phrases = [p for g in groups for p in g] + [p for c in data.conditions.values() for p in c]
    return tuple(dict.fromkeys(phrases + list(data.groups["SPECIFIC_SYMPTOM"])))


def _negated(words: list[str], start: int, symptoms: list[tuple[int, int]]) -> bool:
    """Whether a negation cue governs the phrase starting at `start`."""
    for i in range(start - 1, max(-1, start - 1 - NEGATION_WINDOW), -1):
        word = words[i]
        listing = word == "," and ("or" in words[i + 1 :] or "nor" in words[i + 1 :])
        if word in CLAUSE_ENDS or (word == "," and not listing):
            return False
        if word in CUES and not _inside(i, symptoms) and not _pseudo(words, i):
            return True
    return False


def _inside(i: int, spans: list[tuple[int, int]]) -> bool:
    return any(a <= i < b for a, b in spans)


def _pseudo(words: list[str], i: int) -> bool:
    return any(tuple(words[i : i + len(p)]) == p for p in PSEUDO_CUES)


@cache
def vocabulary() -> frozenset[str]:
    """Every word the rules name (a `*` word with its usual endings), for spelling repair."""
    endings = ("", "s", "ed", "ing", "y", "ness", "ly", "e")
    out: set[str] = set()
    for phrase in _all_phrases():
        for part in phrase.split():
            stem = part.rstrip("*")
            out.update(stem + e for e in (endings if part.endswith("*") else ("",)))
    return frozenset(w for w in out if len(w) >= 4)


@cache
def protected() -> frozenset[str]:
    """Words that are words already: `COMMON`, the cues, and every word of the knowledge base."""
    kb = " ".join(p.read_text(encoding="utf-8") for p in sorted(KB_DIR.glob("*.md")))
    return COMMON | CUES | CLAUSE_ENDS | frozenset(tokens(kb))


def _one_edit(a: str, b: str) -> bool:
    """Whether `a` becomes `b` by one insertion, deletion, substitution or swap of neighbours."""
    if a == b:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return True
        i = diff[0]
        return len(diff) == 2 and diff[1] == i + 1 and a[i] == b[i + 1] and a[i + 1] == b[i]
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    i = 0
    while i < len(short) and short[i] == long_[i]:
        i += 1
    return short[i:] == long_[i + 1 :]
