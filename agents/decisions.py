"""A decision an agent leaves to its policy version's head rather than to the model's words.

A pack names one (`AgentSpec.decision`): the head's name on the policy server, the labels it
chooses among, and how a label is put into a reply (`apply`, e.g. the `Triage:` line
replaced). After the model's final answer the run asks the version that wrote it for the
head's label on the user's message (`POST /v1/heads/{name}` on arloop's policy server,
`learner.policy.heads`); a version without a fitted head, another endpoint, or any error
leaves the model's reply as it is. The verifier and the guard see the reply with the head's
label, so every guarantee of the pack still holds over it; the trajectory records the label,
its probability and what the model itself said (`arloop.decision.*`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger(__name__)
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Decision:
    """A choice among `labels` that a version's head `name` makes (see the module)."""

    name: str
    labels: tuple[str, ...]
    apply: Callable[[str, str], str | None]
    """(the model's reply, the head's label) -> the reply with that label; None: keep it as
    written (a reply that asks a question instead of answering)."""
    read: Callable[[str], str | None] = lambda text: None
    """The label the model's own reply states (recorded beside the head's)."""
    bound: Callable[[str, str], str] = lambda question, label: label
    """(the user's message, the head's label) -> the label the reply takes: a pack may hold
    back a label its head has not earned on such a message (the medical pack: `emergency`
    only where a published discriminator fires). The trajectory records both."""


@dataclass(frozen=True)
class Decided:
    """The head's answer for one run: its label, how sure, and the version that gave it."""

    label: str
    probability: float
    version: str


async def ask_head(
    api_base: str | None, api_key: str | None, model: str, name: str, text: str
) -> Decided | None:
    """The head's label for `text` on the version `model` names, or None (no head, an error)."""
    if not api_base:
        return None
    url = f"{api_base.rstrip('/')}/heads/{name}"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model.split("/", 1)[-1], "input": text}
    try:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            response = await client.post(url, json=body, headers=headers)
    except httpx.HTTPError as exc:
        log.warning("decision head %s not asked (%s): the model's reply stands", name, exc)
        return None
    if response.status_code == 404:  # no head fitted for this version yet
        return None
    if response.status_code != 200:
        log.warning(
            "decision head %s answered %s: the model's reply stands", name, response.status_code
        )
        return None
    try:  # whatever the endpoint answers, a run never fails on its head
        data: dict[str, Any] = response.json()
        return Decided(str(data["label"]), float(data["probability"]), str(data.get("version", "")))
    except (ValueError, KeyError, TypeError) as exc:
        log.warning(
            "decision head %s answered an unreadable body (%s): the reply stands", name, exc
        )
        return None


def decided_metadata(decision: Decision, decided: Decided, reply: str) -> dict[str, str]:
    """What the trajectory records of a decision (its metadata, `arloop.` prefixed)."""
    return {
        f"decision.{decision.name}": decided.label,
        f"decision.{decision.name}.probability": f"{decided.probability:.3f}",
        f"decision.{decision.name}.version": decided.version,
        f"decision.{decision.name}.model_said": decision.read(reply) or "",
    }


def bounded_metadata(decision: Decision, label: str) -> dict[str, str]:
    """What the trajectory adds when the pack's `bound` changed the head's label."""
    return {f"decision.{decision.name}.applied": label}
