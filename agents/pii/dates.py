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
_NO_UNIT = r"(?!\s*(?:mg|mcg|ug|ml|g|kg|units?|iu|mmol|%)(?![a-z]))"
_DM = r"(?:0?[1-9]|[12]\d|3[01])"  # a day, or a month: d/m and m/d are both written
_ORDINAL = r"(?:[12]?\d|3[01])(?:st|nd|rd|th)"
_WEEKDAY = r"(?:mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun)(?:day)?"
# Words after which a number is a day of the month ("on 3/4", "since the 12th").
_ON = (
    rf"(?:on|since|from|until|till|by|dated?|dob|born|admitted|discharged|visit|appointment"
    rf"|follow-?up(?:\s+is|\s+on)?|due|seen|before|after|starting|started|as\s+of|{_WEEKDAY})"
)
# What follows a date said as d/m after a date word: the end of a clause, or a word that is no
# noun; a fraction is followed by what it is of ("by 1/2 a tablet", "on 1/2 strength formula").
_DATE_END = (
    r"(?=\s*(?:[,.;:!?)]|$)|\s+(?:at|and|or|but|so|when|then|i|we|he|she|they|it|this|that|my|his"
    r"|her|our|in|on|to|till|until|for|with|by|from|was|is|were|had|have|has|after|before|around"
    r"|about|&|-|–)(?![\w/]))"
)
# What may follow a day said alone ("on the 17th", "by the 3rd."), not a noun ("the 3rd dose").
_DAY_END = (
    r"(?=\s*(?:[,.;:!?)]|$)|\s+(?:at|and|or|but|so|when|then|i|we|he|she|they|it|this|next|last"
    r"|to|till|until|around|about|for\s+(?:my|an?|the)|of\s+(?:this|next|last|the)\s+month)\b)"
)
# The value group is what is replaced; a trailing year stays readable ("[DATE], 2021").
DATE_RULES = [
    # March 14th, Sept. 22nd 2021, Dec 1 2021, january 9, mar-3-21
    Rule(
        "DATE",
        re.compile(rf"(?i)\b(?P<value>{_MONTH}(?:\s*|-){_DAY})(?![\d:])(?!\s*(?:mg|ml|%|kg))"),
        0.8,
    ),
    # 21st of March, 17 August 2019, 05-Jun-1948, 11 Nov
    Rule(
        "DATE",
        re.compile(rf"(?i)(?<![\d.])(?P<value>{_DAY}(?:\s+of\s+|[\s-]+){_MONTH})(?![a-z])"),
        0.8,
    ),
    # 04/12/1986, 14.03.2024, 7/4/59, 12 / 25 / 1970, 3/14/'21: day and month, not the year;
    # one separator twice (2.5/10 mg is a dose)
    Rule(
        "DATE",
        re.compile(
            rf"(?<![\d./-])(?P<value>{_DM}\s*(?P<sep>[/.-])\s*{_DM})"
            rf"\s*(?P=sep)\s*(?:{_YEAR}|'?\d{{2}})(?![\d/-]|\.\d){_NO_UNIT}"
        ),
        0.8,
    ),
    # 1 12 2020, 04 11 88, on 7 3 91: spaces only, so a year of four digits, a part written
    # with a leading zero, or a date word before it (three numbers in a row are rarely a date)
    Rule(
        "DATE",
        re.compile(
            rf"(?i)(?<![\d.:/-])(?P<value>{_DM}[ \t]+{_DM})[ \t]+(?:{_YEAR}|'?\d{{2}})(?![\w.:/-]|\.\d)"
        ),
        0.75,
        lambda text, m: "DATE" if _spaced_date(text, m) else None,
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
    # 2/11, 9/2 or 13/10 only after a date word (a bare 7/10 is a pain score, 1/2 a dose)
    Rule(
        "DATE",
        re.compile(rf"(?i)\b{_ON}\.?,?[:\s]+(?P<value>{_DM}/{_DM})(?![\d/]|\.\d){_DATE_END}"),
        0.75,
        lambda text, m: "DATE" if _day_and_month(m.group("value"), "/") else None,
    ),
    # on the 17th, friday the 13th, due 3rd: a day said alone is still an element of a date
    # (not "from the 3rd to the 8th": a span of days counts days, in a sum as much as a diary)
    Rule(
        "DATE",
        re.compile(
            rf"(?i)\b(?:{_ON}|around|about)\.?,?\s+(?:the\s+)?(?P<value>{_ORDINAL})\b{_DAY_END}"
        ),
        0.7,
        lambda text, m: None if m.group(0).lower().startswith("from") else "DATE",
    ),
    # 03/2021, since 3-2019: a month with its year, in digits (zero-padded, or after a date word)
    Rule("DATE", re.compile(rf"(?<![\d./-])(?P<value>0[1-9]|1[0-2])[/.-]{_YEAR}(?![\d/.-])"), 0.7),
    Rule(
        "DATE",
        re.compile(rf"(?i)\b{_ON}\.?,?[:\s]+(?P<value>[1-9])[/.-]{_YEAR}(?![\d/.-])"),
        0.7,
    ),
    # march 2021, jan '19: a month with its year, in any case (the year stays)
    Rule("DATE", re.compile(rf"(?i)\b(?P<value>{_MONTH})\s*,?\s*(?:{_YEAR}\b|'\d{{2}}\b)"), 0.7),
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


def _day_and_month(value: str, sep: str) -> bool:
    """Two numbers that can be a day and a month, in either order."""
    first, second = (int(p) for p in re.split(sep, value))
    return min(first, second) <= 12


def _spaced_date(text: str, match: re.Match[str]) -> bool:
    """`1 12 2020`, `04 11 88`, `dob 7 3 91`; not `reps 10 12 15`."""
    if not _day_and_month(match.group("value"), r"[ \t]+"):
        return False
    whole = match.group(0)
    if re.search(rf"\s{_YEAR}$", whole) or re.search(r"(?:^|\s)0\d", whole):
        return True
    before = text[max(0, match.start() - 25) : match.start()]
    return re.search(rf"(?i)\b{_ON}\.?,?[:\s-]*$", before) is not None


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
