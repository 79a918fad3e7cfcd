"""Any agent into the loop: OpenAI's `POST /v1/chat/completions` and `GET /v1/models` on the
agent API, and `POST /v1/runs/{trajectory_id}/end`.

A team's own agent (the OpenAI SDK, LangGraph, any framework) points its base URL here with an
API key of ARLOOP_API_KEYS. `model: "arloop"` goes to the version its run's canary arm names
(champion, or candidate for a share of new runs, sticky per run); `arloop@v3` pins one. Calls
with the same `X-Arloop-Run` header are one trajectory, each call a model step, kept with the
token ids and logprobs the policy server gives (always asked for; sent on only to a client
that asked for `logprobs`). `X-Arloop-Agent` names the agent (else the API key's name), and
`X-Arloop-Node` the graph node that made the call (kept on its step, `agents.graph_nodes`); the end
user is the request's `user`, else `X-Arloop-User` (a key of identity `any`), else the key,
bound by the key's identity as on every route. Each answer, streamed or not, carries
`X-Arloop-Trajectory`, `X-Arloop-Feedback-Token` and `X-Arloop-Policy-Version` (a stream
before its first chunk); the token works with `POST /v1/feedback` as any run's.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from agents.errors import ArloopError
from agents.events import POLICY_VERSIONS, ModelStep, as_text
from agents.feedback_tokens import issue
from agents.openai_answers import chunk_body, completion_body
from agents.policy_client import PolicyClient, PolicyError, to_model_step
from agents.policy_stream import StreamedCompletion
from deploy.agent_api.chat_wire import MODEL, ChatCompletionRequest, ErrorBody, OpenAIError
from deploy.agent_api.deps import CREDENTIAL, USER_TOKEN_HEADER, Caller, CallerDep
from deploy.agent_api.external_runs import Call, ExternalRuns
from deploy.agent_api.schemas import ERROR_MEANINGS, errors
from deploy.agent_api.streaming import EventStream
from deploy.credentials import NAME, USER, Identity
from deploy.logs import bind

router = APIRouter()
RUN_HEADER, AGENT_HEADER, NODE_HEADER = "X-Arloop-Run", "X-Arloop-Agent", "X-Arloop-Node"
NODE = r"^[A-Za-z0-9_.:-]{1,64}$"
RUN_ID = r"^[A-Za-z0-9_.:-]{1,128}$"
_WHY = ERROR_MEANINGS | {
    400: "A field is invalid or not one the policy can honour (`param` names it).",
    403: "The run belongs to another API key or user.",
    404: "No such model (`arloop`, `arloop@<version>`).",
    409: "The run is closed (ended, idle or cancelled), or is another agent's.",
    429: "Over the calls a minute, or the key's completion tokens a minute "
    "(ARLOOP_CHAT_TOKENS_PER_MINUTE); `Retry-After` says when.",
}


def _openai_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody, "description": _WHY[code]} for code in codes}


@router.get("/v1/models", responses=_openai_errors(401, 503))
async def models(caller: CallerDep) -> dict[str, Any]:
    """`arloop` (routed: champion, or the run's canary arm) and each version, pinned."""
    versions = await caller.services.redis.zrange(POLICY_VERSIONS, 0, -1)
    names = [MODEL] + [f"{MODEL}@{as_text(v)}" for v in versions]
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": 0, "owned_by": "arloop"} for n in names],
    }


@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses={
        200: {
            "content": {"application/json": {}, "text/event-stream": {}},
            "description": "OpenAI's chat.completion, or its chunks as server-sent events.",
        },
        **_openai_errors(400, 401, 403, 404, 409, 413, 429, 500, 502, 503, 504),
    },
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, caller: CallerDep
) -> Response:
    """OpenAI's chat completions, recorded as a step of the caller's run (see the module)."""
    services = caller.services
    policy: PolicyClient = services.runtime.policy
    pinned = body.pinned
    if pinned is not None and not policy.config.names_versions:
        raise OpenAIError(
            400,
            f"this service's policy endpoint ({policy.config.model}) does not serve versions by "
            "name: ask for 'arloop'",
            param="model",
        )
    user = caller.user(_requested_user(body, request, caller)) or caller.user(caller.key.name)
    agent = _agent(request, caller)
    run_id = _header(request, RUN_HEADER, RUN_ID)
    node = _header(request, NODE_HEADER, NODE)
    await _admit(caller, body, user)
    runs: ExternalRuns = services.runs  # type: ignore[assignment]
    key = caller.key
    metadata = {CREDENTIAL: key.name}
    call, scrubbed = await asyncio.gather(  # the scrubber's thread beside Redis's round trips
        runs.begin(run_id, key.tenant, key.name, user or "", agent, metadata),
        runs.prompt_of(body.messages_sent()),
    )
    bind(trace=call.trajectory_id)
    body.send_messages(scrubbed)
    if body.stream:
        return await _streamed(caller, policy, body, call, pinned or call.arm, node)
    start = time.perf_counter()
    try:
        response = await policy.respond(body.upstream(), arm=pinned or call.arm)
    except BaseException as exc:
        await asyncio.shield(runs.record(call, None))  # the call failed: no step
        raise _upstream(exc) from None
    latency_ms = (time.perf_counter() - start) * 1000
    arm = pinned or call.arm
    hidden = getattr(response, "_hidden_params", None)
    steps = {
        _index(choice, at): policy.recorded(
            to_model_step(
                response,
                body.messages_sent(),
                body.tools_sent(),
                policy.model_for(arm),
                call.index,
                latency_ms,
                choice_at=at,
            ),
            hidden,
            arm,
        ).model_copy(update={"node": node})
        for at, choice in enumerate(response.choices)
    }
    step = steps.pop(min(steps))  # choice 0 continues the run; the others are its siblings
    await _record(runs, call, step, steps)
    payload = completion_body(response, body.model, bool(body.logprobs))
    return JSONResponse(payload, headers=_arloop_headers(caller, call, step.policy_version))


