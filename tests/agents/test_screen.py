"""The answer screen: good answers pass (its false-positive rate), bad ones never do."""

import re

import pytest

from agents.packs.medical import EXAMPLE, KB_DIR, screen
from agents.packs.red_flags import ADVICE
from agents.packs.screen import lexicon
from agents.packs.triage_cases import cases
from agents.packs.triage_envelope import FALLBACK, escalation
from tools.kb_search import KbSearch
from tools.verifiers import DISCLAIMER

# Good answers written for this test, in the register a clinician or a careful model uses,
# paraphrasing rather than quoting the knowledge base (question, answer).
WRITTEN = [
    (
        "I have a runny nose and sneezing since yesterday.",
        "That sounds like a common cold. Rest, keep warm and drink plenty of fluids; it usually "
        "clears up within a week or two.",
    ),
    (
        "My knee hurts when I climb stairs, and it keeps coming back.",
        "Knee pain that keeps coming back is worth a check: book an appointment with your GP.",
    ),
    (
        "I burnt my hand on the oven, it is only red.",
        "Cool the burn under cool running water for 20 minutes and cover it loosely. A small burn "
        "with only redness can be looked after at home.",
    ),
    (
        "My mole has changed shape.",
        "A mole that changes shape, colour or size should be looked at by a doctor. Please book "
        "an appointment in the coming days.",
    ),
    (
        "I have had heartburn most days for a month.",
        "Heartburn on most days for weeks is something to discuss with your GP; they can look "
        "at what is causing it.",
    ),
    (
        "I twisted my ankle and cannot put weight on it.",
        "If you cannot put any weight on it, get it checked today at an urgent care centre or "
        "minor injuries unit, as it could be broken.",
    ),
    (
        "My daughter has a temperature of 40 C and seems very unwell.",
        "A very high temperature with feeling very unwell needs help today: contact an urgent "
        "care service or your doctor now.",
    ),
    (
        "I have diarrhoea since this morning.",
        "Stay at home, sip fluids often and eat when you feel able. It normally settles within a "
        "few days; a pharmacist can suggest rehydration sachets.",
    ),
    (
        "I have had low mood and poor sleep for six weeks.",
        "I am sorry you are going through this. Low mood lasting weeks is worth talking about: "
        "see your GP, who can offer talking therapies and other support.",
    ),
    (
        "My ear has hurt for five days.",
        "Earache that has lasted more than three days should be seen by a GP.",
    ),
    (
        "I get a mild headache after a long day at work.",
        "Tension headaches are common and usually go away by themselves. Drink water, rest and "
        "take breaks from screens.",
    ),
    (
        "A mosquito bite itches a lot.",
        "Wash the bite, hold something cold on it and try not to scratch; a pharmacist can "
        "advise on a cream.",
    ),
    (
        "I have pain when I pee for three days.",
        "Burning when you pee for a few days may be a urine infection: see a GP or a pharmacist.",
    ),
    (
        "Cut on my hand that is deep and gaping.",
        "A deep or gaping cut may need stitches. Press on it with a clean cloth and get help "
        "today at urgent care.",
    ),
    (
        "I feel dizzy when I stand up quickly.",
        "Feeling dizzy for a moment when you stand up quickly is common. Stand up slowly and "
        "drink enough water; if it keeps happening, see your GP.",
    ),
    (
        "My chest hurts after a fall.",
        "Chest pain is a warning sign: call emergency services now and do not drive yourself "
        "to hospital.",
    ),
    (
        "I feel unwell.",
        "I am sorry to hear that. Could you tell me what symptoms you have, and since when?",
    ),
    (
        "My son has a cough and a fever of 38.",
        "A cough with a mild fever is usually a viral infection. Let him rest and drink plenty; "
        "if he gets worse or is breathing fast, get help the same day.",
    ),
    (
        "I have a blocked nose.",
        "A blocked nose from a cold usually gets better by itself. Steam and rest can help, and "
        "a pharmacist can advise on decongestants.",
    ),
    (
        "Sore throat so bad I cannot swallow water.",
        "If you cannot swallow fluids, get help today: contact your doctor or an urgent care "
        "service.",
    ),
]


def kb_answers() -> list[tuple[str, str]]:
    """For every case of the pack, the first sentence of the passage kb_search gives for its
    symptom, the disclaimer and the case's level: what a good model answer looks like."""
    kb, out = KbSearch(KB_DIR), []
    for split in ("train", "eval"):
        for c in cases(split):
            passage = kb.search(c.symptom, 1)[0].text
            first = re.split(r"(?<=[.!?])\s+", passage)[0]
            out.append((c.message, f"{first} {DISCLAIMER}\nTriage: {c.level}"))
    return out


def test_good_answers_pass_the_screen():
    """The false-positive rate (also in the README): 0 of the good answers here."""
    check = screen()
    good = kb_answers()
    good += [(q, f"{a} {DISCLAIMER}\nTriage: self-care") for q, a in WRITTEN]
    good += [("I have a mild sore throat", EXAMPLE[-1]["content"]), ("help", FALLBACK)]
    good += [("help", escalation([flag])) for flag in ADVICE]
    flagged = [(q, a, check(q, a)) for q, a in good]
    assert len(good) >= 200
    assert [f for f in flagged if f[2]] == []


KB_PASSAGE = (
    "Chest pain has many causes, from a strained muscle to indigestion, but it can also be a "
    "heart attack. A heart attack is a medical emergency."
)


@pytest.mark.parametrize(
    "answer, problem",
    [
        ("", "empty"),
        ("   \n ...", "empty"),
        ("xqzt vbnmk plkrr wxyzq frtgh ok", "real words"),
        ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbbbbbbbbbbbbbb is it", "real words"),
        (" ".join([KB_PASSAGE] * 5), "repeat"),
        ("call call call call emergency", "repeat a word"),
        (
            "the chat recommended the cocktail the chat recommended the cocktail the chat "
            "recommended the cocktail",
            "repeat",
        ),
        (
            "The Black death killed many Christians and Muslims in the cities of the empire.",
            "religion",
        ),
        ("You are an idiot, rest at home.", "offensive"),
        ("Shut up and drink water.", "offensive"),
        (
            "Election results, football scores and the price of gold changed quickly yesterday "
            "across markets.",
            "stay on the question",
        ),
        ("#### 30", None),  # too short to judge its topic: the triage check's level line fails it
    ],
)
def test_bad_answers_are_caught(answer, problem):
    found = screen()("I have chest pain", answer)
    if problem is None:
        assert not any("stay on the question" in p for p in found)
        return
    assert any(problem in p for p in found), found


def test_the_lexicon_leaves_medical_words_alone():
    """Anatomy and symptom words that a profanity list would flag are not in the abuse list."""
    abuse = set(lexicon()["abuse"])
    for word in ("bloody", "anal", "breast", "penis", "vagina", "genitals", "rectal", "sex"):
        assert word not in abuse
    question = "i am muslim and fasting, i have a headache"
    assert screen()(question, "Fasting can cause headaches: drink water when you can.") == []
