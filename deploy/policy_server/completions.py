"""`POST /v1/chat/completions`: lease a version, prepare the request off the event loop, run its
rows in the engine, and answer in one body or as server-sent events."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from deploy.credentials import PolicyKey
from deploy.logs import bind
from deploy.policy_server.access import Caller, TokenBudget, may_sample_rejected, rejected_refusal
from deploy.policy_server.admission import Admission, Ticket
from deploy.policy_server.metrics import PolicyMetrics
from deploy.policy_server.openai_wire import (
    ChatRequest,
    OpenAIError,
    completion_body,
    error_body,
    tool_format_of,
)
from deploy.policy_server.prepare import Prepared, prepare, target_of
from deploy.policy_server.settings import PolicyServerSettings
from deploy.policy_server.stream import ChoiceStream, ChunkWriter, sse
from deploy.policy_server.versions import ALIASES, LoadedPolicy, VersionManager, VersionUnavailable
from learner.policy.generation.engine import FinishEvent, GenerationEngine, Row
from learner.policy.registry import UnknownVersion, VersionStatus

log = logging.getLogger(__name__)
T = TypeVar("T")
CLIENT_GONE = 499  # nginx's "client closed request": the request metric's code (nobody reads it)
_EXPIRED = object()  # put on a run's queue when shutdown's grace runs out


@dataclass
class ServerState:
    settings: PolicyServerSettings
    versions: VersionManager
    engine: GenerationEngine
    metrics: PolicyMetrics
    engine_label: str  # `llamacpp-f16` or `transformers-fp32`: which numerics gave the logprobs
    budget: TokenBudget
    admission: Admission


async def chat_completions(req: ChatRequest, request: Request, key: Caller):
    """OpenAI's chat completions; `stream: true` answers with server-sent events."""
    st: ServerState = request.app.state.policy
    request_id = f"chatcmpl-{secrets.token_hex(12)}"
    bind(trace=request_id)
    log.debug("key %s, user %s", key.name if key else None, req.user)
    policy = await lease(st, target_of(req.model, st.settings.served_name), key)
    bind(version=policy.version)
    watch = ClientWatch(request)
    try:
        ready, ticket = await _admit(st, req, policy, key, watch)
    except ClientGone:
        st.versions.unpin(policy)
        return Response(status_code=CLIENT_GONE)
    except BaseException:
        st.versions.unpin(policy)
        watch.stop()
        raise
    prompt_ids = ready.prompt_ids
    st.metrics.prompt_tokens.inc(len(prompt_ids))
    run = _Run(st, policy, ready, ticket, stream=req.stream)
    if req.stream:
        watch.stop()  # from here the streaming response listens for the disconnect
        # close() runs when the stream ends, and again (a no-op) after the response: a client
        # that leaves before the first chunk never starts the generator, so never runs its finally.
        events = _stream(req, run, request_id)
        return StreamingResponse(
            events, media_type="text/event-stream", background=BackgroundTask(run.close)
        )
    try:
        finishes = await watch.unless_gone(run.finishes())
    except ClientGone:
        return Response(status_code=CLIENT_GONE)
    finally:
        run.close()
        watch.stop()
    failed = [f for f in finishes if f.finish_reason == "error"]
    if failed:
        raise OpenAIError(500, f"generation failed: {failed[0].error}", code="generation_error")
    return completion_body(
        req,
        request_id=request_id,
        version=policy.version,
        tokenizer=policy.tokenizer,
        prompt_ids=prompt_ids,
        finishes=finishes,
        tool_format=tool_format_of(st.settings),
        engine=st.engine_label,
    )


async def _admit(
    st: ServerState,
    req: ChatRequest,
    policy: LoadedPolicy,
    key: PolicyKey | None,
    watch: ClientWatch,
) -> tuple[Prepared, Ticket]:
    """The request prepared, its key's tokens reserved (429 over), and its place in the engine
    (503 when the queue is full, the wait too long, or the server shuts down)."""
    # off the event loop: a long prompt's tokens or a grammar cost CPU time
    ready = await asyncio.to_thread(prepare, req, policy.tokenizer, policy.context, st.settings)
    asked = sum(p.max_tokens for p in ready.params)
    reserved = st.budget.take(key, asked)
    try:
        cost = asked + len(ready.prompt_ids)
        ticket = await watch.unless_gone(st.admission.enter(len(ready.params), cost))
    except BaseException:
        st.budget.give_back(key, reserved)  # refused or left before anything was generated
        raise
    return ready, ticket