class RunEnd(BaseModel):
    """`POST /v1/runs/{trajectory_id}/end`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    output: str = Field(description="The run's final answer, as the user saw it.")


class RunEnded(BaseModel):
    trajectory_id: str
    status: str
    steps: int
    policy_version: str
    feedback_token: str


@router.post(
    "/v1/runs/{trajectory_id}/end",
    response_model=RunEnded,
    responses=errors(401, 403, 404, 409, 413, 422, 500, 503),
)
async def end_run(
    body: RunEnd,
    caller: CallerDep,
    trajectory_id: str = Path(pattern=r"^traj_[0-9a-f]{32}$"),
) -> RunEnded:
    """Record a run's final answer and close it; it is then written for the learner."""
    runs: ExternalRuns = caller.services.runs  # type: ignore[assignment]
    return await _end(caller, runs, trajectory_id, body.output)


@router.post(
    "/v1/runs/end",
    response_model=RunEnded,
    responses=errors(401, 403, 404, 409, 413, 422, 500, 503),
)
async def end_named_run(
    body: RunEnd,
    caller: CallerDep,
    run_id: Annotated[
        str,
        Header(
            alias=RUN_HEADER,
            pattern=RUN_ID,
            description="The run id its calls carried in X-Arloop-Run.",
        ),
    ],
) -> RunEnded:
    """The same for the run named by the `X-Arloop-Run` header its calls carried, for a
    service that keeps its own run id rather than the `X-Arloop-Trajectory` it was sent."""
    runs: ExternalRuns = caller.services.runs  # type: ignore[assignment]
    try:
        trajectory_id = await runs.trajectory_of(caller.key.tenant, run_id)
    except OpenAIError as exc:
        raise ArloopError(exc.status, exc.reason) from None
    return await _end(caller, runs, trajectory_id, body.output)


async def _end(caller: Caller, runs: ExternalRuns, trajectory_id: str, output: str) -> RunEnded:
    try:
        event = await runs.end(trajectory_id, caller.key.name, output)
    except OpenAIError as exc:  # this route answers as the agent API's own do
        raise ArloopError(exc.status, exc.reason) from None
    settings = caller.services.settings
    token = issue(
        settings.secret_key,
        event.trajectory_id,
        event.user_id,
        event.policy_version,
        settings.feedback_token_ttl_s,
        agent=event.agent,
    )
    return RunEnded(
        trajectory_id=event.trajectory_id,
        status=event.status.value,
        steps=len(event.model_steps),
        policy_version=event.policy_version,
        feedback_token=token,
    )


async def _streamed(
    caller: Caller,
    policy: PolicyClient,
    body: ChatCompletionRequest,
    call: Call,
    arm: str,
    node: str | None,
) -> Response:
    """The answer as server-sent chunks; the headers go out once the first chunk has come (it
    names the version), the step is recorded before `[DONE]`, and a client that leaves
    cancels the run (logged `cancelled`)."""
    runs: ExternalRuns = caller.services.runs  # type: ignore[assignment]
    start, outs = time.perf_counter(), _Choices()
    out = outs.first
    try:
        chunks = await policy.respond(body.upstream(), arm=arm)
        first = await anext(chunks, None)
    except BaseException as exc:
        await asyncio.shield(runs.record(call, None))
        raise _upstream(exc) from None
    logprobs, state = bool(body.logprobs), {"open": True}

    def step(of: StreamedCompletion = out) -> ModelStep:
        latency_ms = (time.perf_counter() - start) * 1000
        model = policy.model_for(arm)
        taken = of.step(body.messages_sent(), body.tools_sent(), model, call.index, latency_ms)
        if taken.prompt_token_ids is None:  # the prompt's ids come once, on the first chunk
            taken = taken.model_copy(update={"prompt_token_ids": out.prompt_token_ids})
        return policy.recorded(taken, of.hidden_params, arm).model_copy(update={"node": node})

    if first is not None:
        outs.take(first)
    version = step().policy_version

    async def events():
        try:
            if first is not None:
                yield _sse(chunk_body(first, body.model, logprobs))
            async for chunk in chunks:
                outs.take(chunk)
                yield _sse(chunk_body(chunk, body.model, logprobs))
        except PolicyError as exc:  # the stream has begun: say it there, as OpenAI does
            state["open"] = False
            await runs.record(call, None)
            failed = _upstream(exc)
            reason = failed.reason if isinstance(failed, ArloopError) else str(failed)
            error = {"message": reason, "type": "server_error", "code": exc.status}
            yield _sse({"error": error})
            return
        await asyncio.shield(_record(runs, call, step(), {i: step(o) for i, o in outs.others()}))
        state["open"] = False
        yield "data: [DONE]\n\n"

    def on_close() -> None:
        if state["open"]:  # the client left mid-stream
            state["open"] = False
            task = asyncio.create_task(runs.cancel(call, step() if out.text or out.calls else None))
            caller.services.background.add(task)
            task.add_done_callback(caller.services.background.discard)
            caller.services.metrics.streams.labels("cancelled").inc()

    headers = _arloop_headers(caller, call, version)
    return EventStream(events(), on_close=on_close, headers=headers)


