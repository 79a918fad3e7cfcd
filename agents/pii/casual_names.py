"""Lower-case names in casual text, found by the contexts people use names in.

Casual text writes names in lower case ("my son jake has a fever", "thx, chuy", "greta here"),
where a capitalised run finds nothing. There a name needs a context that people use for
names: right after a relation or a carer ("my son", "our baby", "my wife,", "my childminder");
set off beside one ("my husband, col,", "my son (fintan)"); after "is called", "a nurse called",
"her name's", a title ("dr mbeki"); as a message's signature ("x, ruthie"); before "here"; as
the subject of what a person does ("jake's been", "dawit and me"); as the owner of a relation
("eilidh's mum"); after "its", "tell", "me and"; and joined by "and" to a name already found.
In those contexts a lower-case word is a name when the name lists hold it (nicknames included)
and it is no everyday word, or, in the strongest contexts, when it is no frequent English word
at all (`known_words`): a name the lists lack, "ngozi", "oluwaseun".
"""

from __future__ import annotations

import re
from typing import Protocol

from agents.pii.base import CASUAL_WORDS, NOT_NAMES, STOP_WORDS, Lexicon, norm

RELATIONS = (  # "mother in law" before "mother": the longer wins
    r"(?:mother|father|sister|brother|son|daughter)[\s-]in[\s-]law"
    r"|mother|mom|mum|mommy|mummy|mama|father|dad|daddy|papa|son|daughter|wife|husband|partner|spouse"
    r"|fianc[ée]e?|boyfriend|girlfriend|brother|sister|grandma|grandmother|granny|nana|grandpa"
    r"|grandfather|grandson|granddaughter|aunt|auntie|uncle|niece|nephew|cousin|friend|neighbou?r"
    r"|baby|child|kid|toddler|carer|caregiver|roommate|flatmate|colleague|coworker|boss|landlord"
    r"|gp|physician|surgeon|therapist|dentist|pharmacist|midwife|patient|pt|resident|client|stepson"
    r"|stepdaughter|stepmother|stepfather"
    r"|mate|bf|gf|hubby|wifey|missus|bestie|housemate|classmate|teammate|boy|girl|kiddo|twin"
    r"|bro|sis|grandad|granddad|stepdad|stepmum|stepmom|godson|goddaughter|other\s+half"
    r"|(?:little|youngest|eldest|oldest|middle|older|younger|baby)\s+one|youngest|eldest|oldest"
    r"|lodger|tenant|nanny|tutor|teacher|coach|physio|counsell?or|childminder|babysitter"
    r"|(?:support|care|key|social)\s+worker"
)
_RELATION = rf"(?:{RELATIONS})(?:s|es|ren)?"  # my kids, my boys, my children
# Who signs before their name: "love, nana jean", "cheers, big ted", "your lil sam".
_KIN = (
    r"(?:nana|grandma|granny|grandpa|grandad|mum|mom|mam|dad|auntie|aunt|uncle|your|ur|big|lil"
    r"|little|old|young)"
)
_ADDRESSEES = r"(?:doc|docs|doctor|nurse|team|all|everyone|guys|folks|there|mate|sir|madam)"
# Who is called something: "she's called", "a nurse called", "his name is".
_PERSON = (
    r"(?:he|she|they|(?:{r})|baby|one|nurse|doctor|dr|consultant|paramedic|receptionist|guy|man"
    r"|woman|lady|bloke|chap|person|someone|somebody)".replace("{r}", RELATIONS)
)
_TITLE = r"(?:dr|doctor|mr|mrs|ms|miss|mx|prof|nurse|sister|midwife|consultant)"


class Token(Protocol):
    start: int
    end: int
    text: str


def _strong(text: str, token: Token, lex: Lexicon) -> bool:
    """A listed first name (no everyday word), or no English word at all."""
    return _lower_name(token.text, lex, unknown_ok=True, everyday_ok=False)


def _beside_relation(text: str, token: Token, lex: Lexicon) -> bool:
    """After "my son": a name, unless a frequent word goes on as something else ("my gp said
    to", "my partner, male, 40")."""
    if token.text in _DESCRIPTORS:
        return False
    if _set_off_nickname(text, token, lex):
        return True
    if not _strong(text, token, lex):
        return False
    return not lex.is_known(token.text) or _SUBJECT_GOES_ON.match(text, token.end) is not None


