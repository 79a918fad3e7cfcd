"""One agent run as the API answers it, plain or streamed: the checks before it, the answer after.

Both `POST /v1/agents/{agent}/runs` and its `/stream` twin call `admit` first (the agent
exists, the input fits, the user is under the rate limit) and `answer` last (metrics, one log
line, the signed feedback token, the response body).
"""

from __future__ import annotations

import logging

from agents.errors import ArloopError
from agents.events import TrajectoryEvent
from agents.feedback_tokens import issue
from deploy.agent_api.deps import CREDENTIAL, Caller
from deploy.agent_api.schemas import RunRequest, RunResponse
from deploy.agent_api.services import Services
from deploy.logs import bind

log = logging.getLogger("deploy.agent_api.app")


def acting(body: RunRequest, caller: Caller) -> RunRequest:
    """The request as the caller's credential allows it: the user it acts as (tenant-scoped,
    403 for someone else than a bound key's user) and the credential in the metadata."""
    user = caller.user(body.user_id)
    metadata = body.metadata | {CREDENTIAL: caller.key.name}
    return body.model_copy(update={"user_id": user, "metadata": metadata})


async def admit(services: Services, agent: str, body: RunRequest, caller: Caller) -> None:
    """404 for an unknown agent, 413 for an input over the limit, 429 over the rate (the
    user's, and the credential's for all its users together)."""
    settings = services.settings
    services.runtime.spec(agent)
    if len(body.input) > settings.max_input_chars:
        raise ArloopError(
            413,
            f"input has {len(body.input)} characters; the limit is "
            f"{settings.max_input_chars} (ARLOOP_MAX_INPUT_CHARS)",
        )
    await services.limiter.hit(
        "runs",
        body.user_id,
        settings.run_rate_per_minute,
        credential=(caller.key.name, caller.rate_per_minute(settings.key_rate_per_minute)),
    )


def answer(services: Services, agent: str, event: TrajectoryEvent) -> RunResponse:
    """The response to a finished run, with its feedback token; counted and logged."""
    settings = services.settings
    bind(version=event.policy_version)
    services.metrics.observe_run(event)
    log.info(  # ids and counts only: input and output are user text
        "run of %s on thread %s: %s (answered by %s), %d model and %d tool calls, %.0f ms",
        agent,
        event.thread_id,
        event.status.value,
        event.answered_by.value,
        len(event.model_steps),
        len(event.tool_steps),
        (event.finished_at - event.started_at) * 1000,
    )
    token = issue(
        settings.secret_key,
        event.trajectory_id,
        event.user_id,
        event.policy_version,
        settings.feedback_token_ttl_s,
        agent=event.agent,
    )
    spec = services.runtime.spec(agent)
    escalation = spec.escalate(event.input, event.output) if spec.escalate else None
    return RunResponse(
        trajectory_id=event.trajectory_id,
        thread_id=event.thread_id,
        output=event.output,
        policy_version=event.policy_version,
        feedback_token=token,
        status=event.status.value,
        answered_by=event.answered_by.value,
        tools=[s.name for s in event.tool_steps if s.name in services.runtime.agents[agent].tools],
        disclaimer=spec.disclaimer,
        escalation=escalation,
    )
