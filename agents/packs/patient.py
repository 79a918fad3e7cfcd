"""Who is ill, and what they measured: what a patient's message says beside its symptoms.

The triage rules read a `Profile` as well as the symptoms: an age (`3-week-old`, `aged 72`,
`my 6 month old`, `newborn`; a reply to the age question, `Age: 3 weeks`), whether the person
is a child, pregnancy (`34 weeks pregnant`, `not pregnant`, `Pregnant: yes`) and whether the
message says the person is female, and readings in either unit system: temperature (°C or
°F), blood glucose (mmol/L or mg/dL; a bare number is read by its size), oxygen saturation
blood pressure, and how many tablets were taken at once. A number is only read as a reading next to the words that name it, so a
date or a dose is not a temperature. Conditions and medicines are phrase groups of the
rules file, matched with negation by `agents.packs.red_flags`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NUMBER_WORDS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
} | {"a": 1, "an": 1}
UNIT_MONTHS = {"day": 1 / 30.4, "week": 12 / 52, "month": 1.0, "year": 12.0}


def _number_pattern(words: list[str]) -> str:
    """A number in digits or as one of `words` (longest first), as a regex group."""
    return r"(\d+(?:[.,]\d+)?|" + "|".join(sorted(words, key=len, reverse=True)) + r")"


_NUM = _number_pattern(list(NUMBER_WORDS))
_NUM_STRICT = _number_pattern([w for w in NUMBER_WORDS if len(w) > 2])  # no "a" or "an"
_UNIT = r"(day|week|wk|month|mo|mth|year|yr)s?"
_AGE_OLD = re.compile(rf"\b{_NUM}\s*-?\s*{_UNIT}\s*-?\s*olds?\b")
_AGE_LABEL = re.compile(rf"\bage[sd]?\s*(?::|is|of)?\s*{_NUM_STRICT}(?:\s*{_UNIT})?\b")
_AGE_IS = re.compile(
    rf"\b(?:i am|im|i'm|he is|hes|he's|she is|shes|she's|they are|theyre|is)\s+{_NUM_STRICT}\b"
    r"(?!\s*(?:%|c\b|f\b|°|degrees|mmol|mg|kg|lb|st\b|stone|minutes|mins|hours|hrs|days|"
    r"weeks|months|times|x\b|/|\.\d|,\d|pills|tablets|percent|points|cm|mm|bpm))"
)
_AGE_YO = re.compile(rf"\b{_NUM_STRICT}\s*(?:yo|y/o|y\.o\.?|yrs? old|year old)\b")
_AGE_FOLLOW = re.compile(
    r"\b(?:baby|son|daughter|child|he|she|they|newborn|infant|toddler|kid|boy|girl)\s+"
    rf"(?:is|was)\s+(?:only\s+|just\s+)?{_NUM}\s*{_UNIT}\b(?!\s*(?:pregnant|ago))"
)
NEWBORN = re.compile(r"\bnew\s*-?\s*born\b|\bneonate\b")
CHILD = re.compile(
    r"\b(?:baby|babies|newborn|infant|toddler|child|children|kid|kids|son|daughter|boy|girl|"
    r"little one|grandson|granddaughter|nephew|niece)\b"
)
FEMALE = re.compile(
    r"\b(?:she|her|hers|woman|women|female|girl|wife|girlfriend|daughter|mum|mom|mother|"
    r"sister|niece|granddaughter|period|periods|menstrua\w*|i am a woman|im a woman)\b"
)
MALE_ONLY = re.compile(r"\b(?:i am a man|im a man|i'm a man|male|my husband|my son|he|him)\b")
_PREGNANT = re.compile(r"\bpregnan\w*|\bexpecting a baby\b|\bweeks gone\b|\bweeks along\b")
_NOT_PREGNANT = re.compile(
    r"\b(?:not|never|isnt|isn't|am not|im not|i'm not|no chance of being|cant be|can't be|"
    r"cannot be)\s+(?:\w+\s+){0,2}pregnan\w*|\bpregnant\s*:\s*(?:no|not|nope)\b|"
    r"\bnot\s+expecting\b"
)
_PREGNANT_YES = re.compile(r"\bpregnant\s*:\s*(?:yes|yeah|yep|maybe|possibly|i think so|might)\b")
_DURATION = re.compile(
    r"\b(?:since|ago|yesterday|today|tonight|this morning|this afternoon|this evening|last "
    r"(?:night|week|month|year)|for (?:a|an|the|\d+|one|two|three|four|five|six|seven|eight|"
    r"nine|ten|a few|a couple|several|weeks|days|months|ages|a while)|all day|all night|"
    r"every|most days|keeps? coming back|comes? and goes|on and off|always|ongoing|chronic|"
    r"hours?|days?|weeks?|months?|years?|minutes?|mins?|how long\s*:)\b"
)


def _number(text: str) -> float:
    return float(NUMBER_WORDS[text]) if text in NUMBER_WORDS else float(text.replace(",", "."))


@dataclass(frozen=True)
class Profile:
    """What a message says about the person who is ill (None: it does not say)."""

    age_months: float | None
    child: bool
    pregnant: bool | None
    female: bool
    male: bool
    temperature: float | None  # °C
    glucose: float | None  # mmol/L
    spo2: float | None  # %
    systolic: float | None  # mmHg
    diastolic: float | None
    tablets: float | None  # tablets or pills taken at once
    duration_known: bool

    def reading(self, kind: str) -> float | None:
        return getattr(self, kind)

    @property
    def could_be_pregnant(self) -> bool:
        """Said to be female, of an age that can be pregnant, and pregnancy not stated."""
        if self.pregnant is not None or not self.female or self.male:
            return False
        return self.age_months is None or 12 * 12 <= self.age_months <= 55 * 12


def profile(message: str) -> Profile:
    """The `Profile` of a patient's message (lower-cased and read once)."""
    text = re.sub(r"[’`]", "'", (message or "").lower())
    age = age_months(text)
    child = bool(CHILD.search(text)) or (age is not None and age < 16 * 12)
    if age is not None and age >= 16 * 12:
        child = False
    systolic, diastolic = blood_pressure(text)
    return Profile(
        age_months=age,
        child=child,
        pregnant=pregnancy(text),
        female=bool(FEMALE.search(text)),
        male=bool(MALE_ONLY.search(text)) and not FEMALE.search(text),
        temperature=temperature(text),
        glucose=glucose(text),
        spo2=oxygen(text),
        systolic=systolic,
        diastolic=diastolic,
        tablets=tablets(text),
        duration_known=bool(_DURATION.search(text)),
    )


