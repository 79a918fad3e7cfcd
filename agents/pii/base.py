"""Shared pieces of the PHI recognisers: a regex recogniser for presidio and the word lists."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")  # tldextract must not phone home


def import_presidio():
    """Import presidio without its optional torch/transformers backends.

    presidio and spaCy's thinc import torch and transformers whenever they are installed (12 s and
    ~1 GB here); the serving path never needs them, so they are hidden while presidio loads.
    """
    hidden = [m for m in ("torch", "transformers") if m not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # makes `import name` fail
    try:
        import presidio_analyzer
        import presidio_analyzer.nlp_engine
        import presidio_analyzer.predefined_recognizers
    finally:
        for name in hidden:
            sys.modules.pop(name, None)
    return presidio_analyzer


presidio = import_presidio()
LocalRecognizer, RecognizerResult = presidio.LocalRecognizer, presidio.RecognizerResult
from spacy.lang.en.stop_words import STOP_WORDS  # noqa: E402  (spaCy came in with presidio)

LEXICON_PATH = Path(__file__).parent / "data" / "pii_lexicon.json"
TRAILING = ".,;:!?'\"”’"


@dataclass(frozen=True)
class Rule:
    """One pattern: its `value` group (or the whole match) is reported as `entity`.

    `check(text, match)` may return another entity type, or None to drop the match.
    """

    entity: str
    pattern: re.Pattern[str]
    score: float
    check: Callable[[str, re.Match[str]], str | None] | None = None


class RegexRecognizer(LocalRecognizer):
    """A presidio recogniser over our own rules, reporting the `value` group when there is one."""

    def __init__(self, name: str, rules: Iterable[Rule]) -> None:
        self.rules = list(rules)
        entities = sorted({r.entity for r in self.rules} | {"FAX", "PHOTO", "AGE", "LOCATION"})
        super().__init__(supported_entities=entities, name=name, supported_language="en")

    def load(self) -> None:
        """Nothing to load: the patterns are compiled at import."""

    def analyze(self, text: str, entities=None, nlp_artifacts=None) -> list[RecognizerResult]:
        out = []
        for rule in self.rules:
            for match in rule.pattern.finditer(text):
                entity = rule.check(text, match) if rule.check else rule.entity
                group = "value" if "value" in rule.pattern.groupindex else 0
                start, end = trim(text, match.start(group), match.end(group))
                if entity and end > start:
                    out.append(result(entity, start, end, rule.score))
        return out


def result(entity: str, start: int, end: int, score: float) -> RecognizerResult:
    return RecognizerResult(entity_type=entity, start=start, end=end, score=score)


def trim(text: str, start: int, end: int) -> tuple[int, int]:
    """Drop trailing punctuation and an unbalanced closing bracket from a span."""
    while end > start and (
        text[end - 1] in TRAILING
        or (text[end - 1] == ")" and text.count("(", start, end) < text.count(")", start, end))
    ):
        end -= 1
    while start < end and text[start] in "([":
        if text.count(")", start, end) >= text.count("(", start, end):
            break
        start += 1
    return start, end


def alternation(words: Iterable[str]) -> str:
    """A regex alternation, longest first, so `Street` wins over `St`."""
    return "|".join(re.escape(w) for w in sorted(set(words), key=len, reverse=True))


@dataclass(frozen=True)
class Lexicon:
    """Names and places (see data/PII_DATA_SOURCES.md), normalised for lookup."""

    first_names: frozenset[str]
    surnames: frozenset[str]
    cities: frozenset[str]
    common_words: frozenset[str]  # also a lower-case word in Webster's (Tom, Reading, Will)
    known_words: frozenset[str] = frozenset()  # lower-case words with a token of their own

    def is_name(self, word: str) -> bool:
        key = norm(word)
        return key in self.first_names or key in self.surnames

    def is_first(self, word: str) -> bool:
        return norm(word) in self.first_names

    def is_common(self, word: str) -> bool:
        return norm(word) in self.common_words

    def is_known(self, word: str) -> bool:
        """A frequent lower-case word (fever, tablets, has): no one's name on its own."""
        return word.lower() in self.known_words or word.lower() in CASUAL_WORDS

    def is_everyday(self, word: str) -> bool:
        """An everyday English word first (Will, Grace, Brown, Can): a name only with a cue."""
        return norm(word) in EVERYDAY_WORDS or word.lower() in STOP_WORDS


def norm(word: str) -> str:
    """Lower case without apostrophes, so O'Brien, OBrien and o'brien meet."""
    return word.lower().replace("'", "").replace("’", "")


