"""The annotation queue: runs picked by rule for reviewers, and their verdicts as feedback.

A run joins the queue when (the reasons, in the queue's words):
- `fallback`: a pack's safe fallback answered it (`answered_by` fallback);
- `disagreement`: the verifier and the users judged it apart (the Reflexion verifier's
  `arloop.verdict`, or a `verifier` feedback, against the sign of the users' thumbs and
  ratings);
- `sample`: it falls in the sample of each version's answers (a hash of its id under `sample`,
  so a run is in or out for everyone, each version at the same share).
A cancelled run is never queued; a reviewed run (a `review` feedback on it) leaves the queue.
Only keys with the `review` scope read the queue and send verdicts; a verdict is a `review`
feedback event written by the feedback intake (`FeedbackIntake.accept_review`), which the
learner turns into a label like a correction (`learner.labels`).
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse

from agents.errors import ArloopError
from agents.events import AnswerPath, FeedbackEvent, FeedbackKind, RunStatus, TrajectoryEvent
from agents.feedback_intake import Review
from deploy.agent_api.deps import CallerDep
from deploy.agent_api.history import AgentName, Cursor
from deploy.agent_api.run_log import find_run, scan, summary
from deploy.agent_api.schemas import FeedbackAccepted, ReviewRequest, errors

router = APIRouter()
REASONS = ("fallback", "disagreement", "sample")
JUDGEMENTS = (FeedbackKind.THUMBS, FeedbackKind.RATING)
TrajectoryId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.-]{1,128}$")]


def reasons(run: TrajectoryEvent, feedback: list[FeedbackEvent], share: float) -> list[str]:
    """Why `run` is queued (empty: it is not), in `REASONS`' order."""
    if run.status is RunStatus.CANCELLED or any(f.kind is FeedbackKind.REVIEW for f in feedback):
        return []
    found = {
        "fallback": run.answered_by is AnswerPath.FALLBACK,
        "disagreement": disagrees(run, feedback),
        "sample": sampled(run.trajectory_id, share),
    }
    return [r for r in REASONS if found[r]]


def disagrees(run: TrajectoryEvent, feedback: list[FeedbackEvent]) -> bool:
    """Whether the verifier passed what the users disliked, or failed what they liked."""
    checks = [f.reward or 0.0 for f in feedback if f.kind is FeedbackKind.VERIFIER]
    verdict = {"pass": 1.0, "fail": -1.0}.get(run.metadata.get("arloop.verdict", ""), 0.0)
    machine = checks[-1] if checks else verdict
    users = sum(f.reward or 0.0 for f in feedback if f.kind in JUDGEMENTS and f.source == "user")
    return machine * users < 0


def sampled(trajectory_id: str, share: float) -> bool:
    """Whether a run is in the sample: the same answer for every reviewer and every call."""
    digest = hashlib.sha256(trajectory_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


@router.get("/v1/review/queue", responses=errors(401, 403, 404, 422, 503))
async def queue(
    caller: CallerDep,
    agent: AgentName = None,
    reason: Annotated[
        str | None, Query(max_length=32, json_schema_extra={"enum": list(REASONS)})
    ] = None,
    sample: Annotated[float, Query(ge=0.0, le=1.0)] = 0.1,
    cursor: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """Runs of the reviewer's tenant waiting for a review, newest first, each with its reasons
    (`fallback`, `disagreement`, `sample`: `sample` is the share of each version's answers
    drawn); a reviewer's key only (403 otherwise). Reads at most 1,000 runs a call: follow
    `next_cursor`."""
    caller.as_reviewer()
    services = caller.services
    if agent is not None:
        services.runtime.spec(agent)
    if reason is not None and reason not in REASONS:
        raise ArloopError(422, f"reason={reason[:40]!r} is not one of {', '.join(REASONS)}")
    s = scan(services.redis, caller.reads, cursor=cursor, shards=services.settings.shards)
    items = []
    async for entry_id, run, feedback in s.runs():
        why = reasons(run, feedback, sample) if agent in (None, run.agent) else []
        if why and (reason is None or reason in why):
            items.append(summary(entry_id, run, feedback) | {"reasons": why})
            if len(items) == limit:
                break
    return {
        "items": items,
        "next_cursor": None if s.done else s.last,
        "partial_feedback": s.feedback.partial,
    }


@router.post(
    "/v1/review/{trajectory_id}",
    status_code=202,
    response_model=FeedbackAccepted,
    responses=errors(400, 401, 403, 404, 409, 422, 429, 500, 503),
)
async def submit_review(
    trajectory_id: TrajectoryId, body: ReviewRequest, caller: CallerDep
) -> JSONResponse:
    """Record a reviewer's verdict on a run of its tenant: a `review` feedback event (source
    `review`), which the learner reads as a label (the answer `text` states) and a result (the
    `score`); the run leaves the queue. One review per run (409 for a second)."""
    reviewer = caller.as_reviewer()
    services = caller.services
    shards = services.settings.shards
    _, run = await find_run(services.redis, caller.reads, trajectory_id, body.cursor, shards)
    review = Review(
        trajectory_id=run.trajectory_id,
        policy_version=run.policy_version,
        agent=run.agent,
        reviewer=reviewer,
        score=body.score,
        text=body.text,
        credential=caller.key.name,
        credential_rate_per_minute=caller.rate_per_minute(services.settings.key_rate_per_minute),
    )
    counted = services.metrics.feedback_counted
    try:
        event_id = await services.intake.accept_review(review)
    except ArloopError as exc:
        counted(FeedbackKind.REVIEW.value, str(exc.status)).inc()
        raise
    counted(FeedbackKind.REVIEW.value, "accepted").inc()
    return JSONResponse({"event_id": event_id}, status_code=202)