def age_months(text: str) -> float | None:
    """The first age the text gives, in months (`newborn`: half a month)."""
    for pattern in (_AGE_OLD, _AGE_LABEL, _AGE_FOLLOW):
        if m := pattern.search(text):
            return _number(m.group(1)) * UNIT_MONTHS[_unit(m.group(2) or "year")]
    if NEWBORN.search(text):
        return 0.5
    for pattern in (_AGE_YO, _AGE_IS):
        if (m := pattern.search(text)) and 1 <= _number(m.group(1)) <= 120:
            return _number(m.group(1)) * 12
    return None


def _unit(word: str) -> str:
    return {"d": "day", "w": "week", "m": "month"}.get(word[0], "year")


def pregnancy(text: str) -> bool | None:
    """True when the text says the person is pregnant, False when it says not, else None."""
    if _NOT_PREGNANT.search(text):
        return False
    if _PREGNANT_YES.search(text):
        return True
    if _PREGNANT.search(text):
        return True
    return None


_TEMP_UNIT = re.compile(
    r"\b(\d{2,3}(?:[.,]\d+)?)\s*(?:°|º|deg(?:rees?)?)?\s*(c|f|celsius|centigrade|fahrenheit)\b"
)
_TEMP_WORD = re.compile(
    r"\b(?:temp|temperature|fever|thermometer|temps?)\b[^.\d]{0,25}?(\d{2,3}(?:[.,]\d+)?)"
)


