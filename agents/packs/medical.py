"""The medical-consult pack: a triage assistant (Reflexion + kb_search), patient cases, verifier.

`triage` looks the symptom up in the pack's knowledge base (`kb/medical`, paraphrased from
NHS, CDC and WHO pages; each file names its source) and ends with a disclaimer and
`Triage: <level>` (self-care, see a doctor, urgent, emergency). Each attempt is judged by
`tools.verifiers.TriageCheck` with the pack's red-flag rules and answer screen (a level, the
disclaimer, no dose at all, red flags escalated, nothing empty, repeating, off-topic or
offensive); a failed attempt is reflected on and retried. The user's message is PHI-scrubbed
before it enters the graph.

The rules are data (`data/triage_discriminators.toml`: discriminators from NHS 111/999
pages, NICE guidelines, WHO ETAT and the Manchester Triage System, each naming its source),
read by `red_flags.assess`: red flags, the floor that who is ill and what they measured set,
and the follow-up question worth asking when a message lacks what would change the level
(a baby's age with a fever, pregnancy with tummy pain, a diabetic's reading). The model may
ask that question itself, once per case; the user's reply joins the case on the next turn.

What the pack guarantees does not rest on the model: `TriageEnvelope` (`triage_envelope.py`)
escalates every red-flag message by rule, raises an answer below the floor, asks the rules'
question where the answer could be urgent, and replaces an answer that still fails its
checks with a fallback at the level the rules support (see that module). Generation is short (`GENERATION`: a token budget,
a stop at the `Triage:` line, a repetition penalty) and the knowledge base answers with two
short passages, to answer in seconds on a CPU.

This is an information service, not a medical device: the bundled 135M model gets the level
right only part of the time (see the README), which is what the learning loop works on.
"""

from __future__ import annotations

from pathlib import Path

from agents.decisions import Decision
from agents.packs.base import Pack, Split, Task
from agents.packs.common import scrub_input
from agents.packs.red_flags import assess, red_flags
from agents.packs.screen import Screen
from agents.packs.triage_cases import Case, cases
from agents.packs.triage_envelope import FALLBACK_ADVICE, TriageEnvelope, escalation, fallback
from agents.packs.triage_rules import rules
from agents.policy_client import Generation
from agents.runtime import AgentSpec
from tools.kb_search import KbSearch
from tools.verifiers import (
    DISCLAIMER,
    LEVELS,
    TriageCheck,
    asks_about,
    is_question,
    mentioned_level,
    triage_level,
    verify_triage,
    with_level,
)

KB_DIR = Path(__file__).parent / "kb" / "medical"

SYSTEM = (
    "You are a medical triage assistant (you are not a clinician). Look up the patient's main "
    "symptom in the knowledge base, then choose one triage level: self-care, see a doctor, "
    "urgent, or emergency. Red flags (chest pain, trouble breathing, stroke signs, heavy "
    "bleeding, collapse, a severe allergic reaction, thoughts of suicide) are always emergency: "
    "tell them to call emergency services now. If the message lacks what would change the level "
    "(what is wrong, a baby's age with a fever, whether she could be pregnant, a diabetic's "
    "blood sugar reading, how long), ask one short question instead, with no Triage line. "
    "Never give medicine doses. Reply in one or two short "
    f"sentences, then say: {DISCLAIMER} End with the line 'Triage: <level>'."
)
EXAMPLE = (
    {"role": "user", "content": "I have a mild sore throat since two days. What should I do?"},
    {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call_example",
                "type": "function",
                "function": {"name": "kb_search", "arguments": '{"query": "sore throat"}'},
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_example",
        "content": (
            '[1] Sore throat — Self-care level: care at home\nSource: NHS, "Sore throat"\nGargle '
            "with warm salty water (adults), drink plenty of water, eat cool or soft food, and rest."
        ),
    },
    {
        "role": "assistant",
        "content": (
            "A mild sore throat usually gets better by itself within a week: rest, drink plenty "
            f"of water and ask a pharmacist about lozenges. {DISCLAIMER}\nTriage: self-care"
        ),
    },
)


GENERATION = Generation(
    temperature=0.0,
    max_tokens=80,
    stop=tuple(f"Triage: {level}" for level in LEVELS),
    include_stop=True,
    frequency_penalty=0.3,
    presence_penalty=0.3,
)
"""How `triage` samples: a reply is a few sentences and ends at its `Triage:` line (kept);
the penalties (OpenAI's) damp the small model's loops of a repeated passage."""
KB_PASSAGES, KB_PASSAGE_CHARS = 2, 280
"""Passages per search and characters each: the answer needs the level's section, not pages."""


