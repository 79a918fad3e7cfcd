"""Our product FAQ as an arloop agent: ARLOOP_PACKS='["faq_pack:pack"]'."""

import os
from pathlib import Path

from agents.packs import Pack, Split, Task
from agents.runtime import AgentSpec
from tools.kb_search import KbSearch

# Our own folder of .md/.txt pages (a `source:` line under the title names a page's origin).
FAQ_DIR = Path(os.environ.get("FAQ_DIR", Path(__file__).parent / "faq"))

SYSTEM = (
    "You answer customers' questions about our product. Search the FAQ with kb_search, "
    "answer in at most three sentences from what it returns, and end with 'Source: <source>'. "
    "If the FAQ does not say, answer that you do not know and point to support@example.com."
)

# Held-out questions, each with the page that answers it: the release gate's eval suite.
EVAL = [
    ("How do I reset my password?", "account.md"),
    ("Can I get my data out as a CSV file?", "export.md"),
    ("Which plans include single sign-on?", "billing.md"),
]


def faq_agent() -> AgentSpec:
    return AgentSpec(
        name="faq",
        description="Answers product questions from our FAQ pages, citing the page.",
        system_prompt=SYSTEM,
        kind="react",
        tools=(KbSearch(FAQ_DIR, max_passages=3),),
        task_kind="faq",
        max_steps=3,
    )


def tasks(split: Split) -> list[Task]:
    if split == "train":
        return []  # we learn from our users' feedback, not from simulated ones
    return [Task(f"faq-{n}", "faq", q, page) for n, (q, page) in enumerate(EVAL)]


def verify(task: Task, answer: str) -> float:
    """1 when the answer cites the page that answers the question."""
    return 1.0 if task.reference in answer else 0.0


def pack() -> Pack:
    return Pack("faq", agents=(faq_agent(),), tasks=tasks, verify=verify)
