"""Simulated users: students and patients who use the agent API over HTTP, like real clients.

A user brings a task (from a pack's training split), posts it to `/v1/agents/{agent}/runs`,
reads the answer, judges it by plain rules, and posts feedback with the run's token. The
rules are the preferences the policy can learn, chosen so a 135M model can learn them on a
CPU in minutes:

- the answer is right (students: the `#### <number>` equals the problem's answer; patients:
  the triage level is the one the knowledge base gives): the pack's verifier scores it;
- the tool was used where the task needs it (the calculator, kb_search);
- red flags are escalated: a patient with a red-flag symptom who is not told `emergency` is
  unhappy whatever else the answer says;
- no padding: an answer over `max_words` words costs satisfaction.

Satisfaction in [0, 1] = the verifier's score, less 0.25 for a missed tool and 0.25 for
padding (0 for a missed red flag). Feedback, each kind sent with its own probability:
`thumbs` +1 when satisfaction >= 0.75 else -1; `rating` 1 + 4 x satisfaction, rounded;
`outcome` 1 when the verifier says solved else 0; `correction` (only after a wrong answer) the
answer the user knew was right. `noise` flips each judgement (thumbs and outcome invert, the
rating moves one step) with that probability, `silence` is the chance a user sends nothing
at all, and each user waits a random `delay_s` before sending.

Patients (`PATIENTS`) judge as a clinic's records do: the patient sends a thumbs (noisier:
a patient cannot tell the right level), and on a share of visits (`clinician`) the
disposition a clinician later assigned arrives: an `outcome` (1 when the level the agent gave
was the one assigned) and, when it was not, a `correction` naming the level (after a
follow-up question the rules would have asked, the question). No rating, no self-reported
outcome.

A team's own agent (a pack with `run` and no `AgentSpec`: the LangGraph and OpenAI-SDK tutors
of `tests/examples/`) is visited as the team's service would serve it: the user's problem goes
to the team's `run`, pointed at the agent API's `/v1/chat/completions` with the user's own
`X-Arloop-Run`; the service then ends the run (`POST /v1/runs/end`, its answer), and the
user's feedback goes with the token that returns.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from agents.packs.base import Pack, Task
from agents.packs.red_flags import assess, red_flags
from deploy.demo.stack import StackError
from tools.verifiers import DISCLAIMER, triage_level


@dataclass(frozen=True)
class Behaviour:
    """How simulated users give feedback: which kinds, how noisy, how late, how often silent."""

    thumbs: float = 1.0
    """Probability of a thumbs up/down after a run."""
    rating: float = 0.3
    outcome: float = 0.5
    correction: float = 0.1
    """Probability of sending the right answer as a correction after a wrong one."""
    noise: float = 0.05
    """Probability that any one judgement is wrong (flipped, or a rating one step off)."""
    silence: float = 0.1
    """Probability that a user sends no feedback at all."""
    delay_s: tuple[float, float] = (0.0, 0.0)
    """Uniform range of the wait between the answer and the feedback."""
    max_words: int = 60
    """Answers longer than this are padding."""
    clinician: float = 0.0
    """Probability that a clinician's later disposition comes back for a visit (patients)."""


PATIENTS = Behaviour(thumbs=0.8, rating=0.0, outcome=0.0, correction=0.0, noise=0.15, clinician=0.5)
"""Patients and their clinic: thumbs from the patient, the disposition from a clinician on
half the visits (a share of the calls an urgent-care service audits)."""


@dataclass(frozen=True)
class Verdict:
    """How a user judged one answer, rule by rule."""

    score: float  # the pack's verifier
    used_tool: bool
    needs_tool: bool
    red_flag_missed: bool
    padded: bool

    @property
    def satisfaction(self) -> float:
        if self.red_flag_missed:
            return 0.0
        missed_tool = self.needs_tool and not self.used_tool
        return max(0.0, self.score - 0.25 * missed_tool - 0.25 * self.padded)


