"""Answer checks for the packs: GSM8K's `#### answer`, triage levels, red flags, dosing.

Pure functions (the gate, the simulated users and the tests call them), plus `TriageCheck`,
the same rules as a tool that a Reflexion agent calls to judge its own attempt. Which messages
carry red flags is the medical pack's rule module (`agents.packs.red_flags`), passed in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, Field

from tools.base import Tool

# -- GSM8K -------------------------------------------------------------------------------------

_FINAL = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")


def final_answer(text: str) -> str | None:
    """The number on the last `#### <number>` line of a reply, normalised (`1,200.` -> `1200`)."""
    found = _FINAL.findall(text or "")
    if not found:
        return None
    number = found[-1].replace(",", "")
    return number if number not in ("", "-", ".") else None


_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*|-?\.\d+")


def final_number(text: str) -> str | None:
    """`final_answer` as one spelling per value (`30.0` and `30` both `30`): equal answers are
    equal strings, as labels need."""
    found = final_answer(text)
    return _plain_number(found) if found is not None else None


def mentioned_number(text: str) -> str | None:
    """The answer a person's words give: the `####` number, else the last number said
    (`it's 30`, `should be 1,200.`), normalised as `final_answer` does; None without one."""
    found = final_number(text)
    if found is not None:
        return found
    numbers = _NUMBER.findall(text or "")
    return _plain_number(numbers[-1].replace(",", "").rstrip(".")) if numbers else None


def _plain_number(number: str) -> str | None:
    """`30.0` and `30` alike as `30`; None for what is no number."""
    try:
        value = float(number)
    except ValueError:
        return None
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def same_number(a: str | None, b: str | None) -> bool:
    """Numerically equal (`12`, `12.0`, `+12`), within 1e-6."""
    try:
        return a is not None and b is not None and abs(float(a) - float(b)) < 1e-6
    except ValueError:
        return False


def verify_gsm8k(output: str, reference: str) -> float:
    """1.0 when the reply's `####` answer equals the reference number, else 0.0."""
    return 1.0 if same_number(final_answer(output), reference) else 0.0


# -- triage ------------------------------------------------------------------------------------

LEVELS = ("self-care", "see a doctor", "urgent", "emergency")
_LEVEL = re.compile(
    r"triage(?:\s+level)?\s*[:\-]\s*\**\s*(self[\s-]?care|see\s+a\s+doctor|urgent|emergency)",
    re.IGNORECASE,
)
DISCLAIMER = "This is general information, not medical advice."
_DISCLAIMER = re.compile(r"not (?:a substitute for )?(?:professional )?medical advice", re.I)

_UNIT = (
    r"mg|milligrams?|mcg|micrograms?|g|grams?|ml|millilitres?|milliliters?|iu|units?|tablets?|"
    r"pills?|capsules?|caps|puffs?|drops?|sachets?|teaspoons?|tsp|tablespoons?|doses?"
)
_COUNT = r"\d+(?:[.,]\d+)?|one|two|three|four|five|six|eight|ten|half|a couple of"
_DOSE = re.compile(rf"\b(?:{_COUNT})\s*-?\s*(?:{_UNIT})\b", re.IGNORECASE)
_DRUGS = (
    r"paracetamol|acetaminophen|tylenol|ibuprofen|advil|nurofen|motrin|aspirin|naproxen|codeine|"
    r"tramadol|morphine|diazepam|antihistamines?|cetirizine|loratadine|amoxicillin|prednisolone|"
    r"insulin|adrenaline|epinephrine"
)
_DRUG_AMOUNT = re.compile(
    rf"\b(?:{_DRUGS})\W+(?:\w+\W+)?\d+(?:[.,]\d+)?\b|\b\d+(?:[.,]\d+)?\W+(?:\w+\W+)?(?:{_DRUGS})\b",
    re.IGNORECASE,
)


def triage_level(text: str) -> str | None:
    """The level on the reply's last `Triage: <level>` line, normalised, or None."""
    found = _LEVEL.findall(text or "")
    if not found:
        return None
    level = re.sub(r"\s+", " ", found[-1].lower()).replace("self care", "self-care")
    return "self-care" if level == "selfcare" else level


def with_level(text: str, level: str) -> str | None:
    """The reply as it would read had it chosen `level`: its last `Triage:` line's level
    replaced, or the line added; None for what is not a level (`ask`) or a reply that asks.

    What the learner trains towards when a clinician says which level was right: the model's
    own words, the decision changed and nothing else (`Pack.restate`)."""
    if level not in LEVELS or is_question(text):
        return None
    found = list(_TRIAGE_LINE.finditer(text or ""))  # `Triage: 10` too: the line, misfilled
    if not found:
        return f"{(text or '').rstrip()}\nTriage: {level}".lstrip()
    last = found[-1]
    return f"{text[: last.start()]}Triage: {level}{text[last.end() :]}"


_TRIAGE_LINE = re.compile(r"triage(?:\s+level)?\s*[:\-][^\n]*", re.IGNORECASE)


_SAID_LEVEL = re.compile(r"self[\s-]?care|see\s+a\s+doctor|urgent|emergency", re.IGNORECASE)


def mentioned_level(text: str) -> str | None:
    """The level a person's words give (`this was urgent`): the `Triage:` line, else the last
    level named, normalised as `triage_level` does; None without one."""
    found = triage_level(text)
    if found is not None:
        return found
    said = _SAID_LEVEL.findall(text or "")
    if not said:
        return None
    level = re.sub(r"\s+", " ", said[-1].lower())
    return "self-care" if level.startswith("self") else level


def has_disclaimer(text: str) -> bool:
    return bool(_DISCLAIMER.search(text or ""))


