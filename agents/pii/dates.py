"""Dates tied to a person (all parts but the year) and ages over 89."""

from __future__ import annotations

import datetime as dt
import re

from agents.pii.base import RegexRecognizer, Rule

_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
    r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_FULL_MONTH = (
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
)
_DAY = r"(?:0?[1-9]|[12]\d|3[01])(?:st|nd|rd|th)?"
_YEAR = r"(?:19|20)\d{2}"
_SEP = r"\s*[/.-]\s*"
# The value group is what is replaced; a trailing year stays readable ("[DATE], 2021").
DATE_RULES = [
    # March 14th, Sept. 22nd 2021, Dec 1 2021, january 9
    Rule(
        "DATE",
        re.compile(rf"(?i)\b(?P<value>{_MONTH}\s*{_DAY})(?![\d:])(?!\s*(?:mg|ml|%|kg))"),
        0.8,
    ),
    # 21st of March, 17 August 2019, 05-Jun-1948, 11 Nov
    Rule(
        "DATE",
        re.compile(rf"(?i)(?<![\d.])(?P<value>{_DAY}(?:\s+of\s+|[\s-]+){_MONTH})(?![a-z])"),
        0.8,
    ),
    # 04/12/1986, 14.03.2024, 7/4/59, 12 / 25 / 1970: day and month, not the year
    Rule(
        "DATE",
        re.compile(
            rf"(?<![\d./-])(?P<value>(?:0?[1-9]|[12]\d|3[01]){_SEP}(?:0?[1-9]|[12]\d|3[01]))"
            rf"{_SEP}(?:{_YEAR}|\d{{2}})(?![\d/-]|\.\d)"
        ),
        0.8,
    ),
    # 1990-02-17, 2023/08/09
    Rule(
        "DATE",
        re.compile(
            rf"(?<![\d./-]){_YEAR}[/.-](?P<value>(?:0?[1-9]|1[0-2])[/.-](?:0?[1-9]|[12]\d|3[01]))(?![\d/-]|\.\d)"
        ),
        0.8,
    ),
    # 20230915
    Rule(
        "DATE",
        re.compile(rf"(?<!\d){_YEAR}(?P<value>(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01]))(?!\d)"),
        0.7,
    ),
    # 2/11 or 9/2 only after a date word (a bare 7/10 is a pain score, 1/2 a dose)
    Rule(
        "DATE",
        re.compile(
            r"(?i)\b(?:on|since|from|until|till|by|dated?|dob|born|admitted|discharged|visit|"
            r"appointment|follow-?up(?:\s+is|\s+on)?|due|seen|before|after|starting|started|as\s+of|"
            r"mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun|monday|tuesday|wednesday|thursday|friday|"
            r"saturday|sunday)\.?,?"
            r"[:\s]+(?P<value>(?:0?[1-9]|1[0-2])/(?:0?[1-9]|[12]\d|3[01]))(?![\d/]|\.\d)"
        ),
        0.75,
    ),
    # in June (1985), since March: a month named alone is still an element of a date
    Rule(
        "DATE",
        re.compile(
            rf"(?i)\b(?:in|since|during|until|till|by|from|early|mid|late|last|next|this|of|born)"
            rf"\s+(?P<value>(?-i:{_FULL_MONTH}))\b"
        ),
        0.7,
    ),
    Rule("DATE", re.compile(rf"(?P<value>\b(?-i:{_FULL_MONTH})),?\s+{_YEAR}\b"), 0.75),
]

_UNITS = r"(?:-|\s)?(?:one|two|three|four|five|six|seven|eight|nine)"
# 90 to 119, in digits or words ("ninety-three", "a hundred and one")
_OLD = (
    rf"(?P<value>9\d|1[01]\d|ninety{_UNITS}?|(?:a|one)\s+hundred(?:\s+and)?(?:\s+(?:one|two|three|four|"
    rf"five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|"
    rf"nineteen))?)"
)
_NOT_A_MEASURE = r"(?!\.\d|\s*(?:%|percent|°|degrees|bpm|mg|kg|lbs?|mmhg|[fc]\b|/|mmol|beats))"
_PERSON = (
    r"(?:i'?m|i\s+am|he'?s|she'?s|he\s+is|she\s+is|they'?re|(?:is|was)\s+now|turned|turning|turns|"
    r"(?:mom|mum|mother|dad|father|grandma|grandmother|grandpa|grandfather|gran|nan|husband|wife|"
    r"aunt|uncle|patient|pt|he|she)\s+(?:is|was))"
)
AGE_RULES = [
    Rule(
        "AGE",
        re.compile(
            rf"(?i)(?<![\d.]){_OLD}\s*(?:-\s*)?(?:years?|yrs?|y/?o\b|y\.o\.|yo\b|-?year-old)"
        ),
        0.85,
    ),
    Rule("AGE", re.compile(rf"(?i)\b(?:aged?|age\s*(?:is|:)?)\s*{_OLD}\b{_NOT_A_MEASURE}"), 0.85),
    Rule("AGE", re.compile(rf"(?i)\b{_PERSON}\s+(?:a\s+)?{_OLD}\b{_NOT_A_MEASURE}"), 0.8),
    # "Gladys Fairweather, 91, widow"
    Rule(
        "AGE",
        re.compile(rf"(?<=[A-Za-z]),\s*{_OLD}\s*(?=,|\)|\s+(?:and|with|who|male|female|yo)\b)"),
        0.7,
    ),
]


def _old_birth_year(text: str, match: re.Match[str]) -> str | None:
    """A birth year is an age when it makes the person older than 89."""
    return "AGE" if dt.date.today().year - int(match.group("value")) > 89 else None


BIRTH_YEAR_RULE = Rule(
    "AGE",
    re.compile(
        rf"(?i)\b(?:born|dob|date\s+of\s+birth|birth(?:day|date)?)\b[^.\n]{{0,30}}?(?P<value>{_YEAR})\b"
    ),
    0.8,
    _old_birth_year,
)


def date_recognizers() -> list[RegexRecognizer]:
    return [RegexRecognizer("ArloopDateRecognizer", [*DATE_RULES, *AGE_RULES, BIRTH_YEAR_RULE])]