@dataclass
class Visit:
    """One user's run and what they sent back."""

    user_id: str
    task: Task
    trajectory_id: str
    policy_version: str
    output: str
    tools: list[str]
    verdict: Verdict
    feedback: list[tuple[str, float | None]] = field(default_factory=list)
    silent: bool = False


def judge(pack: Pack, task: Task, output: str, tools: Sequence[str], max_words: int) -> Verdict:
    """The rules above, applied to one answer."""
    flagged = bool(red_flags(task.input)) or task.meta.get("red_flag") == "true"
    return Verdict(
        score=float(pack.verify(task, output)),
        used_tool=task.needs_tool in tools if task.needs_tool else True,
        needs_tool=task.needs_tool is not None,
        red_flag_missed=flagged and triage_level(output) != "emergency",
        padded=len(output.split()) > max_words,
    )


def correction_text(task: Task) -> str:
    """What the user knew the answer should have been, in the agent's answer format."""
    if task.agent == "triage" and task.reference == "ask":
        return assess(task.input).ask.question  # an `ask` case always has one (triage_cases)
    if task.agent == "triage":
        return f"{DISCLAIMER}\nTriage: {task.reference}"
    return f"The answer is {task.reference}.\n#### {task.reference}"


def feedback_for(
    v: Verdict, task: Task, b: Behaviour, rng: random.Random, silent: bool | None = None
) -> list[dict[str, Any]]:
    """The feedback bodies one user sends for one verdict (without trajectory and token).

    `silent` overrides the `silence` draw; a user who is not silent sends at least a thumbs.
    """
    if silent if silent is not None else rng.random() < b.silence:
        return []
    noisy = lambda: rng.random() < b.noise  # noqa: E731 - one judgement's coin
    solved = v.score >= 1.0
    out: list[dict[str, Any]] = []
    if rng.random() < b.thumbs:
        up = (v.satisfaction >= 0.75) != noisy()
        out.append({"kind": "thumbs", "value": 1 if up else -1})
    if rng.random() < b.rating:
        stars = 1 + round(4 * v.satisfaction) + (rng.choice((-1, 1)) if noisy() else 0)
        out.append({"kind": "rating", "value": min(5, max(1, stars))})
    if rng.random() < b.outcome:
        out.append({"kind": "outcome", "value": 1.0 if solved != noisy() else 0.0})
    if not solved and rng.random() < b.correction:
        out.append({"kind": "correction", "text": correction_text(task)})
    if rng.random() < b.clinician:  # the disposition a clinician assigned: no noise
        out.append({"kind": "outcome", "value": 1.0 if solved else 0.0})
        if not solved:
            out.append({"kind": "correction", "text": correction_text(task)})
    if not out:
        up = (v.satisfaction >= 0.75) != noisy()
        out.append({"kind": "thumbs", "value": 1 if up else -1})
    return out


RETRIED = (502, 503, 504)
RETRY_PAUSES_S = (5.0, 20.0)


