"""The triage pack's rules as data: `data/triage_discriminators.toml`, loaded and checked.

The file holds discriminators from published triage lists (NHS 111 and 999 pages, NICE
guidelines, WHO ETAT, the Manchester Triage System), each naming its source: the red flags
(level `emergency`), the floors set by who is ill and what they measured (`urgent`,
`see a doctor`), and the follow-up questions worth asking when a message lacks what would
change the level. `agents.packs.red_flags` applies them; this module only reads the file and
refuses one that does not hold together (an unknown source, group, level or condition).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tools.verifiers import LEVELS

DATA = Path(__file__).parent / "data" / "triage_discriminators.toml"
WHO_KEYS = frozenset(
    "age_below_months age_at_least_months age_at_least_years child pregnant condition "
    "age_known could_be_pregnant glucose_known symptom_known duration_known minor_ailment".split()
)
READINGS = frozenset(("temperature", "glucose", "spo2", "systolic", "diastolic", "tablets"))

Groups = tuple[tuple[str, ...], ...]
"""Phrase groups: every group needs one of its phrases (`*` at a word's end: any ending)."""


@dataclass(frozen=True)
class Reading:
    """A measurement bound: `kind` in its canonical unit, `at_least` or `below`."""

    kind: str
    at_least: float | None = None
    below: float | None = None

    def holds(self, value: float | None) -> bool:
        if value is None:
            return False
        if self.at_least is not None and value < self.at_least:
            return False
        return self.below is None or value < self.below


@dataclass(frozen=True)
class Rule:
    """One discriminator: the least `level` a message it fits may get, and its `source`."""

    flag: str
    level: str
    source: str
    all: Groups = ()  # in one sentence
    also: Groups = ()  # anywhere in the message
    who: tuple[tuple[str, Any], ...] = ()
    reading: Reading | None = None


@dataclass(frozen=True)
class Ask:
    """A follow-up question: worth asking when `when` holds and `fact` is unknown."""

    fact: str
    label: str
    source: str
    question: str
    keywords: tuple[str, ...]
    raises_to: str
    when: Groups = ()
    who: tuple[tuple[str, Any], ...] = ()

    @property
    def required(self) -> bool:
        """Whether an answer below `raises_to` must ask first (the answer could be urgent)."""
        return LEVELS.index(self.raises_to) >= LEVELS.index("urgent")


@dataclass(frozen=True)
class Rules:
    sources: dict[str, str]
    conditions: dict[str, tuple[str, ...]]
    advice: dict[str, str]
    rules: tuple[Rule, ...]
    asks: tuple[Ask, ...]
    groups: dict[str, tuple[str, ...]]


@cache
def rules() -> Rules:
    """The rules file, parsed and checked (once per process)."""
    return parse(tomllib.loads(DATA.read_text(encoding="utf-8")))


def parse(data: dict[str, Any]) -> Rules:
    """`Rules` from the file's tables; ValueError naming the entry that does not hold."""
    raw = {k: tuple(v.split("|")) for k, v in data.get("groups", {}).items()}
    named = {k: _expand("|".join(v), raw) for k, v in raw.items()}
    sources = dict(data["sources"])
    conditions = {k: tuple(v.split("|")) for k, v in data.get("conditions", {}).items()}
    advice = dict(data.get("advice", {}))

    def groups(items: list[str]) -> Groups:
        return tuple(_expand(item, named) for item in items)

    def who(entry: dict[str, Any], where: str) -> tuple[tuple[str, Any], ...]:
        found = dict(entry.get("who", {}))
        if unknown := set(found) - WHO_KEYS:
            raise ValueError(f"{where}: unknown who keys {sorted(unknown)}")
        if "condition" in found and found["condition"] not in conditions:
            raise ValueError(f"{where}: unknown condition {found['condition']!r}")
        return tuple(sorted(found.items()))

    out = []
    for i, entry in enumerate(data.get("rule", [])):
        where = f"rule {i} ({entry.get('flag')})"
        if entry.get("source") not in sources or entry.get("level") not in LEVELS:
            raise ValueError(f"{where}: needs a known source and a level of {LEVELS}")
        if entry["level"] == "emergency" and entry["flag"] not in advice:
            raise ValueError(f"{where}: an emergency flag needs an [advice] entry")
        reading = entry.get("reading")
        if reading is not None and reading.get("kind") not in READINGS:
            raise ValueError(f"{where}: reading kind must be one of {sorted(READINGS)}")
        r = Rule(
            entry["flag"],
            entry["level"],
            entry["source"],
            groups(entry.get("all", [])),
            groups(entry.get("also", [])),
            who(entry, where),
            Reading(**reading) if reading else None,
        )
        if not (r.all or r.also or r.who or r.reading):
            raise ValueError(f"{where}: a rule needs at least one part")
        out.append(r)
    asks = []
    for entry in data.get("ask", []):
        where = f"ask {entry.get('fact')}"
        if entry.get("source") not in sources or entry.get("raises_to") not in LEVELS:
            raise ValueError(f"{where}: needs a known source and raises_to of {LEVELS}")
        asks.append(
            Ask(
                entry["fact"],
                entry["label"],
                entry["source"],
                entry["question"],
                tuple(entry["keywords"].split("|")),
                entry["raises_to"],
                groups(entry.get("when", [])),
                who(entry, where),
            )
        )
    return Rules(sources, conditions, advice, tuple(out), tuple(asks), named)


def _expand(
    item: str, named: dict[str, tuple[str, ...]], seen: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """A group written `NAME|phrase|...`: names of [groups] expand to their phrases (a group
    may name other groups; a circle is refused)."""
    out: list[str] = []
    for part in item.split("|"):
        if part.isupper() and part.replace("_", "").isalpha():
            if part not in named:
                raise ValueError(f"unknown group {part!r}")
            if part in seen:
                raise ValueError(f"group {part!r} names itself")
            out.extend(_expand("|".join(named[part]), named, (*seen, part)))
        else:
            out.append(part)
    return tuple(dict.fromkeys(out))
