"""The tutoring benchmark's held-out measurement, shared by its arms: the tutor's first model
call as the agent graph sends it, the proxy reward TRL trains on, and the held-out evaluations
(greedy whole runs through the calculator, and the gate's sampled first-turn form). Imported
by `bench_tutoring_learning.py` after it has set the environment up."""

from __future__ import annotations

import asyncio
import json
import math
import statistics

import torch

from agents.packs.base import Task
from agents.packs.tutoring import tutor, verify
from agents.react import BUDGET_NOTE
from agents.run_context import to_openai
from learner.gate.draws import draw_seed, sample_seed, stratified_order
from learner.gate.sequential import sequential_test
from learner.gate.stats import wilson
from learner.policy.chat_format import (
    LINE,
    call_stop_pattern,
    parse_tool_calls,
    prompt_token_ids,
    render_prompt,
)
from learner.policy.generation import SamplingParams, generate
from tools.base import ToolError
from tools.calculator import calculate
from tools.registry import ToolRegistry

TUTOR = tutor()
TOOLS = [t.spec() for t in TUTOR.tools]
REGISTRY = ToolRegistry(TUTOR.tools)


# -- the tutor's first model call and the proxy reward -------------------------------------------


def first_call_messages(question: str) -> list[dict]:
    """The messages of the tutor's first policy call, as the agent graph sends them."""
    from langchain_core.messages import HumanMessage

    text = TUTOR.input_filter(question) if TUTOR.input_filter else question
    return to_openai([HumanMessage(text)], TUTOR.system_prompt, list(TUTOR.examples))


def first_call_prompt(tokenizer, question: str) -> str:
    """The prompt text the policy server renders for that call (line tool format)."""
    return render_prompt(tokenizer, first_call_messages(question), TOOLS, LINE)


def proxy_score(task: Task, completion: str) -> float:
    """1.0 when the first turn's calculator call (else its `#### n`) gives the reference answer."""
    _, calls = parse_tool_calls(completion, TOOLS, LINE)
    if not calls:
        return verify(task, completion)
    fn = calls[0]["function"]  # the server stops after the first call line
    if fn["name"] != "calculator":
        return 0.0
    try:
        value = calculate(json.loads(fn["arguments"]).get("expression", ""))
    except (ToolError, AttributeError, json.JSONDecodeError):
        return 0.0
    return verify(task, f"#### {value}")


def check_tokens(tokenizer, prompt: str, task: Task) -> None:
    """TRL tokenises a text prompt itself: it must give the policy server's token ids."""
    trl_ids = tokenizer(text=prompt)["input_ids"]
    server_ids = prompt_token_ids(tokenizer, first_call_messages(task.input), TOOLS, LINE)
    if list(trl_ids) != server_ids:
        raise RuntimeError("TRL's prompt tokens differ from the policy server's")


# -- held-out: greedy, batched, in-process ----------------------------------------------------------


def held_out(model, tokenizer, tasks: list[Task], max_tokens: int) -> tuple[list[int], list[int]]:
    """1/0 per task: (the first-turn proxy, the tutor's ReAct loop replayed here), greedy.

    The replay follows the graph: one call line per turn (the server stops there), the real
    calculator's observation as a `tool` turn, at most `max_steps` model calls, and the pack's
    verifier on the last reply.
    """
    threads = [first_call_messages(t.input) for t in tasks]
    final: list[str | None] = [None] * len(tasks)
    proxy: list[int] = []
    for turn in range(TUTOR.max_steps):
        live = [i for i, out in enumerate(final) if out is None]
        if not live:
            break
        texts = _greedy(model, tokenizer, [threads[i] for i in live], max_tokens)
        if turn == 0:
            proxy = [int(proxy_score(t, x) >= 1.0) for t, x in zip(tasks, texts, strict=True)]
        for i, text in zip(live, texts, strict=True):
            content, calls = parse_tool_calls(text, TOOLS, LINE)
            if not calls:
                final[i] = text
            elif turn == TUTOR.max_steps - 1:
                final[i] = BUDGET_NOTE
            else:
                threads[i] += _tool_turn(content, calls[0])
    return proxy, [int(verify(t, out or "") >= 1.0) for t, out in zip(tasks, final, strict=True)]