class _Run:
    """One request's rows in the engine, the queue their events come back on, its place in
    admission and its lease."""

    def __init__(
        self, st: ServerState, policy: LoadedPolicy, ready: Prepared, ticket: Ticket, stream: bool
    ):
        loop = asyncio.get_running_loop()
        self.st, self.policy, self.ticket, self.finished = st, policy, ticket, []
        self.queue: asyncio.Queue = asyncio.Queue()
        self._closed = False
        ticket.on_expire = lambda: self.queue.put_nowait(_EXPIRED)

        def emit(event) -> None:
            try:
                loop.call_soon_threadsafe(self._arrive, event)
            except RuntimeError:  # the loop is gone (shutdown): nobody is listening
                pass

        make = ready.make_constraint
        self.rows = [
            Row(
                policy,
                ready.prompt_ids,
                p,
                emit,
                index=i,
                stream=stream,
                constraint=make() if make else None,
            )
            for i, p in enumerate(ready.params)
        ]
        st.engine.submit(self.rows)

    def _arrive(self, event: Any) -> None:
        """On the loop: queue an engine event; a finished row frees its slot at once."""
        self.queue.put_nowait(event)
        if isinstance(event, FinishEvent):
            self.st.admission.row_done(self.ticket)

    async def events(self) -> AsyncIterator[Any]:
        pending = len(self.rows)
        while pending:
            event = await self.queue.get()
            if event is _EXPIRED:
                raise self.st.admission.shutdown_error()
            if isinstance(event, FinishEvent):
                pending -= 1
                self.finished.append(event)
            yield event

    async def finishes(self) -> list[FinishEvent]:
        return [e async for e in self.events() if isinstance(e, FinishEvent)]

    def close(self) -> None:
        """Stop rows nobody waits for (the engine drops them at its next step), count tokens,
        free the request's place and end the lease; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        cut = [row for row in self.rows if row.finish_reason is None]
        for row in cut:
            row.cancelled = True
        if cut:
            why = "shutdown" if self.st.admission.closing else "client_gone"
            self.st.metrics.cancelled.labels(reason=why).inc()
        generated = sum(len(f.token_ids) for f in self.finished)
        self.st.metrics.generated_tokens.labels(version=self.policy.version).inc(generated)
        self.st.admission.leave(self.ticket)
        self.st.versions.unpin(self.policy)


async def _stream(req: ChatRequest, run: _Run, rid: str):
    writer = ChunkWriter(req, rid, run.policy.version)
    fmt = tool_format_of(run.st.settings)
    choices = [ChoiceStream(req, i, run.policy.tokenizer, fmt) for i in range(len(run.rows))]
    extra = {"engine": run.st.engine_label}
    if req.return_token_ids:
        extra["prompt_token_ids"] = run.rows[0].prompt_ids
    try:
        yield writer.chunk([c.first() for c in choices], **extra)
        try:
            async for ev in run.events():
                if not isinstance(ev, FinishEvent):
                    for delta in choices[ev.index].on_token(ev):
                        yield writer.chunk([delta])
                    continue
                if ev.finish_reason == "error":
                    yield sse(error_body(OpenAIError(500, f"generation failed: {ev.error}")))
                    break
                for delta in choices[ev.index].on_finish(ev):
                    yield writer.chunk([delta])
        except OpenAIError as exc:  # shutdown's grace ran out: say so, end the stream
            yield sse(error_body(exc))
            return
        if req.stream_options and req.stream_options.include_usage:
            completion = sum(len(f.token_ids) for f in run.finished)
            usage = {
                "prompt_tokens": len(run.rows[0].prompt_ids),
                "completion_tokens": completion,
                "total_tokens": len(run.rows[0].prompt_ids) + completion,
            }
            yield writer.chunk([], usage=usage)
        yield sse("[DONE]")
    finally:
        run.close()  # also when the client left early: stop generating for it


class ClientGone(Exception):
    """The client closed its connection before its answer."""


class ClientWatch:
    """Waits beside the handler for the request's `http.disconnect` (its body is read: the next
    message the server gives is that one), so that a wait ends when the client leaves."""

    def __init__(self, request: Request) -> None:
        self._task = asyncio.ensure_future(self._disconnect(request.receive))

    @staticmethod
    async def _disconnect(receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def unless_gone(self, awaitable: Awaitable[T]) -> T:
        """What `awaitable` gives, or ClientGone (it is cancelled) when the client leaves first."""
        work = asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait({work, self._task}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            raise
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        raise ClientGone

    def stop(self) -> None:
        self._task.cancel()


async def lease(st: ServerState, target: str, key: PolicyKey | None) -> LoadedPolicy:
    """A lease on the version `target` names; 404 when there is none, 403 for a rejected one
    (unless the eval gate asks)."""
    if target not in ALIASES and not may_sample_rejected(key):
        status = await asyncio.to_thread(_status_of, st, target)
        if status is VersionStatus.REJECTED:
            raise rejected_refusal(target)
    policy = st.versions.pin_loaded(target)
    if policy is not None:
        return policy
    try:
        return await asyncio.to_thread(st.versions.pin, target)
    except UnknownVersion:
        raise OpenAIError(
            404,
            f"version {target!r} does not exist in the policy registry",
            param="model",
            code="model_not_found",
        ) from None
    except VersionUnavailable as exc:
        raise OpenAIError(404, str(exc), param="model", code="model_not_found") from None


def _status_of(st: ServerState, version: str) -> VersionStatus | None:
    try:
        return st.versions.registry.get(version).status
    except UnknownVersion:
        return None  # acquire says it does not exist
