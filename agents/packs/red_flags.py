"""Red-flag rules of the medical pack: which patient messages always need emergency care.

Written from the knowledge base (`kb/medical`: the "Emergency level" sections and
`when-to-call-emergency-services.md`), independent of any model. A rule is a few groups of
phrases; it fires when every group has a phrase in the same sentence, in any order, and none
of those phrases is negated. So "pain in my chest" and "chest pain" read alike, and "my dad has
crushing chest pain" fires as "I have" does (a red flag about someone else still escalates).

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
from functools import cache
from pathlib import Path

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


@dataclass(frozen=True)
class Rule:
    """One way a red flag shows: every group needs one of its phrases (`*`: any ending)."""

    flag: str
    page: str  # the knowledge-base page it is written from
    groups: tuple[tuple[str, ...], ...]


def rule(flag: str, page: str, *groups: str) -> Rule:
    """A rule from groups written as `phrase|phrase|...`."""
    return Rule(flag, page, tuple(tuple(g.split("|")) for g in groups))


EMERGENCY_PAGE = "when-to-call-emergency-services.md"
CHEST = "chest|breastbone|sternum"
CHEST_FEEL = (
    "pain*|hurt*|ache|aches|aching|pressure|tight*|crush*|squeez*|heavy|heaviness|discomfort|agony"
)
ONE_SIDE = (
    "one side|one sided|left side|right side|side of my body|side of his body|side of her body"
    "|side of their body|half of my body|half my body"
)
WEAK = "weak*|numb*|paraly*|droop*|cant move|cannot move|cant lift|cannot lift|cant feel|dead"
BREATHING = (
    "cant breath*|cannot breath*|can not breath*|unable to breath*|not breathing"
    "|stopped breathing|struggling to breath*|struggle to breath*|trouble breath*"
    "|difficulty breath*|difficult to breath*|hard to breath*|hard time breath*"
    "|short of breath*|shortness of breath*|breathless*|gasping|choking|cant get my breath"
    "|cant catch my breath"
)
HEAVY = (
    "heavy|heavily|a lot|lots|so much|wont stop|will not stop|doesnt stop|does not stop"
    "|not stopping|cant stop|cannot stop|spurt*|pour*|gush*|soak*|everywhere"
)
BRINGING_UP = "vomit*|throwing up|threw up|coughing up|coughed up|cough up|spitting"
COLLAPSE = (
    "collaps*|unconscious*|unresponsive|not responding|wont wake*|not waking|cant wake*"
    "|cannot wake|seizure*|fitting|having a fit|had a fit|convuls*"
)
ALLERGY_TRIGGER = (
    "sting|stung|bee|wasp|peanut*|nut|nuts|allerg*|ate|eating|medicine|medication|tablet*|food"
    "|shellfish"
)
SUICIDE = (
    "suicid*|kill myself|kill himself|kill herself|kill themselves|end my life|ending my life"
    "|end his life|end her life|end their life|end it all|take my own life|want to die"
    "|wanna die|better off dead|harm* myself|self harm*|overdose*"
)
NOT_FADING = "not fade|doesnt fade|does not fade|wont fade|dont fade|glass"

RULES: tuple[Rule, ...] = (
    rule("chest pain", "chest-pain.md", CHEST, CHEST_FEEL),
    rule("chest pain", "chest-pain.md", "heart attack|cardiac arrest"),
    rule("chest pain", "chest-pain.md", "crush*", "pain*|pressure"),
    rule("chest pain", "chest-pain.md", "pain*", "spread*|radiat*", "arm|jaw"),
    rule("difficulty breathing", EMERGENCY_PAGE, BREATHING),
    rule("difficulty breathing", EMERGENCY_PAGE, "lips|lip", "blue"),
    rule("difficulty breathing", EMERGENCY_PAGE, "turning blue|going blue"),
    rule("stroke signs", "stroke.md", "face|mouth|smile", "droop*|lopsided|sagging|dropped|fallen"),
    rule("stroke signs", "stroke.md", "slur*|garbled"),
    rule("stroke signs", "stroke.md", "arm|arms", "weak*|numb*|paraly*|cant lift|cannot lift|dead"),
    rule("stroke signs", "stroke.md", ONE_SIDE, WEAK),
    rule("stroke signs", "stroke.md", "stroke|mini stroke"),
    rule(
        "stroke signs",
        "stroke.md",
        "sudden*",
        "confus*|blind*|loss of sight|lost my sight|cant see|balance|cant walk",
    ),
    rule("heavy bleeding", "cuts-and-bleeding.md", "bleed*|blood", HEAVY),
    rule("heavy bleeding", "diarrhoea-and-vomiting.md", BRINGING_UP, "blood"),
    rule("heavy bleeding", "diarrhoea-and-vomiting.md", "coffee grounds"),
    rule("collapse", EMERGENCY_PAGE, COLLAPSE),
    rule(
        "severe allergic reaction",
        "allergic-reactions.md",
        "throat|tongue",
        "swell*|swollen|closing|tight*",
    ),
    rule(
        "severe allergic reaction",
        "allergic-reactions.md",
        "lips|lip|face",
        "swell*|swollen",
        ALLERGY_TRIGGER,
    ),
    rule(
        "severe allergic reaction",
        "allergic-reactions.md",
        "anaphyla*|epipen|severe allergic reaction",
    ),
    rule("thoughts of suicide", "mental-health-crisis.md", SUICIDE),
    rule("sudden severe headache", "headache.md", "headache*|head", "worst|thunderclap"),
    rule(
        "sudden severe headache",
        "headache.md",
        "sudden*",
        "severe|excruciating|terrible",
        "headache*",
    ),
    rule("meningitis signs", "skin-and-rashes.md", "rash*", NOT_FADING),
    rule("meningitis signs", "fever.md", "stiff", "neck", "fever|temperature|rash*|headache*"),
    rule("severe burn", "burns.md", "burn*", "electric*|chemical|charred|white skin|large|deep"),
    rule(
        "sudden severe tummy pain",
        "stomach-ache.md",
        "belly|tummy|stomach|abdomen",
        "hard|rigid",
        "sudden*|severe|swollen",
    ),
)

ADVICE: dict[str, str] = {
    "chest pain": "Stop and rest while you wait; do not drive yourself to hospital.",
    "difficulty breathing": "Sit upright and stay with someone while you wait.",
    "stroke signs": "Note the time the symptoms started, even if they go away.",
    "heavy bleeding": "Press firmly on the wound with a clean cloth and keep pressing.",
    "collapse": "Stay with the person and tell the call handler whether they are breathing.",
    "severe allergic reaction": "Use an adrenaline auto-injector if there is one.",
    "thoughts of suicide": "If you might act on these thoughts, go to an emergency department "
    "now or stay with someone; in the US you can also call or text 988, in the UK call "
    "Samaritans.",
    "sudden severe headache": "Do not wait to see whether it settles.",
    "meningitis signs": "Do not wait for more symptoms to appear.",
    "severe burn": "Cool the burn with cool running water while you wait.",
    "sudden severe tummy pain": "Do not eat or drink while you wait.",
}
"""What to do now, per flag, beside calling emergency services (from the flag's page)."""


def red_flags(message: str) -> list[str]:
    """The red flags a patient's message raises, each named once, in `RULES` order."""
    found: list[str] = []
    for sentence in sentences(message):
        words = [correct(w) for w in tokens(sentence)]
        spans = _symptom_spans(words)
        for rule in RULES:
            if rule.flag not in found and _fires(rule, words, spans):
                found.append(rule.flag)
    return found


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


def _fires(rule: Rule, words: list[str], symptoms: list[tuple[int, int]]) -> bool:
    return all(
        any(not _negated(words, start, symptoms) for start in _starts(words, phrases))
        for phrases in rule.groups
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
    for rule in RULES:
        for phrases in rule.groups:
            for phrase in phrases:
                parts = phrase.split()
                if not CUES.intersection(parts):
                    continue
                spans += [(i, i + len(parts)) for i in _starts(words, (phrase,))]
    return spans


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
    for rule in RULES:
        for phrases in rule.groups:
            for phrase in phrases:
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
