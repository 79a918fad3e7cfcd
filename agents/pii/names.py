"""Person names without a language model: cue phrases, name lists, and capitalised runs.

Capitalised names are found here (after "Dr", "my name is", "Regards,"; runs of listed names);
lower-case names in casual text by their contexts, in `casual_names.py`.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass

from agents.pii.base import (
    EPONYM_FOLLOWERS,
    EPONYMS,
    NOT_NAMES,
    ORG_WORDS,
    Lexicon,
    LocalRecognizer,
    RecognizerResult,
    lexicon,
    norm,
    result,
)
from agents.pii.casual_names import RELATIONS, casual_names

_WORD = re.compile(r"[A-Za-zÀ-ÖØ-öø-ÿ][A-Za-zÀ-ÖØ-öø-ÿ'’-]*")
_PARTICLES = frozenset("de du da van von der den del di la le bin bint al el ibn ben st".split())
# Cue -> (needs a name-list hit first, lower-case words allowed when they are listed names).
# After a weak cue ("I'm", "this is") a lower-case name must be a first name and no word at all.
_CUES = [
    (
        re.compile(
            r"(?i)\b(?:my\s+name\s+is|name\s+is|name's|names|(?:patient\s+|full\s+)?name\s*:|patient\s*:|pt\s*:"
            r"|signed,?|sincerely,?|regards,?|best(?:\s+wishes)?,|thanks,|thank\s+you,|cheers,|love,"
            r"|call\s+me|named|(?:emergency\s+)?contact\s*:|attn\.?|attention:?)\s*"
        ),
        False,
        True,
    ),
    (re.compile(r"(?m)(?:^|\s)(?:--|—|–|-)\s*(?=(?:[A-Z][\w'’.-]*\s*){1,3}$)"), False, False),
    (
        re.compile(
            r"(?i)\b(?:dr|doctor|mr|mrs|ms|miss|mx|prof|professor|nurse|sister|rev|fr|sgt|capt|officer)\b\.?\s+"
        ),
        False,
        True,
    ),
    (re.compile(rf"(?i)\b(?:{RELATIONS})(?:'s\s+name\s+is|\s*[,:])?\s+"), False, False),
    (re.compile(rf"(?i)\b(?:{RELATIONS})\s+(?:is|was)\s+"), True, False),
    (
        re.compile(
            r"(?i)\b(?:i'm|i\s+am|im|this\s+is|it's|its|it\s+is|hi|hello|hey|dear|ask\s+for|tell|with|from"
            r"|and|for|contact|call|text|email|see|saw|by)[,!]?\s+"
        ),
        True,
        False,
    ),
]
_HERE = re.compile(
    r"(?:^|(?<=[.!?\n,]))\s*(?P<value>(?:[A-Z][\w'’-]+\s+){0,2}[A-Z][\w'’-]+)\s+here\b"
)


@dataclass(frozen=True)
class _Token:
    start: int
    end: int  # without a possessive 's
    text: str

    @property
    def capitalised(self) -> bool:
        return self.text[0].isupper() and not self.text.isupper() and len(self.text) > 1


class NameRecognizer(LocalRecognizer):
    """NAME spans: after cue phrases, runs of capitalised listed names, and their repeats."""

    def __init__(self) -> None:
        super().__init__(supported_entities=["NAME"], name="ArloopNameRecognizer")

    def load(self) -> None:
        """The name lists load lazily (`lexicon()`), once per process."""

    def analyze(self, text: str, entities=None, nlp_artifacts=None) -> list[RecognizerResult]:
        lex = lexicon()
        tokens = _tokens(text)
        spans = self._cued(text, tokens, lex) + self._runs(text, tokens, lex)
        spans += [
            (*m.span("value"), 0.7)
            for m in _HERE.finditer(text)
            if _plausible_run(m.group("value"), lex)
        ]  # "Svetlana Ivanova here."
        spans += casual_names(text, tokens, lex)
        found = [result("NAME", s, e, score) for s, e, score in spans]
        return found + _repeats(tokens, found)

    def _cued(self, text: str, tokens: list[_Token], lex: Lexicon) -> list[tuple[int, int, float]]:
        out, starts = [], [t.start for t in tokens]
        for pattern, needs_list, lower_ok in _CUES:
            for match in pattern.finditer(text):
                rest = tokens[bisect_left(starts, match.end()) :]
                span = _take_name(text, rest, match.end(), lex, needs_list, lower_ok)
                if span and not (needs_list and _place_only(text[span[0] : span[1]], lex)):
                    out.append((*span, 0.8))
        return out

    def _runs(self, text: str, tokens: list[_Token], lex: Lexicon) -> list[tuple[int, int, float]]:
        """Runs of capitalised words with no cue: names when the name lists vouch for them."""
        out = []
        for run in _capitalised_runs(text, tokens):
            opening = (
                _opening_name(run[0], lex)
                or _pair(run, lex)
                or _coordinated(text, run, lex)
                or _subject(text, run, lex)
            )
            if _sentence_start(text, run[0].start) and not opening:
                run = run[1:]  # "Tell Priya", "Yesterday Kwame Mensah"
            run = [t for t in run if norm(t.text) not in NOT_NAMES]
            if not run or norm(run[-1].text) in ORG_WORDS or _eponym(text, run[-1], lex):
                continue
            if _place_only(text[run[0].start : run[-1].end], lex):
                continue
            if _pair(run, lex):  # outranks the gazetteer: "Maria Lopez", not Maria the town
                out.append((run[0].start, run[-1].end, 0.7))
            elif any(_solo_name(t, lex) for t in run):
                out.append((run[0].start, run[-1].end, 0.5))
        return out


def _place_only(words: str, lex: Lexicon) -> bool:
    """`from Albuquerque`, `Santa Cruz`: the place recogniser's (but `and Linda` is a person)."""
    return words in lex.cities and not lex.is_first(words)