class _Choices:
    """The chunks of a stream, by choice: choice 0 continues the run, the others (`n` > 1)
    are written as its siblings."""

    def __init__(self) -> None:
        self.first = StreamedCompletion()
        self._by_index: dict[int, StreamedCompletion] = {0: self.first}

    def take(self, chunk: Any) -> None:
        choices = getattr(chunk, "choices", None) or []
        at = _index(choices[0], 0) if choices else 0
        self._by_index.setdefault(at, StreamedCompletion()).add(chunk)

    def others(self) -> list[tuple[int, StreamedCompletion]]:
        return sorted((i, o) for i, o in self._by_index.items() if i != 0)


async def _record(
    runs: ExternalRuns, call: Call, step: ModelStep, siblings: dict[int, ModelStep]
) -> None:
    """The run's step, then (if the run took it) the call's other choices beside it."""
    if await runs.record(call, step) and siblings:
        await runs.siblings(call, siblings)


def _index(choice: Any, at: int) -> int:
    index = getattr(choice, "index", None)
    return at if index is None else int(index)


async def _admit(caller: Caller, body: ChatCompletionRequest, user: str | None) -> None:
    """429 over the calls a minute (the user's, and the key's for all its users), or over
    the key's completion tokens a minute."""
    services, key = caller.services, caller.key
    settings = services.settings
    await services.limiter.hit(
        "calls",
        user or key.name,
        settings.run_rate_per_minute,
        credential=(key.name, caller.rate_per_minute(settings.key_rate_per_minute)),
    )
    await services.limiter.spend(
        "chat-tokens",
        key.name,
        body.completion_tokens(settings.policy_max_tokens),
        settings.chat_tokens_per_minute,
        "completion tokens (n x max_tokens) a minute, ARLOOP_CHAT_TOKENS_PER_MINUTE",
    )


def _requested_user(body: ChatCompletionRequest, request: Request, caller: Caller) -> str | None:
    """The end user the request names: `user`, else `X-Arloop-User` (which a `signed` key's
    caller sends as its token, not a name)."""
    user = body.user
    if user is None and caller.key.identity is Identity.ANY:
        user = request.headers.get(USER_TOKEN_HEADER)
    if user is not None and not re.fullmatch(USER, user):
        raise OpenAIError(400, f"user {user[:40]!r} is not a valid user id ({USER})", param="user")
    return user


def _agent(request: Request, caller: Caller) -> str:
    name = _header(request, AGENT_HEADER, NAME) or caller.key.name
    if name in caller.services.runtime.agents:
        raise OpenAIError(
            400,
            f"{AGENT_HEADER} {name!r} is an agent this service runs itself: name yours apart",
            param=AGENT_HEADER,
        )
    return name


def _header(request: Request, name: str, pattern: str) -> str | None:
    value = request.headers.get(name)
    if value is not None and not re.fullmatch(pattern, value):
        raise OpenAIError(400, f"{name} must match {pattern}", param=name)
    return value


def _arloop_headers(caller: Caller, call: Call, version: str) -> dict[str, str]:
    settings = caller.services.settings
    token = issue(
        settings.secret_key,
        call.trajectory_id,
        call.user_id,
        version,
        settings.feedback_token_ttl_s,
        agent=call.agent,
    )
    return {
        "X-Arloop-Trajectory": call.trajectory_id,
        "X-Arloop-Feedback-Token": token,
        "X-Arloop-Policy-Version": version,
    }


def _upstream(exc: BaseException) -> BaseException:
    """The policy's refusal of a request (400, 404: a field it cannot honour, a version it
    does not have) passed on with its status; a failure of the endpoint stays a 502/504."""
    if not isinstance(exc, PolicyError):
        return exc
    cause = exc.__cause__
    status = getattr(cause, "status_code", None)
    if status in (400, 403, 404, 422):
        body = getattr(cause, "body", None)  # the OpenAI SDK's: the server's `error` object
        said = body.get("message") if isinstance(body, dict) else None
        message = (said or str(cause).split(" - ", 1)[-1])[:500]  # litellm's: "... - <text>"
        return OpenAIError(400 if status == 422 else status, f"the policy refused: {message}")
    return exc


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
