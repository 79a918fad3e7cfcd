"""`POST /v1/agents/{agent}/runs/stream`: one run as Server-Sent Events, LangGraph-style.

Events, in order (each `event: <name>` with a JSON `data:` line):

- `metadata` `{"run_id", "thread_id", "agent"}`: once the thread is held (run_id is the
  trajectory id);
- `messages/partial` `[{"type": "ai", "id", "content", "node"}]` (not for an agent with a
  guard, whose answer the guard may replace): the answer so far, after each
  token (as LangGraph Platform's messages stream mode sends it: the whole text, not a delta);
- `messages/complete` `[message]`: a model call finished (`type` ai, with `tool_calls` and
  `policy_version`), or a tool call finished (`type` tool, `name`, `tool_call_id`, `status`
  success|error);
- `end` `{trajectory_id, thread_id, output, policy_version, feedback_token, status, tools,
  disclaimer, escalation}`: the body `POST /runs` answers; the stream ends;
- `error` `{"error", "message", "status"}` instead of `end` when the run fails (a model fault
  is a 502/504 here too); the stream ends.

Errors found before the run starts (unknown agent, input too long, rate limit, another user's
or a busy thread) are plain HTTP errors, not a stream. When the client disconnects the run is
cancelled: its thread stays as it was and the partial run is logged with status `cancelled`
(never trained on).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import anyio
from fastapi import APIRouter
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agents.errors import ArloopError
from agents.events import ModelStep, ToolStep, new_id
from agents.run_context import RunUpdate
from deploy.agent_api.deps import CallerDep, ServicesDep
from deploy.agent_api.runs import acting, admit, answer
from deploy.agent_api.schemas import RunRequest, errors
from deploy.agent_api.services import Services
from deploy.logs import bind

log = logging.getLogger(__name__)
router = APIRouter()
_DONE = object()
STREAM_DOC = (__doc__ or "").split("\n\n", 1)[1]


@router.post(
    "/v1/agents/{agent}/runs/stream",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "The run's events."},
        **errors(400, 401, 403, 404, 409, 413, 422, 429, 500, 503),
    },
    description=STREAM_DOC,
)
async def run_stream(agent: str, body: RunRequest, services: ServicesDep, caller: CallerDep):
    """Run an agent and stream its answer as Server-Sent Events."""
    body = acting(body, caller)
    await admit(services, agent, body, caller)
    run = RunStream(services, agent, body)
    await run.start()
    return EventStream(run.events(), on_close=run.cancel)


class RunStream:
    """One streamed run: the run task, the queue its updates arrive on, the SSE it becomes."""

    def __init__(self, services: Services, agent: str, body: RunRequest) -> None:
        self.services, self.agent, self.body = services, agent, body
        self.trajectory_id = new_id("traj")
        self.thread_id = body.thread_id or new_id("th")
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.text: dict[int, str] = {}
        self.task: asyncio.Task | None = None
        bind(trace=self.trajectory_id)

    async def start(self) -> None:
        """Start the run; returns once its thread is held, raises what stopped it before."""
        runtime = self.services.runtime
        self.task = asyncio.create_task(
            runtime.run(
                self.agent,
                self.body.input,
                self.body.user_id,
                self.thread_id,
                self.body.metadata,
                trajectory_id=self.trajectory_id,
                emit=self.queue.put_nowait,
            )
        )
        self.services.background.add(self.task)  # held until done: a left client's run ends
        self.task.add_done_callback(self._finished)
        try:
            first = await self.queue.get()  # RunUpdate("start"), or _DONE if it failed first
        except asyncio.CancelledError:  # the client left before the thread was held
            self.task.cancel()
            raise
        if first is _DONE:
            self.task.result()  # raises what stopped the run (403/409 thread, 502 ...)

    def cancel(self) -> None:
        """The client left: cancel the run, which logs its partial trajectory itself."""
        if self.task is not None and not self.task.done() and not self.task.cancelling():
            self.task.cancel()
            self.services.metrics.streams.labels("cancelled").inc()

    def _finished(self, task: asyncio.Task) -> None:
        self.services.background.discard(task)
        self.queue.put_nowait(_DONE)

    async def events(self):
        """The SSE body; a client that leaves cancels the run (see the module docstring)."""
        assert self.task is not None
        try:
            yield sse(
                "metadata",
                {"run_id": self.trajectory_id, "thread_id": self.thread_id, "agent": self.agent},
            )
            while (update := await self.queue.get()) is not _DONE:
                yield self._message(update)
            yield self._last()
        finally:
            self.cancel()

    def _message(self, u: RunUpdate) -> str:
        if u.kind == "delta":
            self.text[u.index] = self.text.get(u.index, "") + u.text
            message = {"type": "ai", "id": self._id(u.index), "content": self.text[u.index]}
            return sse("messages/partial", [message | {"node": u.node}])
        return sse("messages/complete", [self._complete(u)])

    def _complete(self, u: RunUpdate) -> dict[str, Any]:
        step = u.step
        if isinstance(step, ToolStep):
            return {
                "type": "tool",
                "id": self._id(u.index),
                "name": step.name,
                "tool_call_id": step.call_id,
                "content": step.output,
                "status": "error" if step.error else "success",
                "error": step.error,
                "node": u.node,
            }
        assert isinstance(step, ModelStep)
        calls = [{"id": c.id, "name": c.name, "args": c.arguments} for c in step.tool_calls]
        return {
            "type": "ai",
            "id": self._id(u.index),
            "content": step.output or "",
            "tool_calls": calls,
            "policy_version": step.policy_version,
            "node": u.node,
        }

    def _id(self, index: int) -> str:
        return f"{self.trajectory_id}:{index}"

    def _last(self) -> str:
        """`end` with the run's answer, or `error` with what went wrong."""
        assert self.task is not None
        try:
            event = self.task.result()
        except ArloopError as exc:
            self.services.metrics.streams.labels("error").inc()
            self.services.metrics.errors.labels(str(exc.status)).inc()
            body = {"error": type(exc).__name__, "message": exc.reason, "status": exc.status}
            return sse("error", body)
        except Exception as exc:  # noqa: BLE001 - the stream has begun: say it there
            log.exception("streamed run failed")
            self.services.metrics.streams.labels("error").inc()
            body = {"error": type(exc).__name__, "message": "internal error", "status": 500}
            return sse("error", body)
        self.services.metrics.streams.labels("completed").inc()
        return sse("end", answer(self.services, self.agent, event).model_dump())


def sse(event: str, data: Any) -> str:
    """One Server-Sent Event: its name and one line of JSON."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class EventStream(StreamingResponse):
    """A `text/event-stream` response that notices a client leaving while nothing is sent.

    Starlette only watches for the disconnect on ASGI servers older than spec 2.4; here it is
    watched always, so a run waiting on a slow model is cancelled as soon as its client leaves.
    """

    media_type = "text/event-stream"

    def __init__(
        self, content, on_close: Callable[[], None], headers: dict[str, str] | None = None
    ) -> None:
        sse_headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, headers=sse_headers | (headers or {}))
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client is gone mid-write
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            self.on_close()  # a no-op once the run has ended