def head_level(message: str, label: str) -> str:
    """The level a head's label may give this message: `emergency` only where a published
    discriminator fires (where the envelope escalates anyway), else `urgent`, whose advice
    says when to call emergency services. Measured on 452 messages no head was fitted on
    (seed 2's released head, 2026-12-06, docs/medical.md): where no red flag fired, the head's
    `emergency` was right 3 times and wrong 51, at probabilities up to 0.99."""
    return "urgent" if label == "emergency" and not red_flags(message) else label


LEVEL = Decision("level", LEVELS, apply=with_level, read=triage_level, bound=head_level)
"""The level is the version's level head's where it has one (`learner.policy.heads`): fitted
on clinicians' dispositions, it reads the level off the base model's hidden states, which the
135M model's own words rarely get right; the model's reply keeps its words, the `Triage:`
line becomes the head's (`emergency` only on a red flag: `head_level`), and the envelope's
floors and red flags still apply over it."""


def screen() -> Screen:
    """The answer screen of the pack: its vocabulary is the knowledge base and its own texts."""
    kb = "\n".join(p.read_text(encoding="utf-8") for p in sorted(KB_DIR.glob("*.md")))
    answer = EXAMPLE[-1]["content"]
    data = rules()
    own = [fallback(level, tuple(f.flag for f in data.rules)) for level in FALLBACK_ADVICE]
    own += [a.question for a in data.asks] + [escalation(sorted(data.advice))]
    return Screen.of(kb, SYSTEM, answer, *own)


def check() -> TriageCheck:
    """The triage checks: the verifier's rules, the pack's red flags and the screen."""
    return TriageCheck(red_flags=red_flags, screens=(screen(),), assess=assess)


def triage() -> AgentSpec:
    """The triage assistant: knowledge-base search, four levels, red flags always emergency."""
    checks = check()
    return AgentSpec(
        name="triage",
        description="Medical-information triage: looks up guidance and says when to seek care.",
        system_prompt=SYSTEM,
        kind="reflexion",
        tools=(KbSearch(KB_DIR, max_passages=KB_PASSAGES, passage_chars=KB_PASSAGE_CHARS),),
        verifier=checks,
        task_kind="triage",
        max_steps=3,
        max_attempts=2,
        examples=EXAMPLE,
        input_filter=scrub_input,
        disclaimer=DISCLAIMER,
        escalate=notice,
        guard=TriageEnvelope(checks),
        generation=GENERATION,
        retry_when=lambda question: not red_flags(question),  # escalated by rule at once
        decision=LEVEL,
    )


EMERGENCY = (
    "Possible emergency: call emergency services now (999 in the UK, 911 in the US, 112 in "
    "the EU), or go to the nearest emergency department."
)
URGENT = "Urgent: get medical help today (NHS 111, an urgent care centre or your doctor)."


def notice(message: str, answer: str) -> str | None:
    """What the person must see beside the answer (the chat page's banner), by the pack's rules: a red flag in their message is an
    emergency whatever the answer says; else the answer's own urgent or emergency level."""
    level = triage_level(answer)
    if red_flags(message) or level == "emergency":
        return EMERGENCY
    return URGENT if level == "urgent" else None


def task(c: Case) -> Task:
    return Task(
        id=c.id,
        agent="triage",
        input=c.message,
        reference=c.level,
        needs_tool="kb_search",
        meta={"red_flag": str(c.red_flag).lower(), "symptom": c.symptom},
    )


def verify(t: Task, output: str) -> float:
    """1 for the right level, 0.5 for one level too cautious, 0 otherwise or a missed red flag.

    A case that lacks what would change its level (reference `ask`): 1 for a question about
    what the rules would ask, 0.5 for the cautious level it could reach, else 0."""
    if t.reference == "ask":
        ask = assess(t.input).ask
        if ask is None:
            return 0.0
        if is_question(output):
            return 1.0 if asks_about(output, ask.keywords) else 0.0
        return 0.5 if triage_level(output) == ask.raises_to else 0.0
    return verify_triage(output, t.reference, t.meta.get("red_flag") == "true")


def pack() -> Pack:
    """The medical pack: `triage`, its training and held-out patient cases, its verifier."""

    def tasks(split: Split) -> list[Task]:
        return [task(c) for c in cases(split)]

    return Pack(
        "medical",
        (triage(),),
        tasks,
        verify,
        answer_of=triage_level,
        reference_from=mentioned_level,
        restate=with_level,
    )