@cache
def lexicon() -> Lexicon:
    """Loaded once per process (about 0.1 s)."""
    data = json.loads(LEXICON_PATH.read_text(encoding="utf-8"))

    def keys(name: str) -> frozenset[str]:
        return frozenset(norm(w) for w in data[name])

    return Lexicon(
        keys("first_names"),
        keys("surnames"),
        frozenset(data["cities"]),
        keys("common_words"),
        frozenset(data.get("known_words", ())),
    )


MONTHS = (
    "January February March April May June July August September October November December "
    "Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec"
).split()
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
US_STATES = (
    "Alabama Alaska Arizona Arkansas California Colorado Connecticut Delaware Florida Georgia "
    "Hawaii Idaho Illinois Indiana Iowa Kansas Kentucky Louisiana Maine Maryland Massachusetts "
    "Michigan Minnesota Mississippi Missouri Montana Nebraska Nevada Ohio Oklahoma Oregon "
    "Pennsylvania Tennessee Texas Utah Vermont Virginia Washington Wisconsin Wyoming"
).split() + [
    "New Hampshire",
    "New Jersey",
    "New Mexico",
    "New York",
    "North Carolina",
    "North Dakota",
    "Rhode Island",
    "South Carolina",
    "South Dakota",
    "West Virginia",
    "District of Columbia",
]
STATE_CODES = (
    "AL AK AZ AR CA CO CT DE FL GA HI ID IL IN IA KS KY LA ME MD MA MI MN MS MO MT NE NV NH NJ "
    "NM NY NC ND OH OK OR PA RI SC SD TN TX UT VT VA WA WV WI WY DC "
    "ON QC BC AB MB SK NS NB NL PE"  # Canadian provinces
).split()
REGIONS = (
    US_STATES
    + (
        "England Scotland Wales Ireland Britain UK USA America Canada Mexico France Germany Spain "
        "Italy Portugal Poland India Pakistan China Japan Korea Nigeria Kenya Ghana Egypt Brazil "
        "Argentina Australia Russia Ukraine Turkey Iran Iraq Israel Vietnam Philippines Europe Africa "
        "Asia Ontario Quebec Alberta Manitoba Texas"
    ).split()
)