def _tool_turn(content: str | None, call: dict) -> list[dict]:
    fn = call["function"]
    result = asyncio.run(REGISTRY.call(fn["name"], fn["arguments"], call["id"]))
    said = {"content": content} if content else {}
    return [
        {"role": "assistant", **said, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": result.output},
    ]


def _greedy(model, tokenizer, threads: list[list[dict]], max_tokens: int, size: int = 16):
    """Greedy replies to chat threads, rendered as the policy server renders them."""
    out = []
    pad = tokenizer.pad_token_id
    for i in range(0, len(threads), size):
        ids = [prompt_token_ids(tokenizer, m, TOOLS, LINE) for m in threads[i : i + size]]
        width = max(len(p) for p in ids)
        batch = torch.tensor([[pad] * (width - len(p)) + p for p in ids])  # (B, T) left-padded
        attn = (torch.arange(width) >= torch.tensor([width - len(p) for p in ids])[:, None]).long()
        with torch.no_grad():
            seqs = model.generate(
                input_ids=batch,
                attention_mask=attn,
                do_sample=False,
                max_new_tokens=max_tokens,
                pad_token_id=pad,
                temperature=None,
                top_p=None,
                top_k=None,
            )
        out += tokenizer.batch_decode(seqs[:, width:], skip_special_tokens=True)  # (B, new)
    return out


# -- held-out: the gate's sampled form, in-process ---------------------------------------------------


def held_out_tasks(pack, n: int) -> list[Task]:
    """`n` held-out problems: the gate's stratified order over the pack's pool, a fixed draw."""
    pool = pack.tasks("eval")
    order = stratified_order([t.meta["kind"] for t in pool], draw_seed("bench"), limit=n)
    return [pool[i] for i in order]


def sampled(model, tokenizer, tasks: list[Task], k: int, temperature: float, max_tokens: int):
    """(tasks, k) 0/1: the first call sampled k times a task with the gate's seeds (the same
    for every policy), stopped after a call line as the server stops, scored by the proxy."""
    stop = call_stop_pattern(TOOLS, LINE)
    prompts, params = [], []
    for t in tasks:
        ids = prompt_token_ids(tokenizer, first_call_messages(t.input), TOOLS, LINE)
        for j in range(k):
            seed = sample_seed(f"tutoring/{t.id}", j, EVAL_DRAW)
            prompts.append(ids)
            params.append(
                SamplingParams(temperature, max_tokens=max_tokens, seed=seed, stop_line=stop)
            )
    done = generate(model, tokenizer, prompts, params, max_batch_size=16)
    scores = [
        int(proxy_score(t, done[i * k + j][0].text) >= 1.0)
        for i, t in enumerate(tasks)
        for j in range(k)
    ]
    return [scores[i * k : (i + 1) * k] for i in range(len(tasks))]


EVAL_DRAW = draw_seed("bench-samples")


def gain(base, other) -> dict:
    """The paired gain of `other` over `base` on the same (task, seed) outcomes: the mean
    per-task difference with its 95% interval (the gate's test at one look)."""
    r = sequential_test(base, other, (len(base),), margin=0.0)
    return {
        "base": r.champion_rate,
        "rate": r.candidate_rate,
        "diff": r.looks[-1].mean,
        "low": r.ci_low,
        "high": r.ci_high,
        "corr": r.correlation,
    }


# -- the run ------------------------------------------------------------------------------------------


def fmt_gain(x: dict) -> str:
    return f"{x['diff']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"


def summary(results: list[dict]) -> None:
    """Per run, and the mean gain over runs with a t interval (the spread of training)."""
    print("\n=== summary over runs (held-out, the gate's sampled form; 95% paired intervals)")
    print(f"{'draw':>4s} {'seed':>4s} {'base':>6s} {'arloop gain':>26s} {'TRL gain':>26s}")
    for r in results:
        print(
            f"{r['draw']:>4d} {r['seed']:>4d} {r['base']:6.0%} {fmt_gain(r['arloop']):>26s} "
            f"{fmt_gain(r['trl']):>26s}"
        )
    for name in ("arloop", "trl"):
        gains = [r[name]["diff"] for r in results]
        low, high = t_interval(gains)
        worse = sum(r[name]["high"] < 0 for r in results)
        better = sum(r[name]["low"] > 0 for r in results)
        print(
            f"{name:>6s}: mean gain {statistics.fmean(gains):+.3f} (95% t interval over "
            f"{len(gains)} runs {low:+.3f}..{high:+.3f}); significantly better than base in "
            f"{better}, worse in {worse}"
        )
    ahead = sum(r["gap"]["low"] > 0 for r in results)
    behind = sum(r["gap"]["high"] < 0 for r in results)
    gaps = [r["gap"]["diff"] for r in results]
    low, high = t_interval(gaps)
    loops = {k: statistics.fmean(r["loops"][k] for r in results) for k in results[0]["loops"]}
    print(
        f"arloop - TRL: mean paired difference {statistics.fmean(gaps):+.3f} (95% t interval "
        f"{low:+.3f}..{high:+.3f}); the whole loop replayed greedily, mean over runs: "
        + ", ".join(f"{k} {v:.0%}" for k, v in loops.items())
    )
    print(
        f"arloop vs TRL: ahead in {ahead}, behind in {behind}, no detectable difference in "
        f"{len(results) - ahead - behind}; verified reward evaluations per human event "
        f"(arloop): {statistics.fmean(r['per_human'] for r in results):.1f}; wall per run: "
        f"arloop {statistics.fmean(r['arloop_s'] for r in results):.0f} s (the demo's rounds incl. "
        f"their gates), TRL train() {statistics.fmean(r['trl_s'] for r in results):.0f} s"
    )


def t_interval(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return math.nan, math.nan
    half = T975[min(len(values) - 1, len(T975)) - 1] * statistics.stdev(values)
    half /= math.sqrt(len(values))
    mean = statistics.fmean(values)
    return mean - half, mean + half


T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)  # df 1..10


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def solved_rate(outcomes: list[int]) -> str:
    k, n = sum(outcomes), len(outcomes)
    low, high = wilson(k, n)
    return f"{k}/{n} = {k / n:.0%} [{low:.0%}, {high:.0%}]"


# -- the medical arm ------------------------------------------------------------------------------
