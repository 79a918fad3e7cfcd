"""The gate's endpoint for a team's own agent (`Pack.run`): an OpenAI-compatible
`/v1/chat/completions` on a free local port, inside the learner's process, that passes each
call of an eval run to the policy server under the version being judged and records it.

The gate hands `run(task, base_url, model, headers)` this endpoint's URL, `model="arloop@v3"`
and an `X-Arloop-Run` header naming the eval run; each call with that header is sent to the
policy server pinned to the run's version, at the run's temperature and seed (the gate's, not
the request's: champion and candidate are sampled alike), under the endpoint's token cap, and
kept as a `ModelStep` with its token ids and logprobs. The steps become the run's
`TrajectoryEvent` on `arloop:eval:trajectories` (never trained on), which the gate scores and
measures as any eval run. A call for another model, without a known run, or streamed is a 400
that says so: the team's `run` then fails, and the gate fails closed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agents.events import ModelStep, new_id
from agents.openai_answers import completion_body
from agents.policy_client import PolicyClient, PolicyConfig, PolicyError, to_model_step
from deploy.embedded_redis import free_port

RUN_HEADER = "X-Arloop-Run"
MODEL = "arloop"
PASSED = ("messages", "tools", "tool_choice", "stop", "response_format", "parallel_tool_calls")
"""What a team's request says that reaches the policy server; sampling is the gate's."""


@dataclass
class Recording:
    """One eval run's calls: the version, temperature and seed they run under, their steps."""

    version: str
    temperature: float
    seed: int | None
    steps: list[ModelStep] = field(default_factory=list)
    failure: str | None = None
    """Why the policy server failed a call (the gate's EvalError: the server, not the agent)."""


class EvalEndpoint:
    """The endpoint (see the module); started on first use, in a thread of its own."""

    def __init__(self, policy: PolicyConfig) -> None:
        self.policy = policy
        self.runs: dict[str, Recording] = {}
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """The OpenAI base URL a team's `run` is given (the server starts here)."""
        with self._lock:
            if self._server is None:
                self._start()
        return f"http://127.0.0.1:{self.port}/v1"

    def open(self, version: str, temperature: float, seed: int | None) -> tuple[str, Recording]:
        """A new eval run: (its `X-Arloop-Run` id, where its calls are recorded)."""
        run_id, recording = new_id("evalrun"), Recording(version, temperature, seed)
        self.runs[run_id] = recording
        return run_id, recording

    def close(self, run_id: str) -> Recording:
        """The run's record; calls with its id are refused from now on."""
        return self.runs.pop(run_id)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True

    def _start(self) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            self.app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        threading.Thread(target=self._server.run, name="eval-endpoint", daemon=True).start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gate's eval endpoint did not start on port {self.port}")
            time.sleep(0.01)

    def app(self) -> FastAPI:
        app = FastAPI(title="arloop eval endpoint", openapi_url=None)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            return await self._chat(request)

        return app

    async def _chat(self, request: Request) -> JSONResponse:
        recording = self.runs.get(request.headers.get(RUN_HEADER, ""))
        if recording is None:
            return _error(400, f"no eval run named in {RUN_HEADER}: send the headers run() got")
        body = await request.json()
        wanted = f"{MODEL}@{recording.version}"
        if body.get("model") != wanted:
            return _error(400, f"model {body.get('model')!r}: this run judges {wanted!r}")
        if body.get("stream"):
            return _error(400, "the gate's eval runs are not streamed: call without stream")
        sent = {k: body[k] for k in PASSED if body.get(k) is not None}
        config = replace(self.policy, temperature=recording.temperature, seed=recording.seed)
        policy = PolicyClient(config)
        start = time.perf_counter()
        try:
            response = await policy.respond(sent, arm=recording.version)
        except PolicyError as exc:
            recording.failure = exc.reason
            return _error(502, exc.reason)
        latency_ms = (time.perf_counter() - start) * 1000
        step = to_model_step(
            response,
            sent["messages"],
            sent.get("tools", []),
            policy.model_for(recording.version),
            len(recording.steps),
            latency_ms,
        )
        hidden = getattr(response, "_hidden_params", None)
        recording.steps.append(policy.recorded(step, hidden, recording.version))
        return JSONResponse(completion_body(response, wanted, logprobs=False))


def _error(status: int, message: str) -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "code": status}
    return JSONResponse({"error": error}, status_code=status)
