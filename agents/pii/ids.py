"""Recognisers for numbers and codes: cue-led identifiers, SSN, phone/fax, e-mail, URL/photo, VIN."""

from __future__ import annotations

import re

from agents.pii.base import STOP_WORDS, RegexRecognizer, Rule, alternation
from agents.pii.codes import code_shape, plausible_code

# A code after a cue: chunks split by single spaces, each with a digit, or short capitals
# between them (`GB82 WEST 1234`, `BXT 448210 H`); a short prefix word is allowed (`Rx 7712934`,
# `mcx 448 1029`), but no short English word (`for 500`).
_CHUNK = r"[A-Za-z0-9(][A-Za-z0-9_./()+:-]*"
_STRONG = rf"(?=[A-Za-z0-9_./()+:-]*\d){_CHUNK}"
_CAPS = r"(?-i:(?!I\b|A\b)[A-Z]{1,5})(?![A-Za-z0-9])"
_FILLER = (
    r"(?:number|num|nbr|no|nr|id|identifier|code|is|was|are|of|my|the|ending|ends|in|template|hash|"
    r"scan|print|enrollment|enrolment|signature|sample|key|username|name|plate|serial|says|said"
    r"|reads|read|shows|showed|states|has|had|on|it|its|it's|that|like|printed|written|as"
    r"|something|just|here|there)"
)
_SMALL_WORDS = alternation([w for w in STOP_WORDS if len(w) <= 4 and w.isalpha()] + ["u", "ur"])
_NOT_PREFIX = rf"(?:{_SMALL_WORDS}|{_FILLER}|ref|acct|appt|pt|tel)\b"
_PREFIX = rf"(?:(?-i:[A-Z][A-Za-z]{{0,3}})|(?!{_NOT_PREFIX})[a-z]{{2,4}})"
VALUE = rf"(?P<value>(?:{_PREFIX}\s(?={_STRONG}))?{_STRONG}(?:\s(?:{_STRONG}|{_CAPS}))*)"
_WINDOW = rf"(?:(?:'s|’s)?[\s:#=.,\-]+{_FILLER}\b\.?){{0,4}}(?:'s|’s)?[\s:#=.\-]*"

CUES = {
    "SSN": r"ssn|ss\s?#|s\.s\.n\.?|social\s+security(?:\s+(?:number|no\.?|#))?|social",
    "MRN": r"mrn|m\.r\.n\.?|medical\s+record|record|(?-i:MR)\s?#|chart|hospital\s*(?:number|no\.?|#|id)"
    r"|patient\s+(?:id|number|no\.?|#)|pt\s+id|unit\s+number|wrist\s*band|hospital\s+band"
    r"|id\s+band|arm\s*band|bracelet",
    "HEALTH_PLAN": r"member|subscriber|policy|insurance(?:\s+(?:id|number|no\.?|#))?"
    r"|group\s+(?:number|no\.?|#)"
    r"|plan\s+(?:id|number)|medicare|medicaid|mbi|beneficiary|nhs|health\s+plan|rx\s?(?:bin|pcn|group)",
    "ACCOUNT": r"account|acct\.?|a/c|iban|routing|card(?:\s+(?:number|no\.?|#|ending(?:\s+in)?))|"
    r"visa|mastercard|amex|credit\s+card|debit\s+card|checking|savings|sort\s+code",
    "LICENSE": r"licen[cs]e|(?-i:DL)\s?#?|dea|npi|passport|certificate|cert\.?|registration\s+(?:number|no)"
    r"|permit",
    "VEHICLE": r"(?:licen[cs]e\s+)?plate|(?-i:reg)|registration|vin|vehicle(?:\s+identification)?|tag",
    "DEVICE": r"serial|s/n|(?-i:SN)|device|imei|udi|mac\s+address|unit\s+id|transmitter|lot\s+(?:number|#)"
    r"|implant\s+(?:id|serial)",
    "BIOMETRIC": r"fingerprint|finger\s+print|thumbprint|voiceprint|voice\s+print|retina(?:l)?|iris|palm"
    r"(?:\s+(?:vein|print))?|face\s?id|facial(?:\s+recognition)?|face|biometric|dna|genetic|gait"
    r"|hand\s+geometry",
    "ID": r"case|claim|reference|ref\.?|confirmation|conf\.?|ticket|order|tracking|employee|staff|"
    r"student|badge|customer|client|username|user\s?id|login|accession|specimen|requisition|rx|"
    r"prescription|referral|authori[sz]ation|voucher|invoice|veteran|military|national\s+insurance"
    r"|itin|taxpayer|ein|tin|id\s+card|identity\s+card|national\s+id|id",
}
# Cue-led values outrank shape-only ones (a 10-digit NPI is not a phone number).
CUE_SCORE = {
    "VEHICLE": 0.92,
    "BIOMETRIC": 0.92,
    "SSN": 0.9,
    "MRN": 0.9,
    "HEALTH_PLAN": 0.88,
    "DEVICE": 0.88,
    "LICENSE": 0.87,
    "ACCOUNT": 0.86,
    "ID": 0.65,
}


