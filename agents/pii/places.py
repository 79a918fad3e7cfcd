"""Geography smaller than a state: street addresses, towns, counties, ZIP and postcodes."""

from __future__ import annotations

import re

from agents.pii.base import (
    EPONYM_FOLLOWERS,
    NOT_NAMES,
    ORG_WORDS,
    REGIONS,
    STATE_CODES,
    US_STATES,
    LocalRecognizer,
    RecognizerResult,
    RegexRecognizer,
    Rule,
    alternation,
    lexicon,
    norm,
    result,
)

_SUFFIX = alternation(
    "Street St Avenue Ave Av Road Rd Boulevard Blvd Lane Ln Drive Dr Court Ct Way Place Pl Terrace "
    "Ter Circle Cir Highway Hwy Parkway Pkwy Square Sq Trail Trl Close Crescent Cres Grove Gardens "
    "Gdns Row Mews Walk Hill Heights Pike Alley Loop Path Plaza Green Rise View Wharf Quay "
    "Broadway Route".split()
)
_WORD = r"[A-Z][a-z'’]+"
_STATE = alternation(US_STATES)
_CODE = alternation(STATE_CODES)
_UK_POSTCODE = r"(?-i:[A-Z]{1,2}\d[A-Z\d]?\s?\d[A-Z]{2})"
_CA_POSTCODE = r"(?-i:[A-Z]\d[A-Z]\s?\d[A-Z]\d)"
_ZIP = rf"(?:\d{{5}}(?:-\d{{4}})?|{_UK_POSTCODE}|{_CA_POSTCODE})"

ADDRESS_RULES = [
    # 2207 W. Harrison Street, 350 West 57th Street, 1187 County Road 14, 4509 Magnolia Ave NE
    Rule(
        "ADDRESS",
        re.compile(
            rf"\b\d{{1,6}}[A-Z]?(?:-\d{{1,4}})?\s+(?:(?:[NSEW]\.?|North|South|East|West)\s+)?"
            rf"(?:(?:{_WORD}|\d{{1,3}}(?:st|nd|rd|th))\s+){{0,4}}(?:{_SUFFIX})\b\.?"
            rf"(?:\s+\d{{1,4}}\b)?(?:\s+(?:NE|NW|SE|SW|N|S|E|W)\b)?"
        ),
        0.8,
    ),
    # 22 elm street, 4 mill lane: casual lower case, a common street word required
    Rule(
        "ADDRESS",
        re.compile(
            r"\b\d{1,5}[a-z]?\s+(?:[a-z][a-z'’-]+\s+){1,2}(?:street|st|road|rd|avenue|ave|lane"
            r"|drive|close|crescent|terrace|grove|gardens|way|court|place|boulevard|blvd)\b"
        ),
        0.7,
    ),
    # 77 Rue de Rivoli, 12 Calle del Sol
    Rule(
        "ADDRESS",
        re.compile(
            r"\b\d{1,5},?\s+(?:Rue|Avenue|Boulevard|Calle|Avenida|Via|Viale|Piazza|Strada|Chemin|Rua"
            r"|Plaza|Place)\s+(?:(?:de|du|des|la|le|del|di|da|dos|das)\s+)*[A-Z][\w'’-]+(?:\s+[A-Z][\w'’-]+)?"
        ),
        0.8,
    ),
    Rule(
        "ADDRESS",
        re.compile(r"\b[A-Z][a-zäöüß]+(?:straße|strasse|weg|platz|gasse|allee)\s+\d+[a-z]?\b"),
        0.8,
    ),
    Rule("ADDRESS", re.compile(r"\b\d{1,4}-\d{1,2}-\d{1,2}\s+[A-Z][a-z]+\b"), 0.7),  # 1-2-3 Shibuya
    Rule(
        "ADDRESS",
        re.compile(
            r"\b(?:Apt|Apartment|Suite|Ste|Unit|Flat|Bldg|Building|Floor)\.?\s*#?\s*\d+[A-Z]?\b"
            r"|(?i:\b(?:apt|apartment|suite|flat)\.?\s*#?\s*(?=\w*\d)[a-z0-9-]{1,6}\b)"
        ),
        0.75,
    ),
    Rule(
        "ADDRESS", re.compile(r"(?i)\b(?:p\.?\s?o\.?\s*box|post\s+office\s+box)\s*#?\s*\d+\b"), 0.85
    ),
    Rule(
        "ADDRESS",
        re.compile(r"(?i)\b(?:rural\s+route|(?-i:RR)|highway\s+contract)\s*\d+(?:,?\s*box\s*\d+)?"),
        0.8,
    ),
    Rule(
        "ADDRESS",
        re.compile(
            r"(?i)\bcorner\s+of\s+(?-i:[A-Z]\w+)(?:\s+(?:st|street|ave|avenue|rd|road))?\s+(?:and|&)\s+"
            r"(?:(?-i:[A-Z]\w+)|\d+(?:st|nd|rd|th))"
        ),
        0.75,
    ),
]

