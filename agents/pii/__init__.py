"""PHI/PII scrubbing before anything reaches Redis or a log: the 18 HIPAA Safe Harbor identifiers.

presidio-analyzer runs offline (no NLP model) with its checksum-validated recognisers plus ours
(`pii_ids`, `pii_dates`, `pii_places`, `pii_names`); every finding becomes a typed placeholder
such as `[NAME]` or `[DATE]`. Years stay, as Safe Harbor allows, except birth years past age 89.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from agents.pii.base import presidio  # first: it keeps torch out of presidio's import
from agents.pii.codes import leftover_codes
from agents.pii.dates import date_recognizers
from agents.pii.ids import id_recognizers
from agents.pii.names import name_recognizers
from agents.pii.places import place_recognizers

TYPES = (
    "NAME",
    "ADDRESS",
    "LOCATION",
    "ZIP",
    "DATE",
    "AGE",
    "PHONE",
    "FAX",
    "EMAIL",
    "SSN",
    "MRN",
    "HEALTH_PLAN",
    "ACCOUNT",
    "LICENSE",
    "VEHICLE",
    "DEVICE",
    "URL",
    "IP",
    "BIOMETRIC",
    "PHOTO",
    "ID",
)

# presidio's own recognisers we trust offline: class -> (its entity, our type, lowest score kept).
# Scores of 1.0 mean a checksum passed; the rest come from patterns alone. Not NhsRecognizer:
# one US phone number in eleven passes its checksum, and "NHS number" is a cue of ours.
_PREDEFINED = {
    "EmailRecognizer": ("EMAIL_ADDRESS", "EMAIL", 0.5),
    "IpRecognizer": ("IP_ADDRESS", "IP", 0.5),
    "UrlRecognizer": ("URL", "URL", 0.5),
    "CreditCardRecognizer": ("CREDIT_CARD", "ACCOUNT", 0.9),
    "IbanRecognizer": ("IBAN_CODE", "ACCOUNT", 0.9),
    "MacAddressRecognizer": ("MAC_ADDRESS", "DEVICE", 0.5),
    "UuidRecognizer": ("UUID", "ID", 0.5),
    "UsSsnRecognizer": ("US_SSN", "SSN", 0.5),
    "UsMbiRecognizer": ("US_MBI", "HEALTH_PLAN", 0.5),
    "MedicalLicenseRecognizer": ("MEDICAL_LICENSE", "LICENSE", 0.9),
    "UsNpiRecognizer": ("US_NPI", "LICENSE", 0.9),
    "AbaRoutingRecognizer": ("ABA_ROUTING_NUMBER", "ACCOUNT", 0.9),
    "UkPostcodeRecognizer": ("UK_POSTCODE", "ZIP", 0.1),
    "CaPostalCodeRecognizer": ("CA_POSTAL_CODE", "ZIP", 0.1),
}
_CASE_SENSITIVE = {"UkPostcodeRecognizer", "CaPostalCodeRecognizer", "UsMbiRecognizer"}
_OUR_MIN_SCORE = 0.3
_PREDEFINED_WEIGHT = 0.85


@dataclass(frozen=True)
class Finding:
    """One identifier: its type, where it is (`text[start:end]`), and the text itself."""

    type: str
    start: int
    end: int
    text: str


class PhiScrubber:
    """Find and replace PHI/PII. Build once (a few seconds), then share: `find` keeps no state."""

    def __init__(self) -> None:
        self._analyzer = _build_analyzer()
        self.scrub("Warm-up: Dr. Jane Roe, 12 Elm Street, jane@example.org, 555-123-4567.")

    def find(self, text: str) -> list[Finding]:
        """Every identifier in `text`, overlaps merged, in order."""
        if not text or not text.strip():
            return []
        spans = []
        for res in self._analyzer.analyze(text=text, language="en", score_threshold=0.0):
            kind, floor = _our_type(res.entity_type)
            if kind and res.score >= floor:
                # A cue ("IMEI 3569...") outranks a shape that merely passes a checksum (Luhn).
                score = res.score if kind == res.entity_type else res.score * _PREDEFINED_WEIGHT
                spans.append((res.start, res.end, kind, score))
        spans += [
            (s, e, "ID", 0.3) for s, e in leftover_codes(text, [(s, e) for s, e, *_ in spans])
        ]
        return [Finding(kind, s, e, text[s:e]) for s, e, kind in _merge(spans)]

    def scrub(self, text: str) -> str:
        """`text` with each identifier replaced by its placeholder (`[NAME]`, `[PHONE]`, ...)."""
        out, last = [], 0
        for f in self.find(text):
            out += [text[last : f.start], f"[{f.type}]"]
            last = f.end
        return "".join(out) + text[last:]

    def scrub_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """New OpenAI-style messages: text content and tool-call arguments scrubbed."""
        return [self._scrub_message(m) for m in messages]

    def _scrub_message(self, message: dict[str, Any]) -> dict[str, Any]:
        new = copy.deepcopy(message)
        if new.get("role") in ("user", "assistant", "system") and isinstance(new.get("name"), str):
            new["name"] = self.scrub(new["name"])  # a participant name; a tool's name stays
        content = new.get("content")
        if isinstance(content, str):
            new["content"] = self.scrub(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    part["text"] = self.scrub(part["text"])
        for call in new.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                function["arguments"] = self._scrub_arguments(function["arguments"])
            elif isinstance(function, dict) and isinstance(function.get("arguments"), dict):
                function["arguments"] = self._scrub_json(function["arguments"])
        return new

    def _scrub_arguments(self, arguments: str) -> str:
        """JSON arguments stay valid JSON: only their string values are scrubbed."""
        try:
            return json.dumps(self._scrub_json(json.loads(arguments)), ensure_ascii=False)
        except json.JSONDecodeError:
            return self.scrub(arguments)

    def _scrub_json(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, list):
            return [self._scrub_json(v) for v in value]
        if isinstance(value, dict):
            return {k: self._scrub_json(v) for k, v in value.items()}
        return value


def _our_type(entity: str) -> tuple[str | None, float]:
    if entity in TYPES:
        return entity, _OUR_MIN_SCORE
    for presidio_entity, ours, floor in _PREDEFINED.values():
        if entity == presidio_entity:
            return ours, floor
    return None, 1.0


def _merge(spans: list[tuple[int, int, str, float]]) -> list[tuple[int, int, str]]:
    """Overlapping findings become one span, typed by the most confident."""
    merged: list[list] = []
    for start, end, kind, score in sorted(spans):
        if merged and start < merged[-1][1]:
            last = merged[-1]
            if score > last[3]:
                last[2], last[3] = kind, score
            last[1] = max(last[1], end)
        else:
            merged.append([start, end, kind, score])
    return [(s, e, k) for s, e, k, _ in merged]


def _build_analyzer():
    """presidio with no NLP model, its trusted recognisers, and ours."""
    registry = presidio.RecognizerRegistry(supported_languages=["en"])
    predefined = presidio.predefined_recognizers
    for class_name in _PREDEFINED:
        recognizer = getattr(predefined, class_name)(supported_language="en")
        if class_name in _CASE_SENSITIVE:
            recognizer.global_regex_flags = re.DOTALL | re.MULTILINE
        registry.add_recognizer(recognizer)
    for recognizer in (
        id_recognizers() + date_recognizers() + place_recognizers() + name_recognizers()
    ):
        registry.add_recognizer(recognizer)
    engine = presidio.nlp_engine.NoOpNlpEngine(models=[{"lang_code": "en", "model_name": "none"}])
    return presidio.AnalyzerEngine(
        registry=registry,
        nlp_engine=engine,
        supported_languages=["en"],
        context_aware_enhancer=_NoContext(),
    )


class _NoContext(presidio.context_aware_enhancers.ContextAwareEnhancer):
    """Without NLP tokens presidio's context step finds nothing, yet deep-copies every result."""

    def __init__(self) -> None:
        super().__init__(0.0, 0.0, 0, 0)

    def enhance_using_context(self, text, raw_results, nlp_artifacts, recognizers, context=None):
        return raw_results


_shared_lock = threading.Lock()
_shared: list[PhiScrubber] = []


def shared_scrubber() -> PhiScrubber:
    """The process's one scrubber, built on first use (presidio takes a second or two): the
    packs' input filter and the API's sink and memory use the same instance."""
    with _shared_lock:  # runs get here from several threads at once: build it once
        if not _shared:
            _shared.append(PhiScrubber())
    return _shared[0]