def _tokens(text: str) -> list[_Token]:
    out = []
    for match in _WORD.finditer(text):
        word = re.sub(r"(?:'s|’s|'|’)$", "", match.group(0))
        if word:
            out.append(_Token(match.start(), match.start() + len(word), word))
    return out


def _take_name(text, tokens, pos, lex, needs_list, lower_ok) -> tuple[int, int] | None:
    """The name starting at `pos`: up to four name words, initials and particles."""
    taken: list[_Token] = []
    for token in tokens:  # those from `pos` on
        if re.fullmatch(r"[A-Z]", token.text) and text[token.end : token.end + 1] == ".":
            continue  # an initial: part of the gap, kept by _initials_before
        gap = text[(taken[-1].end if taken else pos) : token.start]
        if not re.fullmatch(r"[ \t]*(?:[A-Z]\.[ \t]*)*", gap):
            break  # a comma, a full stop or a line ends the name
        if taken and norm(token.text) in ORG_WORDS:
            return None  # "- Capitol Hill Pediatrics" signs off an organisation, not a person
        if not _name_word(token, lex, lower_ok or needs_list, bool(taken), strict=not lower_ok):
            break
        taken.append(token)
        if len(taken) == 4:
            break
    while taken and taken[-1].text.lower() in _PARTICLES:
        taken.pop()
    if not taken or (needs_list and not _listed_start(taken, lex)):
        return None
    start = _initials_before(text, pos, taken[0].start)
    return start, taken[-1].end


def _name_word(token: _Token, lex: Lexicon, lower_ok: bool, inside: bool, strict: bool) -> bool:
    key = norm(token.text)
    if key in NOT_NAMES:
        return False
    if token.capitalised:
        return True
    if inside and token.text in _PARTICLES:
        return True
    if not (lower_ok and token.text.islower()) or lex.is_common(token.text):
        return False
    if strict and not inside:  # "I'm karen smith", not "I'm sorry"
        return lex.is_first(token.text) and not lex.is_everyday(token.text)
    return lex.is_name(token.text)


def _listed_start(taken: list[_Token], lex: Lexicon) -> bool:
    """A weak cue ("I'm", "with") needs a listed name that is not first of all a word."""
    return _solo_name(taken[0], lex) or _pair(taken, lex)