ZIP_RULES = [
    Rule(
        "ZIP",
        re.compile(
            rf"(?i)\b(?:zip|zip\s*code|zipcode|postal\s+code|post\s*code)\s*(?:is|:|#)?\s*(?P<value>{_ZIP})\b"
        ),
        0.9,
    ),
    Rule(
        "ZIP", re.compile(rf"\b(?:{_CODE}|{_STATE})\.?,?\s+(?P<value>\d{{5}}(?:-\d{{4}})?)\b"), 0.9
    ),
    Rule("ZIP", re.compile(r"(?<![\d-])\d{5}-\d{4}(?![\d-])"), 0.7),
    Rule("ZIP", re.compile(rf"\b(?:{_CODE})\s+(?P<value>{_CA_POSTCODE})\b"), 0.85),
    Rule("ZIP", re.compile(rf"(?<=[a-z]\s)(?P<value>{_UK_POSTCODE})\b"), 0.6),
]

_REGION_KEYS = frozenset(norm(r) for r in REGIONS)
_CITY_TOKEN = re.compile(r"[A-Z][A-Za-z'’.-]*[a-z](?:\s+[A-Z][A-Za-z'’.-]*[a-z]){0,2}")
_CUE_BEFORE = re.compile(
    r"(?i)(?:\b(?:in|at|near|from|to|around|outside|visiting|of|called|named|city|town|village|"
    r"suburb)\s+|,\s*)$"
)
_LIVE_CUE = re.compile(
    r"(?i)\b(?:live|living|lives|lived|reside|residing|resident\s+of|moved|based|staying|born|grew\s+up|"
    r"town\s+called|city\s+of|town\s+of|village\s+of|village\s+called)\s+(?:in\s+|to\s+|at\s+|near\s+)?"
    r"(?P<value>[A-Za-z][A-Za-z'’-]*(?:\s+(?-i:[A-Z])[A-Za-z'’-]*)?)"
)
_LOWER_CITY = re.compile(
    r"(?:\b(?:in|near|from|to|around|outside|visiting)\s+)(?P<value>[a-z][a-z'’-]+(?:\s[a-z][a-z'’-]+)?)\b"
)
_COUNTY = re.compile(r"\b(?:[A-Z][a-z]+\s){1,2}(?:County|Parish|Borough|Township)\b")
_CITY_STATE = re.compile(
    rf"\b(?P<value>[A-Z][a-z]+(?:\s[A-Z][a-z]+){{0,2}})(?:,?\s+(?P<code>{_CODE})\b|,\s+(?:{_STATE})\b)"
)
_AFTER_ADDRESS = re.compile(
    rf"^,?\s*(?:(?P<zip>{_ZIP})\s+)?(?!(?:Apt|Apartment|Suite|Ste|Unit|Flat|Box|Floor)\b)"
    rf"(?P<value>[A-Z][a-z'’]+(?:\s[A-Z][a-z'’]+){{0,2}})"
    rf"(?=\s*(?:,|\.|;|$|\n|\s+[A-Z]{{1,2}}\d|\s+\d|\s+(?:{_CODE})\b))"
)

_ZIP_AFTER_TOWN = re.compile(rf",?\s+(?:(?:{_CODE})\s+)?(?P<value>{_ZIP}|\d{{3}}-\d{{4}})\b")