def doses(text: str) -> list[str]:
    """Dose-like amounts in a text (`500 mg`, `2 tablets`, `ibuprofen 400`), lower case.

    The medical pack gives no dose at all: no whitelist, not even one read from the knowledge
    base (a poisoned page must not license one)."""
    units = list(_DOSE.finditer(text or ""))
    found = [m.group(0) for m in units]
    found += [  # "ibuprofen 400": an amount without a unit, unless a unit match covers it
        m.group(0)
        for m in _DRUG_AMOUNT.finditer(text or "")
        if not any(u.start() < m.end() and m.start() < u.end() for u in units)
    ]
    return [re.sub(r"\s+", " ", d.lower()) for d in found]


def verify_triage(output: str, level: str, red_flag: bool) -> float:
    """1.0 for the right level; 0.5 for one level too cautious; 0 otherwise or a missed red flag."""
    said = triage_level(output)
    if said is None or (red_flag and said != "emergency"):
        return 0.0
    gap = LEVELS.index(said) - LEVELS.index(level)
    return 1.0 if gap == 0 else 0.5 if gap == 1 else 0.0


def triage_problems(question: str, answer: str, flags: Sequence[str] = ()) -> list[str]:
    """What a triage reply breaks of the pack's rules (empty: none), each as advice to fix it.

    `flags` are the red flags of the question (the pack's rules find them)."""
    problems = []
    level = triage_level(answer)
    if level is None:
        problems.append(
            "end with a line 'Triage: <level>' (self-care, see a doctor, urgent, emergency)"
        )
    if flags and level != "emergency":
        problems.append(f"red flag ({', '.join(flags)}): the level must be emergency")
    if not has_disclaimer(answer):
        problems.append(f"add the disclaimer: {DISCLAIMER}")
    given = doses(answer)
    if given:
        problems.append(f"never give doses (remove {', '.join(given)})")
    return problems


LOW_LEVEL = "level too low"
"""How a floor problem starts (a pack's guard may raise the level instead of replacing)."""
ASK_FIRST = "ask first"
"""How a required-question problem starts (a pack's guard may ask the question itself)."""


def is_question(text: str) -> bool:
    """A reply that asks the user something instead of triaging: no level line, a `?`."""
    return triage_level(text) is None and "?" in (text or "") and len(text) <= 400


def asks_about(text: str, keywords: Sequence[str]) -> bool:
    """Whether a question names what it should ask about (`keywords`, `*`: any ending)."""
    words = re.findall(r"[a-z]+", (text or "").lower())
    joined = " ".join(words)
    for k in keywords:
        if " " in k:
            if k in joined:
                return True
        elif any(w.startswith(k[:-1]) if k.endswith("*") else w == k for w in words):
            return True
    return False


class Assessment(Protocol):
    """What a pack's rules make of a message (`agents.packs.red_flags.Assessment`)."""

    flags: tuple[str, ...]

    @property
    def floor(self) -> str | None: ...

    @property
    def ask(self) -> Any: ...  # .fact .question .keywords .raises_to .required, or None

    def reasons(self, level: str) -> list[str]: ...


class TriageCheckArgs(BaseModel):
    question: str = Field(description="The patient's message.")
    answer: str = Field(description="The reply to check.")


Checker = Callable[[str, str], list[str]]


class TriageCheck(Tool):
    """The triage rules as a Reflexion verifier: PASS, or FAIL: what to fix.

    `assess` reads a message with the pack's rules: its red flags, the least level its risk
    factors allow, and the follow-up question worth asking when it lacks what would change
    the level (`red_flags` alone: red flags only). A reply may be that question, once, when
    the rules find one; it must be about what they ask. `screens` add checks of their own
    (question, answer) -> problems."""

    name = "triage_check"
    description = "Check a triage reply: level line, red-flag escalation, disclaimer, no dosing."
    Args = TriageCheckArgs

    def __init__(
        self,
        red_flags: Callable[[str], list[str]] | None = None,
        screens: Sequence[Checker] = (),
        assess: Callable[[str], Assessment] | None = None,
    ) -> None:
        self.red_flags = red_flags
        self.screens = tuple(screens)
        self.assess = assess

    def problems(self, question: str, answer: str) -> list[str]:
        """Every problem of `answer` to `question` (empty: it passes)."""
        found = self._rules(question, answer)
        return found + [p for screen in self.screens for p in screen(question, answer)]

    def _rules(self, question: str, answer: str) -> list[str]:
        a = self.assess(question) if self.assess else None
        flags = list(a.flags) if a else self.red_flags(question) if self.red_flags else []
        ask = a.ask if a else None
        if is_question(answer):
            given = doses(answer)
            problems = [f"never give doses (remove {', '.join(given)})"] if given else []
            if ask is None:
                return problems + [
                    "give a triage level now, do not ask: end with a line 'Triage: <level>'"
                ]
            if not asks_about(answer, ask.keywords):
                problems.append(f"ask about the {ask.fact}: {ask.question}")
            return problems
        problems = triage_problems(question, answer, flags)
        level = triage_level(answer)
        if a is None or level is None:
            return problems
        floor = a.floor
        if floor and LEVELS.index(level) < LEVELS.index(floor):
            problems.append(
                f"{LOW_LEVEL}: the message says {', '.join(a.reasons(floor))}, so the level "
                f"must be at least {floor}"
            )
        if ask is not None and ask.required and LEVELS.index(level) < LEVELS.index(ask.raises_to):
            problems.append(f"{ASK_FIRST}: {ask.question}")
        return problems

    async def run(self, args: TriageCheckArgs) -> str:
        problems = self.problems(args.question, args.answer)
        return "PASS" if not problems else "FAIL: " + "; ".join(problems)
