"""Recognisers for numbers and codes: cue-led identifiers, SSN, phone/fax, e-mail, URL/photo, VIN."""

from __future__ import annotations

import re

from agents.pii.base import RegexRecognizer, Rule

# A code after a cue: chunks split by single spaces, each with a digit, or short capitals
# between them (`GB82 WEST 1234`, `BXT 448210 H`); a short prefix word is allowed (`Rx 7712934`).
_CHUNK = r"[A-Za-z0-9(][A-Za-z0-9_./()+:-]*"
_STRONG = rf"(?=[A-Za-z0-9_./()+:-]*\d){_CHUNK}"
_CAPS = r"(?-i:(?!I\b|A\b)[A-Z]{1,5})(?![A-Za-z0-9])"
VALUE = rf"(?P<value>(?:(?-i:[A-Z][A-Za-z]{{0,3}})\s(?={_STRONG}))?{_STRONG}(?:\s(?:{_STRONG}|{_CAPS}))*)"
_FILLER = (
    r"(?:number|num|nbr|no|nr|id|identifier|code|is|was|are|of|my|the|ending|in|template|hash|"
    r"scan|print|enrollment|enrolment|signature|sample|key|username|name|plate|serial)"
)
_WINDOW = rf"(?:[\s:#=.,\-]+{_FILLER}\b\.?){{0,4}}[\s:#=.\-]*"
_UNIT = re.compile(
    r"^\d+(?:[.,]\d+)?(?:mg|mcg|ug|g|kg|ml|l|iu|units?|mmhg|bpm|cm|mm|m|km|lbs?|oz|c|f|h|hrs?|"
    r"mins?|s|x|am|pm|yo|st|nd|rd|th|%)$",
    re.IGNORECASE,
)

CUES = {
    "SSN": r"ssn|ss\s?#|s\.s\.n\.?|social\s+security(?:\s+(?:number|no\.?|#))?|social",
    "MRN": r"mrn|m\.r\.n\.?|medical\s+record|record|(?-i:MR)\s?#|chart|hospital\s*(?:number|no\.?|#|id)"
    r"|patient\s+(?:id|number|no\.?|#)|pt\s+id|unit\s+number",
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


def _plausible_code(text: str, match: re.Match[str], entity: str) -> str | None:
    """At least four characters and not a dose or a measurement (`500mg`, `2 weeks`)."""
    value = match.group("value")
    core = re.sub(r"[^A-Za-z0-9]", "", value)
    if len(core) < 4 or _UNIT.match(value.replace(" ", "")):
        return None
    return entity


def _cue_rule(entity: str, cue: str) -> Rule:
    pattern = re.compile(rf"(?i)\b(?:{cue})(?![a-z]){_WINDOW}{VALUE}")
    return Rule(entity, pattern, CUE_SCORE[entity], lambda t, m: _plausible_code(t, m, entity))


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
    return [
        RegexRecognizer("ArloopCueIdRecognizer", cue_rules),
        RegexRecognizer("ArloopPhoneRecognizer", PHONE_RULES),
        RegexRecognizer("ArloopWebRecognizer", WEB_RULES),
        RegexRecognizer("ArloopShapeRecognizer", SHAPE_RULES),
    ]


# Anything left that looks like a code: long digit runs, or letters and digits mixed.
_TOKEN = re.compile(r"(?<![\w-])[A-Za-z0-9][A-Za-z0-9_-]*[A-Za-z0-9](?![\w-])")
# COVID-19, CA-125, 3rd, and compounds such as 120-page or 10-year-old are no codes.
_MEDICAL_CODE = re.compile(
    r"^[A-Za-z]{1,6}-\d{1,3}$|^\d+(?:st|nd|rd|th)$|^\d+-[a-z]+(?:-[a-z]+)*$", re.IGNORECASE
)


def leftover_codes(text: str, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans of code-like tokens no recogniser claimed ("any other unique identifying number")."""
    out = []
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if any(s < match.end() and match.start() < e for s, e in covered):
            continue
        digits = sum(ch.isdigit() for ch in token)
        letters = sum(ch.isalpha() for ch in token)
        code_like = digits >= 7 or (digits >= 3 and letters >= 2 and len(token) >= 6)
        if code_like and not _MEDICAL_CODE.match(token) and not _UNIT.match(token):
            out.append(match.span())
    return out