# Names that are first of all everyday words; the rest of Webster's overlap (Tom, Maria, Parker)
# is rare enough as words that a capitalised one mid-sentence is taken as a name.
EVERYDAY_WORDS = frozenset(
    (
        "will may hope grace mark frank bill rose joy faith pat sue jack guy art rob dawn chase "
        "drew grant lance rich cash page long young king hill wood green white black brown bell "
        "cook day lane stone park law love little wise iris ivy holly heather daisy ruby pearl "
        "amber crystal angel honey sky storm rain river brook hunter wade miles sterling penny "
        "sunny summer autumn june april august stage blood heart child head hand foot arm back "
        "chest neck face eye ear nose lip skin bone colon liver page price cross banks burns "
        "bush fields ford fox frost gray grey hall hart hayes house knight lord marsh moon "
        "moore nash parks pope power savage short small snow strong swift wells wolf ward west "
        "north south east best mills field bird rock church glass gold silver case early "
        "free good gay hale hardy hurt joy just fair well sharp strange sweet tender major "
        "major noble baker carter cooper mason porter fisher miller taylor walker turner potter "
        "weaver bishop dean judge marshal nurse sargent person body bed blank cane carey "
        "chance cloud coral cotton dale dell don dot duke earl ernest hazel jewel jay joey "
        "kitty lad lamb mae max may mercy misty nick norm patience pip prince rene reed ray "
        "rick sage sandy skip star tad ted terry trinity van vic victor violet willow win eve"
    ).split()
)
# Casual spellings that are words, not names, whatever the lists say (u, ur, thx, cant, lol).
CASUAL_WORDS = frozenset(
    (
        "u ur n r ya yeah yep yup nope ok okay k kk thx ty pls plz lol omg idk tbh btw asap "
        "cant wont dont didnt doesnt isnt arent wasnt werent hasnt havent hadnt couldnt "
        "shouldnt wouldnt im ive id ill youre hes shes theyre thats whats theres gonna wanna "
        "gotta kinda sorta dunno ya'll hi hey hiya sorry thanks cheers also still just"
    ).split()
)
# Capitalised words that are not names even when a name list holds them.
NOT_NAMES = frozenset(
    norm(w)
    for w in MONTHS
    + WEEKDAYS
    + REGIONS
    + (
        "I I'm I've I'd I'll Im Ive God Lord Jesus Christ Allah Christmas Easter Thanksgiving "
        "Halloween Ramadan Eid Hanukkah Passover Diwali American English French German Spanish "
        "Italian Irish Scottish Welsh British Canadian Mexican Chinese Japanese Korean Indian "
        "African Asian European Latino Latina Hispanic Black White Christian Catholic Jewish "
        "Muslim Hindu Buddhist Sikh Mormon Baptist Protestant Doctor Dr Nurse Mom Mum Dad Mommy "
        "Daddy Grandma Grandpa Granny Nana Papa Sir Madam Patient Baby Hi Hello Dear Thanks "
        "Regards Best Cheers Sincerely Signed Sent Name Contact Emergency Attn Attention Covid "
        "Google Facebook Instagram WhatsApp Uber Amazon "
        "Walmart Target Costco Walgreens Medicare Medicaid Tricare Aetna Cigna Humana Kaiser "
        "Anthem Tylenol Advil Motrin Aleve Benadryl Claritin Zyrtec Allegra Lipitor Crestor "
        "Zocor Zoloft Prozac Lexapro Paxil Celexa Wellbutrin Xanax Valium Ativan Klonopin "
        "Ambien Synthroid Glucophage Lasix Coumadin Eliquis Xarelto Plavix Norvasc Zestril "
        "Prinivil Lopressor Toprol Tenormin Flomax Nexium Prilosec Zantac Pepcid Tums Ozempic "
        "Wegovy Mounjaro Jardiance Januvia Lantus Humalog Novolog Levemir Tresiba Ventolin "
        "ProAir Flovent Advair Symbicort Singulair Neurontin Lyrica Cymbalta Effexor Adderall "
        "Ritalin Vyvanse Concerta Keppra Depakote Lamictal Tegretol Dilantin Seroquel Abilify "
        "Risperdal Zyprexa Lithium Viagra Cialis Plan Keflex Augmentin Cipro Levaquin Bactrim "
        "Zithromax Diflucan Valtrex Tamiflu Paxlovid Narcan Epipen Sudafed Mucinex Robitussin "
        "Dayquil Nyquil Imodium Pepto Miralax Dulcolax Metamucil Biktarvy Truvada Humira Enbrel "
        "Remicade Keytruda Herceptin Botox Prolia Fosamax Evista Premarin Yaz Mirena Nexplanon "
        "Honda Toyota Nissan Mazda Subaru Kia Hyundai Tesla Chevy Chevrolet Jeep Volvo Audi BMW "
        "Volkswagen Lexus Dodge Buick Cadillac Peugeot Renault Fiat Skoda"
    ).split()
)
# The last word of an organisation's name: "Mercy Hospital" is neither a person nor a town.
ORG_WORDS = frozenset(
    norm(w)
    for w in (
        "Hospital Clinic Center Centre Pediatrics Paediatrics Cardiology Oncology Nursing Home "
        "Health Healthcare Medical Pharmacy University College School Insurance Shield Care "
        "Group Practice Surgery Institute Foundation Labs Laboratory Laboratories County Inc Ltd "
        "LLC Company Corp Department Dept Services Unit Ward Trust Association Society Club "
        "Partners Hospice Pediatric Dental"
    ).split()
)
# Eponyms: a name list holds them, but before these words they name a disease or a scale.
EPONYM_FOLLOWERS = frozenset(
    "disease syndrome palsy sign signs test score scale coma criteria classification maneuver "
    "manoeuvre procedure catheter line monitor cyst fracture virus reflex phenomenon stage "
    "staging tube position stockings ulcer disorder lymphoma sarcoma tumour tumor neuroma "
    "node nodes contracture chorea dementia ataxia anomaly angina".split()
)
# Diseases said with a bare possessive ("she has Parkinson's"): not names unless a cue says so.
EPONYMS = frozenset(
    norm(w)
    for w in (
        "Alzheimer Parkinson Crohn Hodgkin Huntington Addison Cushing Graves Hashimoto Asperger "
        "Tourette Raynaud Sjogren Meniere Paget Kaposi Hirschsprung Barrett Munchausen Peyronie "
        "Dupuytren Bright Behcet Whipple Lyme Down Bell Osgood Schlatter Perthes Scheuermann "
        "Kienbock Legionnaire Gehrig Creutzfeldt Jakob Chagas"
    ).split()
)