# Words that name a code whatever it belongs to ("incident number", "booking ref", "the code"),
# and what a person wears or is handed with their code on it. Not "number of" (a count).
_CODE_WORDS = (
    r"(?:number|num|nbr|no(?=\.|:)|nr|n[º°]|#|code|ref|reference|identifier)(?!\s+of\b)"
    r"|band|label|sticker|booking|appointment|appt|incident|portal|locker"
)


def _plausible_code(text: str, match: re.Match[str], entity: str) -> str | None:
    """At least four characters and not a dose, a reading or a year (`500mg`, `38.4`, `120/80`)."""
    return entity if plausible_code(match.group("value")) else None


def _cue_rule(entity: str, cue: str) -> Rule:
    pattern = re.compile(rf"(?i)\b(?:{cue})(?![a-z]){_WINDOW}{VALUE}")
    return Rule(entity, pattern, CUE_SCORE[entity], lambda t, m: _plausible_code(t, m, entity))


HASH_RULE = Rule(  # "#4471923", "ref #QX-1723": no word boundary before a `#`
    "ID",
    re.compile(rf"(?<![\w#])#\s?{VALUE}"),
    CUE_SCORE["ID"],
    lambda t, m: _plausible_code(t, m, "ID"),
)

# "my locker key is 4B-119", "her code's PX93KD", "my number at the clinic is FC 20 118":
# anything a person calls theirs and quotes,
# when what they quote has a code's shape (not "my temp is 38.4").
_QUOTED = re.compile(
    rf"(?i)\b(?:my|our|his|her|their|your|ur)\s+(?:[a-z-]+\s+){{0,5}}?[a-z-]+(?:'s|’s|\s+is"
    rf"|\s+was|\s+says|\s+said|\s+reads|\s+shows|\s*[:=])\s*(?:like\s+|just\s+)?{VALUE}"
)
_NAMED_CODE = re.compile(rf"(?i)\b(?:{_CODE_WORDS}|{CUES['MRN']}|id)\b")


def _quoted_kind(text: str, match: re.Match[str]) -> str | None:
    """What a person calls a number or a record needs a cue's check ("my chart at st marys is
    c-00912-7"); anything else of theirs, a code's shape ("my locker key is 4B-119")."""
    owned = match.group(0)[: match.start("value") - match.start()]
    named = _NAMED_CODE.search(owned) is not None
    return "ID" if (plausible_code if named else code_shape)(match.group("value")) else None


QUOTED_RULE = Rule("ID", _QUOTED, 0.6, _quoted_kind)
# "crn 2291 8812 is my number at the surgery": the code first, then what it is
CODE_FIRST_RULE = Rule(
    "ID",
    re.compile(
        rf"(?i)(?<![\w./()+:-])(?=\S*\d|[a-z]{{2,4}}\s\S*\d){VALUE}"  # a digit soon: fails fast
        rf"\s+(?:is|was|=)\s+(?:my|his|her|our|their|the)\s+(?:[a-z]+\s+){{0,2}}?"
        rf"(?:{_CODE_WORDS}|{CUES['MRN']}|id)\b"
    ),
    0.6,
    lambda t, m: _plausible_code(t, m, "ID"),
)


def _phone_kind(text: str, match: re.Match[str]) -> str | None:
    """FAX when the nearest cue before the number says fax, else PHONE; 7-15 digits only."""
    digits = sum(ch.isdigit() for ch in match.group(0))
    if not 7 <= digits <= 15:
        return None
    window = text[max(0, match.start() - 50) : match.start()].lower()
    window = re.split(r"\d{3,}", window)[-1]  # only what follows the previous number
    fax = max(window.rfind("fax"), -1)
    voice = max(window.rfind(w) for w in ("phone", "tel", "cell", "mobile", "call", "text"))
    after = text[match.end() : match.end() + 15].lower()
    if fax > voice or (fax == voice == -1 and "fax" in after):
        return "FAX"
    return "PHONE"


