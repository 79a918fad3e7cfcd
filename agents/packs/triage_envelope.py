"""The triage agent's safety envelope: what holds whatever the model writes.

`TriageEnvelope` is the triage agent's `agents.guard.Guard`. It reads the (PHI-scrubbed) case
with the pack's rules (`agents.packs.red_flags.assess`: red flags, the floor set by who is ill
and what they measured, the follow-up question worth asking) and the model's last answer,
and returns, in this order:
1. red flags: the emergency escalation (call emergency services now, what to do meanwhile,
   the disclaimer, `Triage: emergency`); the model's text is added after it only if it
   passes every check;
2. an answer that passes every check (`check`, the agent's verifier, recomputed here rather
   than trusted from the graph): returned as the model wrote it, a triage or the follow-up
   question the rules allow (one per case);
3. an answer whose only fault is a level below the floor: raised to the floor, the reason
   said first, the model's text kept (`arloop.floor_action=raised`);
4. a case that lacks what could make it urgent or an emergency (a baby's age with a fever,
   pregnancy with tummy pain, a diabetic's reading): the rules' question, with when to call
   emergency services meanwhile (`arloop.asked_by=rules`);
5. otherwise the fallback, at the level the rules' findings support (never below the floor,
   `see a doctor` when they find nothing), saying when to call emergency services.
The trajectory's metadata says which (`arloop.floor`, `arloop.floor_reasons`,
`arloop.floor_action`, `arloop.asked`, `arloop.asked_by`, `arloop.fallback_level`,
`arloop.model_checks`, and on a red flag `arloop.red_flags` and `arloop.model_escalated`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agents.events import AnswerPath
from agents.guard import Reviewed
from agents.packs.red_flags import ADVICE, Assessment, assess
from tools.verifiers import (
    ASK_FIRST,
    DISCLAIMER,
    LEVELS,
    LOW_LEVEL,
    TriageCheck,
    is_question,
    triage_level,
)

CALL_NOW = "Call emergency services now (999 in the UK, 911 in the US, 112 in the EU)."
WHEN_TO_CALL = (
    "Call emergency services now (999 in the UK, 911 in the US, 112 in the EU) for chest pain, "
    "difficulty breathing, signs of a stroke (face drooping, arm weakness, slurred speech), "
    "heavy bleeding, a severe allergic reaction, collapse, a fit, confusion or thoughts of "
    "ending your life."
)
FALLBACK_ADVICE = {
    "see a doctor": "Otherwise book an appointment with a doctor or ask a pharmacist in the next "
    "few days, sooner if it gets worse.",
    "urgent": "Otherwise contact a doctor or your local urgent advice service today.",
    "emergency": CALL_NOW,
}
FALLBACK_LEVEL = "see a doctor"
"""The fallback's level when the rules find nothing: not self-care, which needs an answer."""


def fallback(level: str = FALLBACK_LEVEL, reasons: tuple[str, ...] = ()) -> str:
    """The safe answer at `level` (`see a doctor` or above), naming what the rules found."""
    why = f" Your message mentions {', '.join(reasons)}." if reasons else ""
    return (
        f"I cannot assess this reliably from your message.{why} {WHEN_TO_CALL} "
        f"{FALLBACK_ADVICE[level]} {DISCLAIMER}\nTriage: {level}"
    )


FALLBACK = fallback()


def escalation(flags: list[str], model_text: str | None = None) -> str:
    """The emergency answer for these red flags; `model_text` (checked) after it, if given."""
    lines = [f"This could be an emergency ({', '.join(flags)}). {CALL_NOW}"]
    lines += list(dict.fromkeys(ADVICE[f] for f in flags))
    said = {_norm(s) for line in lines for s in _sentences(line)}
    if model_text:
        extra = [s for s in _sentences(_body(model_text)) if _norm(s) not in said]
        if extra:
            lines.append(" ".join(extra))
    return "\n".join(lines + [DISCLAIMER, "Triage: emergency"])


def raised(answer: str, level: str, reasons: list[str]) -> str:
    """The model's answer with its level raised to the floor, the reason said first."""
    head = f"Because your message mentions {', '.join(reasons)}, this needs at least: {level}."
    return f"{head} {_body(answer)} {DISCLAIMER}\nTriage: {level}"


def question(asked: str) -> str:
    """The rules' follow-up question, with when not to wait for the answer."""
    return f"{asked} {WHEN_TO_CALL}"


@dataclass(frozen=True)
class TriageEnvelope:
    """The envelope above around the triage agent (an `agents.guard.Guard`)."""

    check: TriageCheck

    def __call__(self, case: str, answer: str, verdict: str) -> Reviewed:
        a = assess(case)
        problems = self.check.problems(case, answer)
        meta = _found(a) | {"model_checks": "fail" if problems else "pass"}
        if a.flags:
            meta |= {
                "red_flags": ",".join(a.flags),
                "model_escalated": str(triage_level(answer) == "emergency").lower(),
            }
            text = escalation(list(a.flags), None if problems else answer)
            return Reviewed(text, AnswerPath.ENVELOPE, meta)
        if not problems and is_question(answer) and a.ask is not None:
            meta |= {"asked": a.ask.fact, "asked_by": "model"}
            return Reviewed(answer, AnswerPath.MODEL, meta, follow_up=a.ask.label)
        if not problems:
            return Reviewed(answer, AnswerPath.MODEL, meta)
        level = triage_level(answer)
        if level is not None and a.floor and all(p.startswith(LOW_LEVEL) for p in problems):
            meta |= {"floor_action": "raised", "model_level": level}
            text = raised(answer, a.floor, a.reasons(a.floor))
            return Reviewed(text, AnswerPath.ENVELOPE, meta)
        if a.ask is not None and a.ask.required:
            meta |= {"asked": a.ask.fact, "asked_by": "rules"}
            if level is not None and not all(p.startswith(ASK_FIRST) for p in problems):
                meta["floor_action"] = "replaced"
            return Reviewed(question(a.ask.question), AnswerPath.FALLBACK, meta, a.ask.label)
        fell_to = max(a.floor or FALLBACK_LEVEL, FALLBACK_LEVEL, key=LEVELS.index)
        meta["fallback_level"] = fell_to
        if a.floor and level is not None and LEVELS.index(level) < LEVELS.index(a.floor):
            meta["floor_action"] = "replaced"
        reasons = tuple(f.flag for f in a.findings)
        return Reviewed(fallback(fell_to, reasons), AnswerPath.FALLBACK, meta)


def _found(a: Assessment) -> dict[str, str]:
    """What the rules found, for the trajectory's metadata."""
    meta = {}
    if a.floor:
        meta |= {"floor": a.floor, "floor_reasons": ",".join(a.reasons(a.floor))}
    if a.answered:
        meta["answered"] = ",".join(a.answered)
    return meta


def _body(text: str) -> str:
    """A reply without its `Triage:` lines and disclaimer (the envelope says both once)."""
    kept = [line for line in text.splitlines() if not re.match(r"\s*triage\b", line, re.I)]
    return " ".join(" ".join(kept).replace(DISCLAIMER, " ").split())


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def _norm(sentence: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", sentence.lower()))