class AgentClient:
    """The agent API as a client sees it: runs and feedback over HTTP (httpx)."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 300.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"}
        self.http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s)

    async def run(self, agent: str, text: str, user_id: str, **extra: Any) -> dict[str, Any]:
        """One run; a 502/503/504 (the policy too slow or away on a busy machine: the failed
        run is rolled back) is tried again after a pause, as a person would, twice; then
        StackError, one line naming the likely cause."""
        body = {"input": text, "user_id": user_id, **extra}
        for pause in (*RETRY_PAUSES_S, None):
            r = await self.http.post(f"/v1/agents/{agent}/runs", json=body)
            if r.status_code not in RETRIED or pause is None:
                break
            await asyncio.sleep(pause)
        if r.status_code in RETRIED:
            raise StackError(
                f"the agent API answered {r.status_code} to a visit {len(RETRY_PAUSES_S) + 1} "
                f"times ({r.text[:200]}): the machine is likely too busy for the policy's "
                "timeout; run the demo alone, or raise ARLOOP_POLICY_TIMEOUT_S"
            )
        r.raise_for_status()
        return r.json()

    async def team_run(self, pack: Pack, task: Task, user_id: str, run_id: str) -> dict[str, Any]:
        """One run of a team's own agent (`pack.run`, in a thread: a team's code may block)
        through the agent API's chat endpoint, then ended by its run id: the same fields as
        `run` answers (output, trajectory_id, feedback_token, policy_version, tools)."""
        assert pack.run is not None
        named = {"X-Arloop-Run": run_id}
        headers = {
            "Authorization": self.http.headers["Authorization"],
            "X-Arloop-Agent": pack.name,
            "X-Arloop-User": user_id,
            **named,
        }
        base = f"{str(self.http.base_url).rstrip('/')}/v1"
        answer = await asyncio.to_thread(pack.run, task, base, "arloop", headers)
        r = await self.http.post("/v1/runs/end", json={"output": answer}, headers=named)
        r.raise_for_status()
        ended = r.json()
        r = await self.http.get(f"/v1/runs/{ended['trajectory_id']}")
        r.raise_for_status()
        calls = [c["name"] for s in r.json()["steps"] for c in s.get("tool_calls", [])]
        return ended | {"output": answer, "tools": calls}

    async def feedback(self, run: dict[str, Any], body: dict[str, Any]) -> None:
        r = await self.http.post(
            "/v1/feedback",
            json={
                "trajectory_id": run["trajectory_id"],
                "feedback_token": run["feedback_token"],
                **body,
            },
        )
        r.raise_for_status()

    async def aclose(self) -> None:
        await self.http.aclose()


async def visit(
    client: AgentClient,
    pack: Pack,
    task: Task,
    user_id: str,
    b: Behaviour,
    rng: random.Random,
    silent: bool | None = None,
    cohort: str | None = None,
) -> Visit:
    """One user: ask, read, judge, wait, send feedback; `cohort` tags the run's metadata (user
    ids are stored as pseudonyms: the tag is what tells a round's runs apart in Redis)."""
    if pack.run is not None:  # a team's own agent, served by the team's code
        run = await client.team_run(pack, task, user_id, f"{cohort or 'run'}-{user_id}")
    else:
        tags = {"metadata": {"cohort": cohort}} if cohort else {}
        run = await client.run(task.agent, task.input, user_id, **tags)
    v = judge(pack, task, run["output"], run.get("tools", []), b.max_words)
    bodies = feedback_for(v, task, b, rng, silent)
    out = Visit(
        user_id,
        task,
        run["trajectory_id"],
        run["policy_version"],
        run["output"],
        run.get("tools", []),
        v,
        silent=not bodies,
    )
    if bodies and b.delay_s[1] > 0:
        await asyncio.sleep(rng.uniform(*b.delay_s))
    for body in bodies:
        await client.feedback(run, body)
        out.feedback.append((body["kind"], body.get("value")))
    return out


async def run_traffic(
    client: AgentClient,
    pack: Pack,
    tasks: Sequence[Task],
    behaviour: Behaviour,
    *,
    concurrency: int = 8,
    seed: int = 0,
    prefix: str = "user",
    silent: Collection[int] | None = None,
    on_visit: Callable[[Visit], None] | None = None,
) -> list[Visit]:
    """One visit per task by its own user, `concurrency` at a time; visits in task order.

    `silent` names the visits (by index) whose users send nothing, instead of each drawing
    `behaviour.silence`: the demo uses it to know how many runs get feedback.
    """
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, task: Task) -> Visit:
        quiet = None if silent is None else i in silent
        async with gate:
            done = await visit(
                client,
                pack,
                task,
                f"{prefix}-{i:04d}",
                behaviour,
                random.Random(f"{seed}/{i}"),
                quiet,
                cohort=prefix,
            )
        if on_visit is not None:
            on_visit(done)
        return done

    return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks))))