def temperature(text: str) -> float | None:
    """A body temperature in °C (a value above 45 is read as °F), or None."""
    for m in _TEMP_UNIT.finditer(text):
        value, unit = _number(m.group(1)), m.group(2)
        celsius = (value - 32) * 5 / 9 if unit.startswith("f") else value
        if 30 <= celsius <= 45:
            return round(celsius, 1)
    if m := _TEMP_WORD.search(text):
        value = _number(m.group(1))
        celsius = (value - 32) * 5 / 9 if value > 45 else value
        if 30 <= celsius <= 45:
            return round(celsius, 1)
    return None


_GLUCOSE_UNIT = re.compile(r"\b(\d{1,4}(?:[.,]\d+)?)\s*(mmol(?:/l)?|mg\s*/?\s*dl)\b")
_GLUCOSE_WORD = re.compile(
    r"\b(?:sugar|sugars|glucose|bg|bm|blood sugar reading|reading|readings|level|levels|meter|"
    r"monitor|finger prick)\b"
    r"[^.\d]{0,25}?(\d{1,4}(?:[.,]\d+)?)(?!\s*(?:%|°|degrees|c\b|f\b|/\d))"
)


def glucose(text: str) -> float | None:
    """A blood glucose in mmol/L (mg/dL divided by 18; a bare number above 35 is mg/dL)."""
    if m := _GLUCOSE_UNIT.search(text):
        value = _number(m.group(1))
        return round(value / 18 if m.group(2).startswith("mg") else value, 1)
    if re.search(r"\b(?:sugar|glucose|diabet\w*|bg|bm|insulin|hypo|blood sugar|type [12])\b", text):
        if m := _GLUCOSE_WORD.search(text):
            value = _number(m.group(1))
            return round(value / 18 if value > 35 else value, 1)
    return None


_SPO2 = re.compile(
    r"\b(?:sats?|saturations?|oxygen(?: level)?|o2|spo2|oximeter|pulse ox)\b[^.\d]{0,25}?"
    r"(\d{2,3})\s*%?|\b(\d{2,3})\s*%\s*(?:oxygen|o2|sats?|saturation|on the oximeter)"
)


def oxygen(text: str) -> float | None:
    """An oxygen saturation in %, or None."""
    if m := _SPO2.search(text):
        value = _number(m.group(1) or m.group(2))
        return value if 50 <= value <= 100 else None
    return None


_BP = re.compile(
    r"\b(?:bp|blood pressure|pressure)\b[^.\d]{0,25}?(\d{2,3})\s*(?:/|over)\s*(\d{2,3})\b"
)


def blood_pressure(text: str) -> tuple[float | None, float | None]:
    """(systolic, diastolic) in mmHg, or (None, None)."""
    if m := _BP.search(text):
        return _number(m.group(1)), _number(m.group(2))
    return None, None


_TABLETS = re.compile(
    r"\b(?:took|taken|take|swallowed|had|ate|eaten|downed|necked|popped)\s+(?:about\s+|around\s+|"
    rf"like\s+|maybe\s+|over\s+|at least\s+|nearly\s+)?{_NUM_STRICT}\s+(?:\w+\s+){{0,2}}?"
    r"(?:tablets|pills|capsules|caps|paracetamol|acetaminophen|tylenol|ibuprofen|aspirin|"
    r"co-codamol|codeine|painkillers|sleeping pills|antidepressants|diazepam|of them)\b"
)


def tablets(text: str) -> float | None:
    """How many tablets or pills the text says were taken at once, or None."""
    if m := _TABLETS.search(text):
        return _number(m.group(1))
    return None
