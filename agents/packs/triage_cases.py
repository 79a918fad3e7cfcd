"""Patient messages for the medical pack, with the triage level the knowledge base implies.

Each symptom phrase is placed at the level the pack's knowledge base (`kb/medical`, written
from NHS/CDC guidance) gives it; emergency phrases are red flags. The eval split holds out
whole phrases: `HELD_OUT` phrases per level never appear in a training message.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agents.packs.red_flags import assess
from tools.verifiers import LEVELS

SYMPTOMS: dict[str, tuple[str, ...]] = {
    "self-care": (
        "a runny nose and sneezing since yesterday",
        "a mild sore throat for two days",
        "a blocked nose from a cold",
        "a mild headache after a long day at work",
        "mild muscle soreness after the gym",
        "a mild sunburn on my shoulders",
        "a small cut on my finger that stopped bleeding",
        "a mosquito bite that itches",
        "a small bruise on my shin",
        "a cough since a cold last week",
        "an upset stomach and diarrhoea since this morning",
        "a small burn from the oven with only redness",
    ),
    "see a doctor": (
        "a cough that has lasted four weeks",
        "a rash that has not gone away after two weeks",
        "heartburn most days for a month",
        "a mole that has changed shape",
        "ear pain for five days",
        "headaches that keep coming back every morning",
        "a fever that has lasted four days",
        "pain when I pee for three days",
        "knee pain that keeps coming back when I climb stairs",
        "low mood and poor sleep for six weeks",
        "a sore throat that has not improved after a week",
        "diarrhoea for ten days",
    ),
    "urgent": (
        "a deep cut on my hand that is gaping open",
        "a burn bigger than my hand with blisters",
        "a twisted ankle and I cannot put any weight on it",
        "a temperature of 40 C and I feel very unwell",
        "severe pain that moved to the lower right side of my belly",
        "pain in my lower back with a fever and pain when I pee",
        "vomiting all day and I cannot keep water down",
        "a sore throat so painful I cannot swallow water",
        "earache with swelling and redness behind my ear",
        "a cut that is red, hot and full of pus",
        "a cough with a high temperature and my breathing is getting worse",
        "bloody diarrhoea since yesterday",
    ),
    "emergency": (
        "crushing chest pain spreading to my left arm",
        "chest pain and I am sweating a lot",
        "sudden trouble breathing and my lips look blue",
        "my face is drooping on one side and my speech is slurred",
        "bleeding heavily from a wound and it will not stop",
        "my throat is swelling after a bee sting",
        "the worst headache of my life that came on suddenly",
        "thoughts of ending my life",
        "my father collapsed and is unconscious",
        "vomiting blood",
        "a fever with a stiff neck and a rash that does not fade",
        "my arm is weak and my face feels numb on one side",
    ),
}
ASK: tuple[str, ...] = (
    "my baby has had a fever since this morning",
    "my daughter has a temperature and a cough",
    "my wife has bad cramps low down in her tummy",
    "diabetes and I have been feeling sick and very thirsty",
    "my toddler has a high temperature and is grizzly",
    "my girlfriend has a headache and tummy pain",
    "my son feels hot to touch and will not eat",
    "my partner is diabetic and has been vomiting since last night",
    "my sister has stomach ache and some spotting",
)
"""Messages that lack what would change the level (`ask` cases): a child's age with a fever,
whether she could be pregnant, a diabetic's reading. The right reply is the follow-up
question the rules would ask (`medical.verify`)."""
HELD_OUT = 3  # phrases per level kept for the eval split
OPENERS = (
    "Hi, {s}. What should I do?",
    "Hello. {S}. Is this serious?",
    "{S}. Should I see someone?",
    "Quick question: {s}. What do you advise?",
)
VAGUE = (
    "I don't feel well. What should I do?",
    "Something is wrong with me, can you help?",
    "Is it serious?",
)


@dataclass(frozen=True)
class Case:
    """A patient's message, the level it needs, and whether it carries a red flag."""

    id: str
    message: str
    level: str
    red_flag: bool
    symptom: str


def split_phrases(split: str) -> dict[str, tuple[str, ...]]:
    """Each level's phrases of a split (`ask`: the follow-up cases): the last `HELD_OUT` of
    each are eval-only."""
    groups = SYMPTOMS | {"ask": ASK}
    if split == "eval":
        return {level: s[-HELD_OUT:] for level, s in groups.items()}
    return {level: s[:-HELD_OUT] for level, s in groups.items()}


def cases(split: str) -> list[Case]:
    """Every (phrase, opener) message of the split, in a fixed shuffled order."""
    out = [
        _case(f"{split}-{_code(level)}-{i}-{j}", _message(opener, phrase), level, phrase)
        for level, phrases in split_phrases(split).items()
        for i, phrase in enumerate(phrases)
        for j, opener in enumerate(OPENERS)
    ]
    random.Random(0 if split == "train" else 1).shuffle(out)
    return out


def _code(level: str) -> str:
    return "ask" if level == "ask" else str(LEVELS.index(level))


def _message(opener: str, phrase: str) -> str:
    clause = phrase if phrase.startswith("my ") else f"I have {phrase}"
    return opener.format(s=clause, S=clause[0].upper() + clause[1:])


def _case(case_id: str, message: str, level: str, phrase: str) -> Case:
    flagged = level == "emergency"
    found = assess(message)
    if flagged != bool(found.flags):  # the red-flag rules and the levels must agree
        raise AssertionError(f"case {case_id}: level {level} but red flags {found.flags}")
    if (level == "ask") != (found.ask is not None and found.ask.required):
        raise AssertionError(f"case {case_id}: level {level} but the rules ask {found.ask}")
    return Case(case_id, message, level, flagged, phrase)
