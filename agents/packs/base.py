"""The `Pack` API: what a team writes to bring its own agents to arloop.

A pack is data: its agents (`agents.runtime.AgentSpec`: prompt, tools, loop, guard, model),
optionally the tasks its users bring (a training split for simulated users, a held-out eval
split the release gate draws from) with a verifier that scores an answer, and the label hooks
that let the learner turn feedback into verified labels. Only `name` and `agents` are needed:
a pack without tasks is served and learned from by its feedback alone, and has no eval suite.

A team's own agent (plain LangGraph, the OpenAI SDK, any framework), which calls the agent
API's `/v1/chat/completions` itself, is described by a pack with no agents and a `run`: its
name is the agent's (`X-Arloop-Agent`), and the gate judges a version by calling `run` with
the version's model name (`docs/any_agent.md`).

A pack is named by a `module:attr` string (a `Pack`, or a function returning one) or registered
under the `arloop.packs` entry-point group of the package that ships it (see `agents.packs`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from agents.events import ModelStep
from agents.runtime import AgentSpec

Split = Literal["train", "eval"]
ScoreReward = Callable[[str, float], float | None]
"""A pack's reading of a named score: (key, score) -> reward in [-1, 1], or None."""


def default_score_reward(key: str, score: float) -> float | None:
    """A named score in [0, 1] as the reward 2s - 1 (as an outcome); a score on another scale
    is the pack's to read (`Pack.score_reward`): None, not learned from."""
    return 2.0 * score - 1.0 if 0.0 <= score <= 1.0 else None


@dataclass(frozen=True)
class Task:
    """One task for an agent, with what counts as solved (never shown to the agent)."""

    id: str
    agent: str
    input: str
    reference: str
    """What the verifier compares against: a number, a triage level, ..."""
    needs_tool: str | None = None
    """The tool a good answer uses (for the tool-use guard), if any."""
    meta: dict[str, str] = field(default_factory=dict)


TeamRun = Callable[[Task, str, str, dict[str, str]], str | Awaitable[str]]
"""A team's own agent, run on one task: `run(task, base_url, model, headers) -> answer`. It
calls an OpenAI-compatible `base_url` with `model` (`arloop@v3`: the version being judged) and
sends `headers` on every call; plain or `async`."""


def no_tasks(split: Split) -> list[Task]:
    """A pack without tasks: no simulated users, no eval suite."""
    return []


def no_verifier(task: Task, output: str) -> float:
    """A pack without a verifier has no tasks to score; calling it is a pack bug."""
    raise ValueError(f"task {task.id!r} has no verifier: give the pack `verify=`")


@dataclass(frozen=True)
class Pack:
    """A deployable domain: its agents, its task sets and its answer verifier."""

    name: str
    """The pack's name (`arloop packs list`, the gate's reports); with `run`, the name of the
    team's agent too (its `X-Arloop-Agent`, its tasks' `Task.agent`)."""
    agents: tuple[AgentSpec, ...] = ()
    """The agents it serves, each with its prompt, tools, loop, guard and (optional) model;
    none for a team's own agent (`run`)."""
    tasks: Callable[[Split], list[Task]] = no_tasks
    """`tasks("train")` for simulated users, `tasks("eval")` the held-out pool (disjoint from
    training; the eval gate draws from it, stratified by `Task.meta["kind"]`)."""
    verify: Callable[[Task, str], float] = no_verifier
    """Score a final answer for a task in [0, 1] (1 = solved)."""
    answer_of: Callable[[str], str | None] | None = None
    """The final answer a reply states, normalised so equal answers are equal strings (`30`,
    `urgent`); None when the reply states none. With it the learner turns feedback into labels
    and checks the runs it resamples (`learner.labels`); a pack without it is learned from by
    its feedback alone."""
    reference_from: Callable[[str], str | None] | None = None
    """The answer a user's correction states (`it's 30`, `this was urgent`), normalised as
    `answer_of`'s; None: the correction's text is read with `answer_of`."""
    restate: Callable[[str, str], str | None] | None = None
    """A reply rewritten to state another answer, all else kept (`tools.verifiers.with_level`:
    the triage line's level changed); None where that cannot be done. With it, a labelled
    prompt's runs that stated another answer become preference pairs that differ in the
    decision alone (`learner.samples.restated_pairs`). None: the pack's labels train through
    the verified sub-rounds only."""
    score_reward: ScoreReward = default_score_reward
    """How a named score (`{"key": "helpfulness", "score": 4}` on `POST /v1/feedback`) becomes
    a reward in [-1, 1] (None: not learned from); read when the feedback arrives."""
    first_turn: Callable[[Task, ModelStep], float] | None = None
    """Score an agent's first model call alone in [0, 1] (the tutor: does its calculator call
    compute the answer): the cheap form of an eval run that the gate's sampled test uses,
    checked against full runs in every gate report. None: the gate runs whole episodes."""

    run: TeamRun | None = None
    """A team's own agent, which arloop does not run but calls: the gate runs each held-out
    task through it, pointed at the version it judges, champion and candidate alike (same
    seeds, same sequential test; `deploy.learn.eval_endpoint`). None: the pack's `agents`."""

    def has_eval_suite(self) -> bool:
        """Whether the release gate can judge versions on this pack: held-out tasks and a
        verifier to score them."""
        return self.verify is not no_verifier and bool(self.tasks("eval"))