class PlaceRecognizer(LocalRecognizer):
    """Towns and counties: known cities, location cues, `City, ST`, the town after an address."""

    def __init__(self) -> None:
        self.addresses = RegexRecognizer("ArloopAddressRecognizer", ADDRESS_RULES + ZIP_RULES)
        super().__init__(
            supported_entities=["ADDRESS", "ZIP", "LOCATION"], name="ArloopPlaceRecognizer"
        )

    def load(self) -> None:
        """The gazetteer loads lazily with the name lists."""

    def analyze(self, text: str, entities=None, nlp_artifacts=None) -> list[RecognizerResult]:
        found = self.addresses.analyze(text)
        found += self._after_addresses(text, found)
        found += [result("LOCATION", *m.span(), 0.8) for m in _COUNTY.finditer(text)]
        found += self._cued(text) + self._gazetteer(text) + self._lower_cities(text)
        for match in _CITY_STATE.finditer(text):
            # A two-letter code (ID, OK, IN are words too) counts with a postcode or a known city.
            postcode = re.match(rf"\.?,?\s*{_ZIP}\b", text[match.end() :])
            if (
                match.group("code")
                and not postcode
                and match.group("value") not in lexicon().cities
            ):
                continue
            if not _is_region_or_word(match.group("value")):
                found.append(result("LOCATION", *match.span("value"), 0.75))
        return found

    def _after_addresses(self, text: str, found: list[RecognizerResult]) -> list[RecognizerResult]:
        """`12 Church Street, Oxford OX1 4AH`: the words after an address name its town."""
        out = []
        for address in (f for f in found if f.entity_type == "ADDRESS"):
            match = _AFTER_ADDRESS.match(text[address.end :])
            if not match or _is_region_or_word(match.group("value"), allow_common=True):
                continue
            at = address.end
            out.append(result("LOCATION", at + match.start("value"), at + match.end("value"), 0.75))
            if match.group("zip"):
                out.append(result("ZIP", at + match.start("zip"), at + match.end("zip"), 0.8))
            code = _ZIP_AFTER_TOWN.match(text, at + match.end("value"))
            if code:
                out.append(result("ZIP", *code.span("value"), 0.8))
        return out

    def _cued(self, text: str) -> list[RecognizerResult]:
        out = []
        lex = lexicon()
        for match in _LIVE_CUE.finditer(text):
            value = match.group("value")
            known = value in lex.cities or value.title() in lex.cities
            if (value[0].isupper() or known) and not _is_region_or_word(value, allow_common=True):
                out.append(result("LOCATION", *match.span("value"), 0.7))
        return out

    def _gazetteer(self, text: str) -> list[RecognizerResult]:
        """Known cities, capitalised; a city that is also a word (Reading) needs a cue before it."""
        lex, out = lexicon(), []
        for run in _CITY_TOKEN.finditer(text):
            words = [(w.start(), w.end()) for w in re.finditer(r"\S+", run.group(0))]
            i = 0
            while i < len(words):
                span = self._longest_city(text, run.start(), words[i:])
                if span is None:
                    i += 1
                    continue
                start, end, n = span
                cued = _CUE_BEFORE.search(text[max(0, start - 20) : start])
                name = text[start:end]
                organisation = norm(run.group(0).split()[-1]) in ORG_WORDS
                person = n == 1 and lex.is_first(name)  # Mary, George: the name recogniser's
                ambiguous = lex.is_common(name) or person
                if (cued or not ambiguous) and norm(name) not in NOT_NAMES and not organisation:
                    out.append(result("LOCATION", start, end, 0.65))
                i += n
        return out

    @staticmethod
    def _lower_cities(text: str) -> list[RecognizerResult]:
        """`in leeds`: a known city in lower case after a place cue, when it is no word."""
        lex, out = lexicon(), []
        for match in _LOWER_CITY.finditer(text):
            words = match.group("value").split()
            for n in (len(words), 1):  # "new york", else "leeds"
                name = " ".join(words[:n])
                title = name.title()
                if title in lex.cities and not any(
                    lex.is_known(w) or lex.is_common(w) for w in words[:n]
                ):
                    if not _is_region_or_word(title):
                        end = match.start("value") + len(name)
                        out.append(result("LOCATION", match.start("value"), end, 0.6))
                    break
        return out

    @staticmethod
    def _longest_city(text: str, offset: int, words: list[tuple[int, int]]):
        """(start, end, words used) of the longest known city at the first word, if any."""
        for n in range(min(3, len(words)), 0, -1):  # "Santa Cruz", "Des Moines"
            start, end = offset + words[0][0], offset + words[n - 1][1]
            if text[start:end] in lexicon().cities and not _eponym(text, end):
                return start, end, n
        return None


def _is_region_or_word(value: str, allow_common: bool = False) -> bool:
    """States and countries may stay; so may ordinary words unless a cue vouched for them."""
    first = value.split()[0]
    if norm(value) in _REGION_KEYS or norm(first) in NOT_NAMES or lexicon().is_everyday(first):
        return True
    return not allow_common and lexicon().is_common(value) and value not in lexicon().cities


def _eponym(text: str, end: int) -> bool:
    """`Glasgow coma scale`: a place name used for a medical scale."""
    follower = re.match(r"(?:'s|’s|')?\s+([a-z]+)", text[end : end + 20])
    return bool(follower and follower.group(1) in EPONYM_FOLLOWERS)


def place_recognizers() -> list[LocalRecognizer]:
    return [PlaceRecognizer()]