_EXT = r"(?:\s*(?:ext\.?|extension|x)\s*\d{1,5})?"
PHONE_RULES = [
    Rule(
        "PHONE",
        re.compile(
            rf"(?<![\w+])(?:\+?1[\s.-]?)?(?:\(\d{{3}}\)\s?|\d{{3}}[\s.-])\d{{3}}[\s.-]\d{{4}}(?!\d){_EXT}"
        ),
        0.7,
        _phone_kind,
    ),
    Rule("PHONE", re.compile(rf"(?<![\w+.-])(?:\+?1)?\d{{10}}(?![\w-]){_EXT}"), 0.5, _phone_kind),
    Rule(
        "PHONE",
        re.compile(r"(?<![\w])\+\d{1,3}(?:[\s.-]?\(?\d{1,5}\)?){2,6}(?![\w])"),
        0.7,
        _phone_kind,
    ),
    Rule(
        "PHONE",
        re.compile(r"(?<![\w])0\d{2,4}[\s-]?\d{3,4}[\s-]?\d{3,4}(?![\w])"),
        0.6,
        _phone_kind,
    ),
]

_IMAGE = r"(?:jpe?g|png|gif|heic|heif|bmp|tiff?|webp|dng|raw)"
_TLD = r"(?:com|org|net|edu|gov|mil|io|ly|be|me|co|uk|ca|us|info|app|health|link|page|site|ai)"


def _url_kind(text: str, match: re.Match[str]) -> str:
    """A link to an image, or one right after words about a photo, is a PHOTO."""
    if re.search(rf"\.{_IMAGE}(?:\?\S*)?$", match.group(0), re.IGNORECASE):
        return "PHOTO"
    before = text[max(0, match.start() - 40) : match.start()].lower()
    if re.search(r"photo|picture|\bpics?\b|selfie|image|headshot|\bface\b", before):
        return "PHOTO"
    return "URL"


WEB_RULES = [
    Rule("EMAIL", re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"), 0.95),
    Rule(
        "EMAIL",
        re.compile(
            rf"(?i)\b\w+(?:(?:\s+dot\s+|\.)\w+)*\s*(?:\(at\)|\[at\]|\s+at\s+)\s*\w+"
            rf"(?:\s*(?:\(dot\)|\[dot\]|\s+dot\s+)\s*\w+)*?(?:\s*(?:\(dot\)|\[dot\]|\s+dot\s+)\s*){_TLD}\b"
        ),
        0.9,
    ),
    Rule("URL", re.compile(r"(?i)\b(?:https?://|www\.)[^\s<>\"'\]]+"), 0.8, _url_kind),
    Rule(
        "URL",
        re.compile(rf"(?i)(?<![@\w.-])(?:[a-z0-9-]+\.)+{_TLD}\b(?:/[^\s<>\"'\]]*)?"),
        0.6,
        _url_kind,
    ),
    Rule(
        "PHOTO",
        re.compile(rf"(?i)(?<![\w/.-])(?:\.{{0,2}}/)?(?:[\w.-]+/)*[\w.-]+\.{_IMAGE}\b"),
        0.9,
    ),
]

SHAPE_RULES = [
    Rule("SSN", re.compile(r"(?<![\w-])\d{3}-\d{2}-\d{4}(?![\w-])"), 0.8),
    Rule("SSN", re.compile(r"(?<![\w-])\d{3} \d{2} \d{4}(?![\w-])"), 0.6),
    Rule(
        "SSN",
        re.compile(
            r"(?i)last\s+(?:4|four)(?:\s+digits)?\s+of\s+(?:my|his|her|the)\s+(?:ssn|social(?:\s+security)?"
            r"(?:\s+number)?)(?:\s+(?:is|are|:))?\s*(?P<value>\d{4})\b"
        ),
        0.9,
    ),
    # VINs: 17 characters without I, O, Q, mixing letters and digits.
    Rule(
        "VEHICLE",
        re.compile(
            r"\b(?=[A-HJ-NPR-Z0-9]{17}\b)(?=[A-HJ-NPR-Z0-9]*\d)(?=[A-HJ-NPR-Z0-9]*[A-HJ-NPR-Z])"
            r"[A-HJ-NPR-Z0-9]{17}\b"
        ),
        0.85,
    ),
    Rule(
        "IP",
        re.compile(
            r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?![\w.])"
        ),
        0.9,
    ),
]


def id_recognizers() -> list[RegexRecognizer]:
    """The recognisers of this module, ready for a presidio registry."""
    cue_rules = [_cue_rule(entity, cue) for entity, cue in CUES.items()]
    cue_rules += [_cue_rule("ID", _CODE_WORDS), HASH_RULE, QUOTED_RULE, CODE_FIRST_RULE]
    return [
        RegexRecognizer("ArloopCueIdRecognizer", cue_rules),
        RegexRecognizer("ArloopPhoneRecognizer", PHONE_RULES),
        RegexRecognizer("ArloopWebRecognizer", WEB_RULES),
        RegexRecognizer("ArloopShapeRecognizer", SHAPE_RULES),
    ]
