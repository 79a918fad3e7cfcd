"""The triage agent's safety envelope and safe fallback: what holds whatever the model writes.

`TriageGuard` is the triage agent's `agents.guard.Guard`. On the (PHI-scrubbed) message and the
model's last answer it applies, in this order:
1. red flags (`agents.packs.red_flags`): the message always gets the emergency escalation
   (call emergency services now, what to do meanwhile, the disclaimer, `Triage: emergency`);
   the model's text is added after it only if it passes every check below;
2. the checks (`check`, the agent's own verifier: a level line, the disclaimer, no dose, red
   flags escalated, and the screen for empty, repeating, gibberish, off-topic or offensive
   text), recomputed here rather than trusted from the graph's verdict: an answer that passes
   is returned as the model wrote it;
3. otherwise the fallback: it cannot assess reliably, when to call emergency services,
   contact a clinician today, the disclaimer, `Triage: urgent`.
What it found goes into the trajectory's metadata: `arloop.red_flags`, `arloop.model_checks`
(pass or fail) and, on a red-flag message, `arloop.model_escalated` (whether the model's own
answer said emergency before the envelope did: the share the learning loop should raise).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agents.events import AnswerPath
from agents.guard import Reviewed
from agents.packs.red_flags import ADVICE, red_flags
from tools.verifiers import DISCLAIMER, TriageCheck, triage_level

CALL_NOW = "Call emergency services now (999 in the UK, 911 in the US, 112 in the EU)."
FALLBACK_LEVEL = "urgent"
FALLBACK = (
    "I cannot assess this reliably from your message. Call emergency services now (999 in the "
    "UK, 911 in the US, 112 in the EU) for chest pain, difficulty breathing, signs of a stroke "
    "(face drooping, arm weakness, slurred speech), heavy bleeding, a severe allergic reaction, "
    "collapse or thoughts of ending your life. Otherwise contact a doctor, a pharmacist or your "
    f"local urgent advice service today. {DISCLAIMER}\nTriage: {FALLBACK_LEVEL}"
)


def escalation(flags: list[str], model_text: str | None = None) -> str:
    """The emergency answer for these red flags; `model_text` (checked) after it, if given."""
    lines = [f"This could be an emergency ({', '.join(flags)}). {CALL_NOW}"]
    lines += [ADVICE[f] for f in flags]
    said = {_norm(s) for line in lines for s in _sentences(line)}
    if model_text:
        extra = [s for s in _sentences(_body(model_text)) if _norm(s) not in said]
        if extra:
            lines.append(" ".join(extra))
    return "\n".join(lines + [DISCLAIMER, "Triage: emergency"])


@dataclass(frozen=True)
class TriageGuard:
    """The envelope and fallback above around the triage agent (an `agents.guard.Guard`)."""

    check: TriageCheck

    def __call__(self, question: str, answer: str, verdict: str) -> Reviewed:
        flags = red_flags(question)
        passed = not self.check.problems(question, answer)
        meta = {"model_checks": "pass" if passed else "fail"}
        if flags:
            meta |= {
                "red_flags": ",".join(flags),
                "model_escalated": str(triage_level(answer) == "emergency").lower(),
            }
            text = escalation(flags, answer if passed else None)
            return Reviewed(text, AnswerPath.ENVELOPE, meta)
        if passed:
            return Reviewed(answer, AnswerPath.MODEL, meta)
        return Reviewed(FALLBACK, AnswerPath.FALLBACK, meta)


def _body(text: str) -> str:
    """A reply without its `Triage:` lines and disclaimer (the envelope says both once)."""
    kept = [line for line in text.splitlines() if not re.match(r"\s*triage\b", line, re.I)]
    return " ".join(" ".join(kept).replace(DISCLAIMER, " ").split())


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def _norm(sentence: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", sentence.lower()))
