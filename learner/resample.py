"""Resampling a logged prompt from the weights being trained, through the agent's real tools.

A labelled prompt (`learner.labels`) is run again here as the ReAct graph runs it: the first
model call from the logged prompt tokens, each tool call the model writes run through the
agent's own tools (`tools.registry.ToolRegistry`, the same sandbox as in serving), the tool's
output fed back as a `tool` turn, at most `max_steps` model calls, and the pack's
`answer_of` on the last reply checked against the label. Sampling is the policy server's
(`learner.policy.generation.generate`): the same stops (the line format's call line), the
same logprobs, seeded per prompt, choice and turn. A prompt whose logged messages no longer
render to its logged tokens (another tool format, a scrubbed input) is not replayed: the
replay could not be faithful to what was served.

A hinted start (`hinted`, STaR's rationalisation, Zelikman et al. 2022) is the same prompt with
its label stated at the end of the user's last message: the model samples from that, and each
turn records the prompt without the hint, which is what a trained sample is conditioned on.
Whether a run only copied the hint is the caller's check (`derived`).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.events import ModelStep
from learner.labels import Grounding
from learner.policy.chat_format import (
    call_stop_pattern,
    parse_tool_calls,
    prompt_token_ids,
)
from learner.policy.generation import SamplingParams, generate
from tools.registry import ToolRegistry


@dataclass(frozen=True)
class Turn:
    """One model call of a replayed run: what it was given, what it wrote."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    after_tool: bool
    """A tool's output was in this turn's prompt."""
    tool_output: str = ""
    """What the tools this turn called returned, joined by newlines ("" without a call)."""


@dataclass
class Replay:
    """One resampled run of a prompt, scored against its label."""

    turns: list[Turn] = field(default_factory=list)
    output: str | None = None
    """The last reply (None: the step budget ran out with a tool call pending)."""
    used_tool: bool = False
    solved: bool = False


@dataclass(frozen=True)
class Start:
    """A logged first model call to replay, and the answer that counts as solved."""

    step: ModelStep
    grounding: Grounding
    answer: str
    key: str
    """Seeds the prompt's samples (with the sub-round): the prompt's label key."""
    hint: str | None = None
    """Text appended to the user's last message for sampling only (`hinted`)."""


HINT = "(The correct answer is {answer}.)"
"""How a hinted start states its label: the label the pack read, never a user's free text."""


def hinted(start: Start) -> Start | None:
    """The start with its label as a hint; None where its agent has no tools (a hinted run's
    answer could only be copied) or its last user message is not text."""
    if not start.grounding.tools or _last_user(start.step.messages) is None:
        return None
    return Start(
        start.step, start.grounding, start.answer, start.key, HINT.format(answer=start.answer)
    )


def hint_prompt_ids(start: Start, tokenizer: Any) -> list[int]:
    """The first call's prompt as a hinted start's model sees it (the hint in it)."""
    return _prompt(start, None, tokenizer, hint=True)


def derived(run: Replay, answer: str) -> bool:
    """Whether a run's answer came from a tool: a tool's output states it and no turn of the
    model stated it before that output did (a hinted run that wrote it first copied the hint)."""
    for turn in run.turns:
        if _states(turn.text, answer):
            return False
        if _states(turn.tool_output, answer):
            return True
    return False


def _states(text: str, answer: str) -> bool:
    """`answer` as a whole token of `text` (42 in `#### 42` or `42.0`, not in `420` or `4.2`)."""
    pattern = rf"(?<![\w.]){re.escape(answer)}(?!\w|\.0*[1-9])"
    return re.search(pattern, text, flags=re.IGNORECASE) is not None


def _last_user(messages: Sequence[dict[str, Any]]) -> int | None:
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users or not isinstance(messages[users[-1]].get("content"), str):
        return None
    return users[-1]


def faithful(start: Start, tokenizer: Any) -> bool:
    """Whether the logged messages render to the logged prompt tokens (else no replay)."""
    specs = _specs(start)
    try:
        ids = prompt_token_ids(tokenizer, start.step.messages, specs, start.grounding.tool_format)
    except ValueError:
        return False
    return ids == list(start.step.prompt_token_ids or [])


