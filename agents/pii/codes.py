"""The shape of a code: what an identifier looks like, and what a clinical number looks like.

A code mixes letters and digits (`AB12-3345X`, `4B-119`, `gp/22/0417`), or runs to seven digits
or more, or splits six or more digits into groups (`30-118-442`). A clinical number is none of
these however it is written: a dose (`2.5 mg`, `2x500mg`), a reading (`38.4`, `120/80`, `7/10`,
`5.6-7.8`, `3:30`), a staging or a lab name (`T2N0M0`, `CA-125`, `HbA1c`).
"""

from __future__ import annotations

import re

UNIT = (
    r"(?:mg|mcg|ug|g|kg|ml|l|iu|units?|mmhg|mmol|bpm|cm|mm|m|km|lbs?|oz|c|f|h|hrs?|mins?|s|x|am|pm"
    r"|yo|st|nd|rd|th|%)"
)
UNIT_NUMBER = re.compile(rf"^\d+(?:[.,]\d+)?{UNIT}$", re.IGNORECASE)
_NUMBER = r"\d{1,3}(?:[.,]\d+)?"
# 38.4, 120/80, 7/10, 5.6-7.8, 3:30, 2 x 500 mg, 5/325, 88-90, < 5: readings, doses, times
_MEASURE = re.compile(
    rf"^[<>~≤≥]?\s*{_NUMBER}\s*{UNIT}?(?:\s*(?:[-–/:x]|to)\s*{_NUMBER}\s*{UNIT}?)?"
    rf"(?:\s*/\s*[a-z]+)?$|^\d+(?:[.,]\d+)?\s*x\s*\d+(?:[.,]\d+)?\s*{UNIT}?$",
    re.IGNORECASE,
)
# COVID-19, CA-125, 3rd, 120-page, 10-year-old, T2N0M0, CYP2D6: names and compounds, no codes
# (7781-XK is one: no word after its digits)
MEDICAL_CODE = re.compile(
    r"^[A-Za-z]{1,6}-\d{1,3}$|^\d+(?:st|nd|rd|th)$|^\d+-[a-z]*[aeiouy][a-z]+(?:-[a-z]+)*$"
    r"|^[pcy]?T[0-4xis][a-d]?N[0-3x][a-c]?M[01x]$|^CYP\d{1,2}[A-Z]\d{1,2}$",
    re.IGNORECASE,
)
_LAB = re.compile(rf"^[A-Za-z]{{1,8}}\s*:?\s*{_NUMBER}\s*{UNIT}?$", re.IGNORECASE)  # LDL 160
_YEAR = re.compile(r"^(?:19|20)\d{2}$")
_DATE = re.compile(
    r"^(?:0?[1-9]|[12]\d|3[01])[/.-](?:0?[1-9]|[12]\d|3[01])[/.-](?:\d{2}|(?:19|20)\d{2})$"
    r"|^(?:19|20)\d{2}[/.-](?:0?[1-9]|1[0-2])[/.-](?:0?[1-9]|[12]\d|3[01])$"
)


def is_measure(value: str) -> bool:
    """A dose, a reading, a score, a time or a range: a number the medical pack needs."""
    value = value.strip()
    return bool(_MEASURE.match(value) or UNIT_NUMBER.match(value.replace(" ", "")))


def plausible_code(value: str) -> bool:
    """What a cue ("MRN", "my wristband says") may name: four characters or more, and no
    reading, year or date (the date recogniser keeps a date's year)."""
    core = re.sub(r"[^A-Za-z0-9]", "", value)
    value = value.strip()
    return (
        len(core) >= 4
        and not is_measure(value)
        and not _YEAR.match(value)
        and not _DATE.match(value)
    )


def code_shape(value: str) -> bool:
    """A code by its shape alone, with no cue: see the module docstring."""
    parts = [p for p in re.split(r"[\s/_.:-]+", value) if p]
    if not parts or is_measure(value) or MEDICAL_CODE.match(value) or _LAB.match(value):
        return False
    if all(not any(c.isdigit() for c in p) or UNIT_NUMBER.match(p) for p in parts):
        return False  # words and doses: 1000mg/day, 4am-6am
    core = re.sub(r"[^A-Za-z0-9]", "", value)
    digits = sum(c.isdigit() for c in core)
    letters = len(core) - digits
    runs = len(re.findall(r"[A-Za-z]+|\d+", core))
    if digits >= 7:
        return True
    if letters and digits >= 2 and len(core) >= 5 and runs >= 3:
        return True  # letters, digits, letters (PX93KD, 4B-119), not covid19
    if letters >= 2 and digits >= 3 and len(core) >= 6:
        return True
    return not letters and len(parts) >= 2 and digits >= 6 and not _ascending(parts)


def _ascending(parts: list[str]) -> bool:
    """`1000-1500`: a range of two numbers of one size, not two groups of a code."""
    return len(parts) == 2 and len(parts[0]) == len(parts[1]) and int(parts[0]) < int(parts[1])


# Tokens left over once the recognisers have run: letters and digits, joined by - _ or /.
_TOKEN = re.compile(r"(?<![\w/-])[A-Za-z0-9][A-Za-z0-9_/-]*[A-Za-z0-9](?![\w/-])")


def leftover_codes(text: str, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans of code-like tokens no recogniser claimed ("any other unique identifying number")."""
    out = []
    for match in _TOKEN.finditer(text):
        if any(s < match.end() and match.start() < e for s, e in covered):
            continue
        if code_shape(match.group(0)):
            out.append(match.span())
    return out