def _signature(text: str, token: Token, lex: Lexicon) -> bool:
    return _lower_name(token.text, lex, unknown_ok=True, everyday_ok=True)


def _listed(text: str, token: Token, lex: Lexicon) -> bool:
    return _lower_name(token.text, lex, unknown_ok=False, everyday_ok=False)


def _weak(text: str, token: Token, lex: Lexicon) -> bool:
    """A listed name that is also a frequent word must end its clause: "its sam again", not
    "from experience" or "with almond"."""
    return _listed(text, token, lex) and (
        not lex.is_known(token.text) or _CLAUSE_END.match(text, token.end) is not None
    )


def _introduced(text: str, token: Token, lex: Lexicon) -> bool:
    """`i'm nikos btw,`, `its uche again`: a weak cue, but a name the lists lack may follow when
    it ends the clause and does not read as a state (`i'm dizzy.`, `i'm asthmatic,`)."""
    if _weak(text, token, lex):
        return True
    return (
        _strong(text, token, lex)
        and _INTRODUCED.match(text, token.end) is not None
        and not _STATE.search(token.text)
    )


def _after_title(text: str, token: Token, lex: Lexicon) -> bool:
    """`dr patel`, `dr mbeki said`, `mrs oyelaran`; not `dr said` or `dr appt tomorrow` (after
    a doctor or a nurse a word the lists lack is a name only where a name's verb follows)."""
    word = token.text
    if not word.islower() or lex.is_known(word) or word in CASUAL_WORDS:
        return False
    if lex.is_name(word) or (
        _strong(text, token, lex)
        and _PERSON_TITLE.search(text[max(0, token.start - 6) : token.start])
    ):
        return True
    return _strong(text, token, lex) and _NAME_FOLLOWS.match(text, token.end) is not None