def replay(
    model: Any,
    tokenizer: Any,
    starts: Sequence[Start],
    *,
    n: int,
    temperature: float,
    max_tokens: int,
    seed: int,
    max_batch_size: int = 32,
) -> list[list[Replay]]:
    """`n` runs of each start from `model`, batched turn by turn (`max_batch_size` rows decode
    at once); each scored against its label."""
    runs = [[Replay() for _ in range(n)] for _ in starts]
    threads: dict[tuple[int, int], list[dict[str, Any]]] = {}
    live = [(i, k) for i in range(len(starts)) for k in range(n)]
    for turn in range(max((s.grounding.max_steps for s in starts), default=0)):
        live = [(i, k) for i, k in live if turn < starts[i].grounding.max_steps]
        if not live:
            break
        prompts = [_prompt(starts[i], threads.get((i, k)), tokenizer) for i, k in live]
        seen = [
            _prompt(starts[i], threads.get((i, k)), tokenizer, hint=True) if starts[i].hint else p
            for (i, k), p in zip(live, prompts, strict=True)
        ]
        params = [
            _params(starts[i], temperature, max_tokens, _seed(seed, starts[i].key, k, turn))
            for i, k in live
        ]
        done = generate(model, tokenizer, seen, params, max_batch_size=max_batch_size)
        still = []
        for (i, k), prompt, (event,) in zip(live, prompts, done, strict=True):
            start, run = starts[i], runs[i][k]
            content, calls = parse_tool_calls(
                event.text, _specs(start), start.grounding.tool_format
            )
            more = calls and turn + 1 < start.grounding.max_steps
            tool_turns = _tool_turns(start, content, calls, k, turn) if more else []
            output = "\n".join(m["content"] for m in tool_turns if m["role"] == "tool")
            run.turns.append(
                Turn(prompt, event.token_ids, event.logprobs, event.text, turn > 0, output)
            )
            if not calls:
                run.output = event.text
                continue
            run.used_tool = True
            if more:
                base = threads.get((i, k), list(start.step.messages))
                threads[(i, k)] = base + tool_turns
                still.append((i, k))
        live = still
    for start, choices in zip(starts, runs, strict=True):
        for run in choices:
            said = start.grounding.answer_of(run.output) if run.output is not None else None
            run.solved = said is not None and said == start.answer
    return runs


def _params(start: Start, temperature: float, max_tokens: int, seed: int) -> SamplingParams:
    """How one turn samples: the round's temperature, the agent's own budget, stops and
    penalties where its pack gives them."""
    g = start.grounding
    return SamplingParams(
        temperature=temperature,
        max_tokens=max_tokens if g.max_tokens is None else g.max_tokens,
        stop=g.stop,
        include_stop=g.include_stop,
        frequency_penalty=g.frequency_penalty,
        presence_penalty=g.presence_penalty,
        seed=seed,
        stop_line=call_stop_pattern(_specs(start), g.tool_format),
    )


def _specs(start: Start) -> list[dict[str, Any]]:
    offered = set(start.step.tool_names)
    return [t.spec() for t in start.grounding.tools if t.name in offered]


def _prompt(
    start: Start, thread: list[dict[str, Any]] | None, tokenizer: Any, *, hint: bool = False
) -> list[int]:
    """A turn's prompt ids; with `hint`, rendered with the start's hint (what the model sees)."""
    if thread is None and not hint:
        return list(start.step.prompt_token_ids or [])
    messages = list(thread if thread is not None else start.step.messages)
    if hint:
        i = _last_user(start.step.messages)
        assert i is not None and start.hint is not None  # `hinted` made the start
        messages[i] = {**messages[i], "content": f"{messages[i]['content']}\n\n{start.hint}"}
    return prompt_token_ids(tokenizer, messages, _specs(start), start.grounding.tool_format)


def _tool_turns(
    start: Start, content: str | None, calls: list[dict[str, Any]], choice: int, turn: int
) -> list[dict[str, Any]]:
    """The assistant's calls and each tool's output, as the ReAct graph adds them."""
    registry = ToolRegistry(start.grounding.tools)
    calls = [{**c, "id": f"call_{choice}_{turn}_{j}"} for j, c in enumerate(calls)]
    results = asyncio.run(_run_all(registry, calls))
    said = {"content": content} if content else {}
    out: list[dict[str, Any]] = [{"role": "assistant", **said, "tool_calls": calls}]
    out += [{"role": "tool", "tool_call_id": r.call_id, "content": r.output} for r in results]
    return out


async def _run_all(registry: ToolRegistry, calls: list[dict[str, Any]]):
    return await asyncio.gather(
        *(registry.call(c["function"]["name"], c["function"]["arguments"], c["id"]) for c in calls)
    )


def _seed(seed: int, key: str, choice: int, turn: int) -> int:
    """A seed per (round seed, prompt, choice, turn); `generate` adds nothing (n=1 per row)."""
    digest = hashlib.sha256(f"{seed}\x1f{key}\x1f{choice}\x1f{turn}".encode()).digest()
    return int.from_bytes(digest[:6], "big")
