"""The demo's closing measurement: the final champion against v0, by the gate's own test.

Run on v0's draw, the draw of every demo gate (`fresh_draw` off), with the demo's gate
settings, so both versions' runs come from Redis as far as their gates went, and only the
samples and tasks beyond them cost anything: the sequential test on sampled, coupled runs,
run on until "improved" is settled, gives the difference and its repeated 95% interval, and
whole runs through the agent at the serving temperature give what users would see.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from agents.packs.base import Pack
from agents.policy_client import PolicyConfig
from deploy.demo.report import comparison
from deploy.demo.stack import Stack
from deploy.learn.agent_runs import agent_suite
from learner.gate.eval_gate import GateConfig, sequential_summary
from learner.gate.runner import GateRunner
from learner.policy.registry import BASE_VERSION, CHAMPION, PolicyRegistry


def final_comparison(
    stack: Stack,
    registry: PolicyRegistry,
    pack: Pack,
    config: GateConfig,
    *,
    temperature: float,
    max_tokens: int,
    concurrency: int,
    console: Console,
) -> dict[str, Any] | None:
    """The final champion vs v0 (`report.comparison`'s figures); None when v0 is still champion.
    `config`: the learner's gate settings (the same draw, seeds and cache entries)."""
    final = registry.resolve(CHAMPION)
    if final == BASE_VERSION:
        return None
    policy = PolicyConfig(
        model="openai/arloop",
        api_base=stack.policy_url,
        api_key="none",
        retries=1,
        temperature=0.0,
        max_tokens=max_tokens,
    )
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console
    ) as bar:
        task = bar.add_task(f"final check: {final} vs {BASE_VERSION}", total=None)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(task, description=f"final check: {what}", completed=done, total=total)

        suite = agent_suite(
            stack.redis.url,
            [pack],
            policy,
            temperature,
            concurrency=concurrency,
            solved_at=config.solved_at,
            progress=progress,
        )
        gate = GateRunner(registry, suite, config)
        evaluation = gate.run(final, BASE_VERSION, guards=False)
    test = sequential_summary(evaluation.test, config)
    return comparison(BASE_VERSION, final, test, evaluation.episodes)
