"""Logged runs and their feedback as rows in TRL's dataset formats (pure: no I/O, no datasets).

Every row is conversational, as TRL's trainers take it: `prompt` is the messages the model was
given for the run's first call (system, worked example, the thread so far, the user's turn),
and a completion is what the run added: each model call as an `assistant` message (a tool call
written as Hermes `<tool_call>{"name": ..., "arguments": ...}</tool_call>`), each tool result
as a `tool` message, the final answer last. The reward is the learner's own
(`learner.rewards.batch_rewards`: each kind mapped to [-1, 1], the latest word per sender, the
per-user and per-key caps over the exported runs).

- `trl-grpo`: prompt, completion, reward (GRPOTrainer passes `reward` to reward functions);
- `sft`: the same columns, only runs rewarded above 0 (answers worth imitating);
- `kto`: prompt, completion, label (reward > 0; a reward of exactly 0 says nothing: left out);
- `dpo`: prompt, chosen, rejected: runs of the same prompt (`learner.labels.prompt_key`), the
  best rewarded above 0 paired with the worst below 0, then the next two, and so on.

Left out, as the learner leaves them out of training: runs another path answered (a pack's
envelope or fallback: the model did not write the text judged), cancelled runs, runs with no
model call, and runs whose feedback gives no reward (a correction alone).
Every row also carries `trajectory_id`, `agent` and `policy_version` to trace it back.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agents.events import AnswerPath, FeedbackEvent, ModelStep, RunStatus, TrajectoryEvent
from learner.labels import prompt_key
from learner.rewards import batch_rewards

FORMATS = ("trl-grpo", "dpo", "kto", "sft")
Message = dict[str, str]


@dataclass(frozen=True)
class Rated:
    """One exportable run: its conversation split where the model took over, and its reward."""

    trajectory: TrajectoryEvent
    prompt: list[Message]
    completion: list[Message]
    reward: float

    def ids(self) -> dict[str, str]:
        t = self.trajectory
        return {"trajectory_id": t.event_id, "agent": t.agent, "policy_version": t.policy_version}


def conversation(t: TrajectoryEvent) -> tuple[list[Message], list[Message]] | None:
    """(prompt, completion) of a run the model answered, or None (see the module's rules)."""
    calls = t.model_steps
    if not calls or t.answered_by is not AnswerPath.MODEL or t.status is RunStatus.CANCELLED:
        return None
    prompt = [_message(m) for m in calls[0].messages]
    if not prompt or prompt[-1]["role"] not in ("user", "tool"):
        return None  # not a turn the model answered: TRL's templates need a user (or tool) last
    completion = []
    for step in t.steps:
        if isinstance(step, ModelStep):
            completion.append({"role": "assistant", "content": _said(step)})
        else:
            completion.append({"role": "tool", "content": step.output})
    if completion[-1]["role"] != "assistant" or completion[-1]["content"] != t.output:
        completion.append({"role": "assistant", "content": t.output})
    return prompt, completion


def rated_runs(
    runs: Sequence[tuple[TrajectoryEvent, Sequence[FeedbackEvent]]], max_user_share: float
) -> list[Rated]:
    """The runs worth exporting, each with its reward (caps over all of `runs` together)."""
    kept = [(t, fb, c) for t, fb in runs if fb and (c := conversation(t)) is not None]
    rewards = batch_rewards(
        [fb for _, fb, _ in kept],
        [[s.index for s in t.model_steps] for t, _, _ in kept],
        max_user_share,
        None,
    )
    return [
        Rated(t, prompt, completion, r.reward)
        for (t, _, (prompt, completion)), r in zip(kept, rewards, strict=True)
        if r.reward is not None
    ]


def rows(fmt: str, rated: Sequence[Rated]) -> list[dict[str, Any]]:
    """The rows of one format (`FORMATS`), oldest run first."""
    ordered = sorted(rated, key=lambda r: (r.trajectory.finished_at, r.trajectory.event_id))
    if fmt == "trl-grpo":
        return [_completion_row(r) for r in ordered]
    if fmt == "sft":
        return [_completion_row(r) for r in ordered if r.reward > 0]
    if fmt == "kto":
        return [
            {"prompt": r.prompt, "completion": r.completion, "label": r.reward > 0, **r.ids()}
            for r in ordered
            if r.reward != 0
        ]
    if fmt == "dpo":
        return preference_rows(ordered)
    raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")


def preference_rows(rated: Sequence[Rated]) -> list[dict[str, Any]]:
    """DPO pairs: per prompt, the best-rewarded positive run against the worst negative one."""
    groups: dict[str, list[Rated]] = defaultdict(list)
    for r in rated:
        groups[prompt_key(r.trajectory)].append(r)
    out = []
    for group in groups.values():
        good = sorted((r for r in group if r.reward > 0), key=lambda r: -r.reward)
        bad = sorted((r for r in group if r.reward < 0), key=lambda r: r.reward)
        for chosen, rejected in zip(good, bad, strict=False):
            out.append(
                {
                    "prompt": chosen.prompt,
                    "chosen": chosen.completion,
                    "rejected": rejected.completion,
                    "reward_margin": chosen.reward - rejected.reward,
                    "chosen_id": chosen.trajectory.event_id,
                    "rejected_id": rejected.trajectory.event_id,
                    "agent": chosen.trajectory.agent,
                }
            )
    return out


def texts(row: dict[str, Any]) -> list[str]:
    """Every text a row holds (message contents), for the PHI check before it is written."""
    out = []
    for value in row.values():
        if isinstance(value, list):
            out += [m["content"] for m in value if isinstance(m, dict)]
    return out


def _completion_row(r: Rated) -> dict[str, Any]:
    return {"prompt": r.prompt, "completion": r.completion, "reward": r.reward, **r.ids()}


def _message(m: dict[str, Any]) -> Message:
    """A logged message as `{"role", "content"}` text (tool calls rendered as Hermes JSON)."""
    content = m.get("content")
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    text = content if isinstance(content, str) else ""
    calls = [
        _tool_call(c["function"].get("name", ""), c["function"].get("arguments", ""))
        for c in m.get("tool_calls") or []
        if isinstance(c, dict) and isinstance(c.get("function"), dict)
    ]
    return {"role": str(m.get("role", "user")), "content": "\n".join(filter(None, [text, *calls]))}


def _said(step: ModelStep) -> str:
    calls = [_tool_call(c.name, c.arguments) for c in step.tool_calls]
    return "\n".join(filter(None, [step.output or "", *calls]))


def _tool_call(name: str, arguments: str) -> str:
    try:
        args: Any = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        args = arguments  # as the model wrote it
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