def _solo_name(token: _Token, lex: Lexicon) -> bool:
    """A listed name that is no ordinary word (Tom is; Will and Blood are not)."""
    if not lex.is_name(token.text):
        return False
    if not lex.is_common(token.text):
        return True
    return lex.is_first(token.text) and not lex.is_everyday(token.text)


def _pair(run: list[_Token], lex: Lexicon) -> bool:
    """A first name followed by listed names: `Tom Becker`, `Grace Park`."""
    return len(run) > 1 and lex.is_first(run[0].text) and all(lex.is_name(t.text) for t in run[1:])


def _initials_before(text: str, pos: int, start: int) -> int:
    """`J. R. Whitaker`: initials right after the cue belong to the name."""
    match = re.fullmatch(r"\s*((?:[A-Z]\.\s*)+)", text[pos:start])
    return pos + match.start(1) if match else start


def _capitalised_runs(text: str, tokens: list[_Token]) -> list[list[_Token]]:
    runs, current = [], []
    for token in tokens:
        joined = current and re.fullmatch(r"[ \t]", text[current[-1].end : token.start])
        if token.capitalised and (joined or not current):
            current.append(token)
            continue
        if current:
            runs.append(current)
        current = [token] if token.capitalised else []
    if current:
        runs.append(current)
    return runs


def _sentence_start(text: str, start: int) -> bool:
    before = text[:start].rstrip()
    return not before or before[-1] in '.!?\n"“(:;-–—•*'


def _opening_name(token: _Token, lex: Lexicon) -> bool:
    """At a sentence start only a first name that is no word at all counts (Jessica, not Mark)."""
    return lex.is_first(token.text) and not lex.is_common(token.text)


def _coordinated(text: str, run: list[_Token], lex: Lexicon) -> bool:
    """`Bob and Alice both ...`: a listed first name joined by `and` to another name."""
    follower = re.match(r"\s+(?:and|&)\s+([A-Z][\w'’-]+)", text[run[-1].end :])
    return (
        len(run) == 1
        and _solo_name(run[0], lex)
        and follower is not None
        and lex.is_name(follower.group(1))
    )


_PERSON_VERB = re.compile(
    r"\s+(?:has|had|is|was|buys|bought|gives|gave|shares|shared|says|said|wants|wanted|needs|"
    r"needed|takes|took|makes|made|gets|got|goes|went|feels|felt|lives|lived|works|worked)\b"
)


def _subject(text: str, run: list[_Token], lex: Lexicon) -> bool:
    """`Sam has 40 shells`: a listed first name (no everyday word) as the subject of a verb."""
    return (
        len(run) == 1
        and lex.is_first(run[0].text)
        and not lex.is_everyday(run[0].text)
        and _PERSON_VERB.match(text, run[0].end) is not None
    )


def _eponym(text: str, token: _Token, lex: Lexicon) -> bool:
    """`Parkinson's`, `Graves' disease`, `Apgar score`: a disease or scale, not a person."""
    rest = text[token.end : token.end + 25]
    follower = re.match(r"(?:'s|’s|'|’)?(?:-[A-Z][a-z]+)?\s+([a-z]+)", rest)
    if follower and follower.group(1) in EPONYM_FOLLOWERS:
        return True
    return norm(token.text) in EPONYMS and re.match(r"(?:'s|’s|'|’)", rest) is not None


def _plausible_run(value: str, lex: Lexicon) -> bool:
    run = [_Token(0, len(w), w) for w in value.split()]
    if any(norm(t.text) in NOT_NAMES for t in run):
        return False
    return _pair(run, lex) or any(_solo_name(t, lex) for t in run)


def _repeats(tokens: list[_Token], found: list[RecognizerResult]) -> list[RecognizerResult]:
    """A name found once is redacted wherever it appears again in the same text."""
    words = {
        t.text
        for t in tokens
        for f in found
        if f.start <= t.start
        and t.end <= f.end
        and len(t.text) > 2
        and norm(t.text) not in NOT_NAMES
    }
    return [result("NAME", t.start, t.end, 0.6) for t in tokens if t.text in words]


def name_recognizers() -> list[LocalRecognizer]:
    return [NameRecognizer()]
