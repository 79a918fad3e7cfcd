"""Agent specs and the runtime that runs one agent run on a thread and records it."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import redis
import redis.asyncio as aioredis
from langchain_core.messages import RemoveMessage

from agents.adapter_routes import policy_client
from agents.checkpoints import make_checkpointer
from agents.decisions import Decision
from agents.errors import ArloopError
from agents.events import (
    CASE_KEY,
    ONE_SHARD,
    AnswerPath,
    ModelStep,
    RunStatus,
    StreamShards,
    TrajectoryEvent,
    new_id,
)
from agents.guard import Guard
from agents.memory import LongTermMemory
from agents.model_routes import ModelRoute
from agents.policy_client import Generation, PolicyClient, PolicyConfig
from agents.react import build_react, run_input
from agents.reflexion import build_reflexion, reflexion_input
from agents.run_context import Emit, RunContext, RunUpdate, to_openai
from agents.spec_checks import check_spec
from agents.threads import ThreadLease, Threads
from agents.trajectory_sink import Scrub, TrajectorySink
from tools.base import Tool
from tools.registry import ToolRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentSpec:
    """One servable agent: its prompt, tools and loop (data; packs build these)."""

    name: str
    description: str
    system_prompt: str
    kind: Literal["react", "reflexion"] = "react"
    tools: tuple[Tool, ...] = ()
    verifier: Tool | None = None
    """Reflexion only: judges each attempt (called with `question` and `answer`)."""
    task_kind: str | None = None
    """Long-term memory is kept per user and task kind."""
    max_steps: int = 6
    """Model calls per run (per attempt for Reflexion) before the step budget stops it."""
    max_attempts: int = 2
    """Reflexion only: attempts per run, the first included."""
    examples: tuple[dict[str, Any], ...] = ()
    """A worked example: OpenAI-format messages (user, assistant tool call, tool result,
    answer) placed between the system prompt and the conversation on every model call."""
    input_filter: Callable[[str], str] | None = None
    """Applied to the user's message before it enters the graph: a PHI scrubber here means
    the model, the thread checkpoints and every log only ever see placeholders."""
    disclaimer: str | None = None
    """Shown with every answer of this agent (the chat page, the run's response)."""
    escalate: Callable[[str, str], str | None] | None = None
    """(user's message, answer) -> a notice the person must see (e.g. call emergency
    services), decided by the pack's rules whatever the model wrote; None: nothing to add."""
    guard: Guard | None = None
    """Decides what a run returns from the (filtered) message and the model's final answer:
    a pack's safety envelope and fallback (`agents.guard`). None: the model's answer, except
    that a Reflexion answer its verifier failed is never returned."""
    generation: Generation | None = None
    """The agent's own sampling (max tokens, stop sequences, penalties) over the process's."""
    model: ModelRoute | None = None
    """The agent's own model, endpoint and fallbacks (`agents.model_routes`); None: the
    process's policy (ARLOOP_POLICY_*). ARLOOP_AGENT_MODELS sets it per agent over the pack's."""
    retry_when: Callable[[str], bool] | None = None
    """Reflexion only: whether a failed attempt at this (filtered) message is worth another
    (None: always, within `max_attempts`). The triage agent answers a red-flag message at
    once: its guard escalates it whatever a retry would write."""
    decision: Decision | None = None
    """A choice in the final reply that the serving version's head makes in place of the
    model's words (`agents.decisions`: the triage level); None: the model's words stand."""

    def __post_init__(self) -> None:
        """A wrong field is an AgentSpecError naming it and what it takes (agents.spec_checks)."""
        for field, value in check_spec(self).items():
            object.__setattr__(self, field, value)

    def public(self) -> dict[str, Any]:
        """What `GET /v1/agents` shows: plain strings only, whatever a spec holds."""
        return {
            "name": str(self.name),
            "description": str(self.description),
            "kind": str(self.kind),
            "tools": [str(getattr(t, "name", t)) for t in self.tools],
            "task_kind": None if self.task_kind is None else str(self.task_kind),
            "disclaimer": None if self.disclaimer is None else str(self.disclaimer),
        }


class UnknownAgent(ArloopError):
    """No agent of that name runs here (404); the reason lists those that do."""

    def __init__(self, name: str, known: list[str]) -> None:
        runs = ", ".join(known) or "none"
        super().__init__(404, f"unknown agent {name!r}; this service runs: {runs}")
        self.name = name


@dataclass
class _Agent:
    spec: AgentSpec
    graph: Any
    tools: ToolRegistry
    verifier: ToolRegistry | None
    policy: PolicyClient
    """The agent's own model where its spec names one, else the runtime's."""

    def start(self, text: str) -> dict[str, Any]:
        if self.spec.kind == "reflexion":
            return reflexion_input(text, self.spec.max_steps, self.spec.max_attempts)
        return run_input(text, self.spec.max_steps)

    @property
    def recursion_limit(self) -> int:
        return (2 * self.spec.max_steps + 4) * max(1, self.spec.max_attempts) + 4


class AgentRuntime:
    """Runs agents on Redis-backed threads and sinks one TrajectoryEvent per run."""

    def __init__(
        self,
        specs: list[AgentSpec],
        *,
        policy: PolicyClient,
        threads: Threads,
        sink: TrajectorySink,
        checkpointer: Any = None,
        memory: LongTermMemory | None = None,
        durability: Literal["sync", "async", "exit"] = "exit",
    ) -> None:
        self.policy = policy
        self.threads = threads
        self.sink = sink
        self.memory = memory
        self.durability = durability if checkpointer is not None else None
        self.checkpointer = checkpointer
        self.agents = {s.name: self._compile(s, checkpointer, policy) for s in specs}

    @classmethod
    def on_redis(
        cls,
        client: aioredis.Redis,
        specs: list[AgentSpec],
        policy: PolicyConfig,
        *,
        canary_share: float = 0.0,
        scrub: Scrub | None = None,
        thread_ttl_s: int | None = None,
        lock_s: float = 300.0,
        memory_max_items: int = 200,
        rng: random.Random | None = None,
        durability: Literal["sync", "async", "exit"] = "exit",
        memory_ttl_s: int | None = None,
        stream_max_entries: int | None = None,
        shards: StreamShards = ONE_SHARD,
    ) -> AgentRuntime:
        """The runtime with everything on one Redis: threads, checkpoints, memory, sink."""
        threads = Threads(
            client,
            canary_share=canary_share if policy.versions_routed else 0.0,
            lock_s=lock_s,
            ttl_s=thread_ttl_s,
            rng=rng,
        )
        return cls(
            specs,
            policy=policy_client(policy, client),  # vLLM adapters or the plain client
            threads=threads,
            sink=TrajectorySink(client, scrub, max_entries=stream_max_entries, shards=shards),
            checkpointer=make_checkpointer(client, thread_ttl_s),
            memory=LongTermMemory(
                client, max_items=memory_max_items, scrub=scrub, ttl_s=memory_ttl_s
            ),
            durability=durability,
        )

    @staticmethod
    def _compile(spec: AgentSpec, checkpointer: Any, policy: PolicyClient) -> _Agent:
        if spec.kind == "reflexion":
            graph = build_reflexion(checkpointer)
        else:
            graph = build_react(checkpointer, guarded=spec.guard is not None)
        verifier = ToolRegistry([spec.verifier]) if spec.verifier else None
        if spec.model is not None:
            policy = PolicyClient(policy.config.routed(spec.model))
        return _Agent(spec, graph, ToolRegistry(spec.tools), verifier, policy)

    def spec(self, name: str) -> AgentSpec:
        if name not in self.agents:
            raise UnknownAgent(name, list(self.agents))
        return self.agents[name].spec

    async def run(
        self,
        agent: str,
        text: str,
        user_id: str,
        thread_id: str | None = None,
        metadata: dict[str, str] | None = None,
        arm: str | None = None,
        trajectory_id: str | None = None,
        policy: PolicyClient | None = None,
        emit: Emit | None = None,
    ) -> TrajectoryEvent:
        """Run `agent` on the thread, sink the trajectory, return it (unscrubbed).

        `arm` pins the policy for this run (`v3`, `candidate`) instead of the thread's arm:
        eval runs compare versions this way. `trajectory_id` is minted when not given (the
        agent API mints it first, so the run's log lines carry it). `policy` calls the model
        for this run only (the eval gate's per-run sampling seed). `emit` hears the run as
        it goes: `start` once the thread is held, then text as it streams and each step as
        it ends. A run cancelled midway (its client left) leaves its thread as it was and is
        logged with status `cancelled`.
        """
        self.spec(agent)
        entry = self.agents[agent]
        if entry.spec.input_filter is not None:  # CPU-bound (presidio): off the event loop
            text = await asyncio.to_thread(entry.spec.input_filter, text)
        lease = await self.threads.open(thread_id or new_id("th"), user_id, agent)
        ctx = self._context(entry, user_id, arm or lease.arm, policy or entry.policy)
        if emit is not None and (entry.spec.guard is not None or entry.spec.decision is not None):
            emit = _guarded(emit)
        ctx.emit = emit
        if emit is not None:
            emit(RunUpdate("start", "", 0))
        started, start = time.time(), entry.start(text)
        config = self._config(entry, lease)
        run = _RunRecord(entry, ctx, lease, text, started, metadata or {}, trajectory_id)
        try:
            state = await entry.graph.ainvoke(
                start, config, context=ctx, durability=self.durability
            )
        except asyncio.CancelledError:  # logged as cancelled: its thread stays, emptied of it
            await self._forget_failed_run(entry, config, start["messages"][0].id)
            await asyncio.gather(self.sink.write(self._cancelled(run)), self._close(lease))
            raise
        except BaseException:
            await self._undo(entry, config, start["messages"][0].id, lease)
            await self._close(lease)
            raise
        event = self._trajectory(run, state)
        try:
            await self.sink.write(event)
        except BaseException:  # Redis refused the log (full, read-only): the run did not happen
            await self._undo(entry, config, start["messages"][0].id, lease)
            raise
        finally:
            await self._close(lease)
        return event

    async def first_call(
        self, agent: str, text: str, *, arm: str, policy: PolicyClient | None = None
    ) -> ModelStep:
        """The agent's first model call of a fresh run, alone: no thread, no tool run, no
        memory (what an eval run's first turn sends), for a pack's cheap first-turn check."""
        entry = self.agents[self.spec(agent).name]
        if entry.spec.input_filter is not None:
            text = await asyncio.to_thread(entry.spec.input_filter, text)
        start = entry.start(text)["messages"]
        wire = to_openai(start, entry.spec.system_prompt, list(entry.spec.examples))
        sampling = entry.spec.generation
        return await (policy or entry.policy).complete(
            wire, entry.tools.specs(), arm=arm, sampling=sampling
        )

    async def thread_messages(self, thread_id: str, user_id: str) -> tuple[dict, list] | None:
        """(the thread's record, its messages) when `user_id` owns it; None otherwise, so a
        caller cannot tell another user's thread from one that does not exist."""
        record = await self.threads.record(thread_id)
        if (
            record is None
            or record.get("user") != user_id
            or record.get("agent") not in self.agents
        ):
            return None
        if self.durability is None:  # no checkpointer: threads keep no messages
            return record, []
        graph = self.agents[record["agent"]].graph
        snapshot = await graph.aget_state({"configurable": {"thread_id": thread_id}})
        return record, list(snapshot.values.get("messages", []))

    def _context(self, entry: _Agent, user_id: str, arm: str, policy: PolicyClient) -> RunContext:
        spec = entry.spec
        return RunContext(
            policy=policy,
            tools=entry.tools,
            system_prompt=spec.system_prompt,
            user_id=user_id,
            task_kind=spec.task_kind,
            arm=arm,
            memory=self.memory,
            verifier=entry.verifier,
            max_steps=spec.max_steps,
            examples=list(spec.examples),
            guard=spec.guard,
            generation=spec.generation,
            retry_when=spec.retry_when,
            decision=spec.decision,
        )

    @staticmethod
    def _config(entry: _Agent, lease: ThreadLease) -> dict[str, Any]:
        return {
            "configurable": {"thread_id": lease.thread_id},
            "recursion_limit": entry.recursion_limit,
        }

    async def _undo(self, entry: _Agent, config: dict, first_id: str, lease: ThreadLease) -> None:
        """A failed run leaves no trace in its thread: a thread it started is deleted (its
        record and checkpoints: deletions, which a full Redis still takes), and one it
        continued loses the messages the run added."""
        if not lease.new:
            return await self._forget_failed_run(entry, config, first_id)
        try:
            if self.checkpointer is not None:
                await self.checkpointer.adelete_thread(lease.thread_id)
            await self.threads.client.delete(self.threads.key(lease.thread_id))
        except Exception:  # noqa: BLE001 -- Redis down too: the run's own error is the answer
            log.warning("could not delete the failed run's new thread %s", lease.thread_id)

    async def _forget_failed_run(self, entry: _Agent, config: dict, first_id: str) -> None:
        """A failed run leaves its thread as it was: drop the messages it added."""
        if self.durability is None:
            return
        try:
            snapshot = await entry.graph.aget_state(config)
            ids = [m.id for m in snapshot.values.get("messages", [])]
            if first_id in ids:
                gone = [RemoveMessage(id=i) for i in ids[ids.index(first_id) :]]
                await entry.graph.aupdate_state(config, {"messages": gone})
        except Exception:  # noqa: BLE001 -- Redis down too: then nothing was written either
            log.warning("could not roll back the failed run on %s", config["configurable"])

    async def _close(self, lease: ThreadLease) -> None:
        try:
            await self.threads.close(lease)
        except redis.RedisError:  # the lock expires by itself; keep the run's own error
            log.warning("could not release thread %s", lease.thread_id)

    def _trajectory(self, run: _RunRecord, state: dict[str, Any]) -> TrajectoryEvent:
        metadata = run.metadata
        if run.entry.spec.kind == "reflexion":
            attempts = run.entry.spec.max_attempts - state["attempts_left"]
            metadata = metadata | {
                "arloop.verdict": state["verdict"],
                "arloop.attempts": str(attempts),
            }
        metadata = metadata | {f"arloop.{k}": v for k, v in (state.get("review") or {}).items()}
        metadata = metadata | {f"arloop.{k}": v for k, v in run.ctx.decided.items()}
        if run.ctx.case and run.ctx.case != run.text:  # a reply to a follow-up question
            metadata = metadata | {CASE_KEY: run.ctx.case}
        answered_by = AnswerPath(state.get("answered_by") or AnswerPath.MODEL.value)
        replaced = answered_by is not AnswerPath.MODEL
        status = STATUS_OF.get(answered_by, RunStatus(state["status"]))
        model_output = state.get("model_answer", "") if replaced else None
        return run.event(final_output(state), status, metadata, answered_by, model_output)

    @staticmethod
    def _cancelled(run: _RunRecord) -> TrajectoryEvent:
        """The partial run: the steps that finished, the last answer written (if any)."""
        answers = [s.output for s in run.ctx.steps if isinstance(s, ModelStep) and s.output]
        return run.event(answers[-1] if answers else "", RunStatus.CANCELLED, run.metadata)


@dataclass
class _RunRecord:
    """What one run's trajectory is made of, whichever way it ends."""

    entry: _Agent
    ctx: RunContext
    lease: ThreadLease
    text: str
    started: float
    metadata: dict[str, str]
    trajectory_id: str | None

    def event(
        self,
        output: str,
        status: RunStatus,
        metadata: dict[str, str],
        answered_by: AnswerPath = AnswerPath.MODEL,
        model_output: str | None = None,
    ) -> TrajectoryEvent:
        ctx = self.ctx
        model_steps = [s for s in ctx.steps if isinstance(s, ModelStep)]
        version = model_steps[-1].policy_version if model_steps else ctx.policy.model_for(ctx.arm)
        return TrajectoryEvent(
            event_id=self.trajectory_id or new_id("traj"),
            thread_id=self.lease.thread_id,
            agent=self.entry.spec.name,
            task_kind=self.entry.spec.task_kind,
            user_id=ctx.user_id,
            input=self.text,
            output=output,
            policy_version=version,
            steps=list(ctx.steps),
            status=status,
            started_at=self.started,
            finished_at=time.time(),
            metadata=metadata,
            answered_by=answered_by,
            model_output=model_output,
        )


STATUS_OF = {AnswerPath.ENVELOPE: RunStatus.ESCALATED, AnswerPath.FALLBACK: RunStatus.FALLBACK}
"""A run's status when the model's answer was not what it returned (else the graph's)."""


def final_output(state: dict[str, Any]) -> str:
    last = state["messages"][-1]
    return last.content if isinstance(last.content, str) else str(last.content)


def _guarded(emit: Emit) -> Emit:
    """What a listener hears of an agent with a guard (or a decision its version's head
    makes): the start and its tool steps, never the model's own text, which the guard may
    replace (a dose streamed token by token before the fallback would already have been read)
    or the head re-decide. The answer comes with the run's end."""

    def listen(update: RunUpdate) -> None:
        if update.kind not in ("delta", "model"):
            emit(update)

    return listen