# Contexts for a lower-case name: (cue ending right before the name, what the word after it
# must be to be taken as a name (the checks above), words without which the cue cannot match).
_LOWER_CUES = [
    (  # my son jake, our baby noah, my little brother jimmy, my wife, fatima, my son (fintan)
        re.compile(
            rf"(?i)\b(?:my|our|his|her|their)\s+(?:[a-z0-9'’-]+\s+){{0,2}}(?:step-?)?{_RELATION}\b"
            r"(?:\s+(?:is\s+)?(?:called|named))?\s*[,:(-]?\s*"
        ),
        _beside_relation,
        (),
    ),
    (  # a signature ending the message: thx, chuy / love, nana jean / - bill / x, ruthie
        re.compile(
            rf"(?i)(?:\b(?:thx|thanks|thank\s+you|ty|ta|cheers|love|xx+|xo(?:xo)*|regards|best|from)"
            rf"(?:\s+(?:so|very)\s+much|\s+a\s+lot|\s+again|\s+for\s+(?:\w+\s+){{0,2}}?\w+,)?"
            rf"[,!.]*\s+(?:{_KIN}\s+)?|(?:^|(?<=[.!?\n]))\s*x+[,!.]*\s+|(?:^|\s)[-—–~]\s*)"
            rf"(?!{_ADDRESSEES}\b)(?=[a-zà-ÿ][\w'’-]*\s*[.!x]*\s*$)"
        ),
        _signature,
        (),
    ),
    (  # she's called precious, a nurse called bronwyn, the baby is named ava
        re.compile(
            rf"(?i)\b(?:(?:is|was|am|are|be)|{_PERSON}(?:'s|’s|\s+is|\s+was|\s+are)?)\s+"
            r"(?:called|named)\s+"
        ),
        _strong,
        ("called", "named"),
    ),
    (re.compile(rf"(?i)\b{_TITLE}\.?\s+"), _after_title, ()),  # dr mbeki, nurse agnieszka
    (re.compile(r"(?i)\bme\s+(?:and|n|&)\s+"), _listed, ("me",)),
    (  # hi sarah, / hey jo! (not "hi doc")
        re.compile(
            r"(?i)(?:^|(?<=[.!?\n]))\s*(?:hi|hey|hiya|hello|dear|morning)[,!]?\s+"
            rf"(?!{_ADDRESSEES}\b)"
        ),
        _weak,
        (),
    ),
    (re.compile(r"(?i)\b(?:it'?s|i'?m|i\s+am|this\s+is)\s+"), _introduced, ()),
    (re.compile(r"(?i)\b(?:tell|ask|for|with|from)\s+"), _weak, ()),
]
_PERSON_TITLE = re.compile(r"(?i)\b(?:mr|mrs|ms|miss|mx|prof)\.?\s+$")  # no one's job
_NAME_FOLLOWS = re.compile(
    r"\s*(?:[,.!?;:)]|$)|\s+(?:said|says|told|tells|thinks|thought|reckons|wants|wanted|who"
    r"|gave|prescribed|asked|rang|called|saw)\b"
)
# What a person is described as, not called.
_DESCRIPTORS = frozenset("male female man woman boy girl lad lass trans".split())
# A subject going on after its name: "my daughter lily is 6", "my son bill, who".
_SUBJECT_GOES_ON = re.compile(
    r"\s*(?:[,.!?;:)]|$)|(?:'s|’s)?\s+(?:is|was|has|had|keeps|kept|got|gets|can|cant|can't|wont"
    r"|won't|and|who|fell|feels|felt|says|said|woke|seems|looks|been|started|needs)\b"
)
_INTRODUCED = re.compile(r"\s*,|\s+(?:btw|here|again|from|by\s+the\s+way)\b")
# How adjectives and states end (dizzy, asthmatic, nauseous, hypothyroid, housebound).
_STATE = re.compile(r"(?:y|ic|ous|al|ed|ive|ant|ent|less|ful|able|ible|ish|oid|ary|ers|bound)$")
_CLAUSE_END = re.compile(r"\s*(?:[,.!?;:)]|$|\s+(?:again|here)\b)")
_SET_OFF = re.compile(r"\s*(?:[,)]|$|\s+(?:and|&)\s)")  # "my husband, col, has"
_LOWER_HERE = re.compile(r"(?:^|(?<=[.!?\n,]))\s*(?P<value>[a-zà-ÿ][\w'’-]+)\s+here\b")
_LOWER_SUBJECT = re.compile(
    r"(?:^|(?<=[.!?\n]))\s*(?P<value>[a-zà-ÿ][\w'’-]+?)(?:(?:'s|’s)?\s+(?:has|had|is|was|been"
    r"|says|said|called|rang|texted|fainted|fell|ate|keeps|got|woke|from|cant|can't|wont|won't"
    r"|doesnt|does|did|feels|felt|thinks|wants|needs)\b|(?:'s|’s)\s+[a-z])"
)  # "elena's rash": whose, opening a sentence
# "dawit and me both", "jakub & i": someone beside the writer, opening a sentence
_WITH_ME = re.compile(
    r"(?:^|(?<=[.!?\n]))\s*(?P<value>[a-zà-ÿ][\w'’-]+)\s+(?:and|n|&)\s+(?:me|i|myself)"
    r"(?:'ve|’ve|'re|’re)?\s+(?:both|all|have|had|are|were|went|got|caught)\b"
)
# "eilidh's mum", "sarah's phone": the owner of a relation or of a way to reach them
_OWNER = re.compile(
    rf"(?i)\b(?P<value>[a-zà-ÿ][\w-]+)(?:'s|’s)\s+(?:{_RELATION}|phone|mobile|number|email|school"
    r"|nursery|room|house|flat|place)\b"
)
# "my name is jan kowalczyk", "her name's yasmin", "name: fernando ruiz": up to three words
_NAME_IS = re.compile(
    rf"(?i)(?:\b(?:my|his|her|their|your|ur|(?:{RELATIONS})(?:'s|’s))\s+name(?:\s+is|'s|’s|\s*:)"
    r"|(?:^|(?<=[.!?\n]))\s*(?:full\s+|first\s+|patient\s+)?name(?:\s+is|\s*:))\s*"
    r"(?P<value>[a-zà-ÿ][\w'’-]*(?:\s+[a-zà-ÿ][\w'’-]*){0,2})"
)
_JOINED = re.compile(r"(?:\s*,\s*|\s+(?:and|&|n)\s+)(?P<value>[a-zà-ÿ][\w'’-]+)")


def casual_names(text: str, tokens: list[Token], lex: Lexicon) -> list[tuple[int, int, float]]:
    """Lower-case names in the contexts of the module docstring, as (start, end, score)."""
    out = []
    at = {t.start: t for t in tokens}
    low = text.lower()
    for pattern, check, hints in _LOWER_CUES:
        if hints and not any(h in low for h in hints):
            continue  # most messages name no one "called" anything: skip the scan
        for match in pattern.finditer(text):
            token = at.get(match.end())
            if token is not None and check(text, token, lex):
                out.append((token.start, token.end, 0.75))
    for match in _LOWER_HERE.finditer(text):
        if _lower_name(match.group("value"), lex, unknown_ok=True, everyday_ok=False):
            out.append((*match.span("value"), 0.7))
    for match in _LOWER_SUBJECT.finditer(text):  # listed names only: "fever has" stays
        word = match.group("value")
        if _lower_name(word, lex, unknown_ok=False, everyday_ok=False) and not lex.is_known(word):
            out.append((*match.span("value"), 0.7))
    for pattern in (_WITH_ME, _OWNER):
        for match in pattern.finditer(text):
            word = match.group("value")
            if not _relation(word) and _lower_name(word, lex, unknown_ok=True, everyday_ok=False):
                out.append((*match.span("value"), 0.7))
    out += _named(text, lex) if "name" in low else []
    return out + _joined(text, out, lex)


def _lower_name(word: str, lex: Lexicon, unknown_ok: bool, everyday_ok: bool) -> bool:
    """A lower-case word that can be a name where the context says one is due: a listed first
    name (no everyday word unless `everyday_ok`), or with `unknown_ok` no English word at all."""
    if not word.islower() or len(word) < 2 or norm(word) in NOT_NAMES or word in STOP_WORDS:
        return False
    if re.fullmatch(_TITLE, word):  # "my neighbour mrs oyelaran": the name is the next word
        return False
    if "-" in word.strip("-"):  # ruby-mae, jean-luc: every part a listed first name
        return all(lex.is_first(part) for part in word.split("-"))
    if word in CASUAL_WORDS or (not everyday_ok and lex.is_everyday(word)):
        return False
    if lex.is_first(word):
        return True
    return (
        unknown_ok
        and len(word) >= 3
        and word.isalpha()
        and not lex.is_known(word)
        and not lex.is_common(word)
    )


def _set_off_nickname(text: str, token: Token, lex: Lexicon) -> bool:
    """`my husband, col, has`: a short word set off by commas or brackets beside a relation is
    a nickname, even when it is also a word (not "my son, also," or "my mum, ok,")."""
    before = text[max(0, token.start - 2) : token.start]
    return (
        ("," in before or "(" in before)
        and token.text.isalpha()
        and token.text.islower()
        and 2 <= len(token.text) <= 4
        and token.text not in STOP_WORDS
        and token.text not in CASUAL_WORDS
        and not lex.is_everyday(token.text)
        and not _relation(token.text)
        and _SET_OFF.match(text, token.end) is not None
    )


def _relation(word: str) -> bool:
    return re.fullmatch(_RELATION, word, re.IGNORECASE) is not None


def _named(text: str, lex: Lexicon) -> list[tuple[int, int, float]]:
    """After "my name is": each word a listed name (a month's name too: "jan") or no word."""
    out = []
    for match in _NAME_IS.finditer(text):
        pos = match.start("value")
        for word in match.group("value").split():
            start = text.index(word, pos)
            pos = start + len(word)
            word = word.rstrip("'’")
            if word in STOP_WORDS or word in CASUAL_WORDS or not word.isalpha():
                break
            if not (lex.is_name(word) or _lower_name(word, lex, True, False)):
                break
            out.append((start, start + len(word), 0.8))
    return out


def _joined(text: str, found: list[tuple[int, int, float]], lex: Lexicon) -> list[tuple]:
    """`ella and eva`, `sami, omar`: a name joined to a lower-case name already found."""
    out = []
    for _start, end, _score in found:
        match = _JOINED.match(text, end)
        if match and _lower_name(match.group("value"), lex, unknown_ok=True, everyday_ok=False):
            out.append((*match.span("value"), 0.7))
    return out
