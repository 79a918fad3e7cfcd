"""The demo's closing measurement: the final champion against v0, by the gate's own test.

With the demo's gate settings: the sequential test on sampled, coupled runs, run on until
"improved" is settled, gives the difference and its repeated 95% interval, and whole runs
through the agent at the serving temperature give what users would see. By default
(`final_draw="gates"`) on v0's draw, the draw of every demo gate: both versions' runs come
from Redis as far as their gates went, so the first look costs nothing; but the gates chose
what to release on those tasks. `final_draw="unseen"` runs it on held-out tasks no gate ran,
both versions afresh (30-50 s more on 2 cores); in 8 demo runs the two gave the same v2s
+0.006 apart on average (docs: Figures). Where the pool holds fewer unseen tasks than the
test's first look (the quick demo's 12, the medical pack's 60 against its gates' 48), it runs
on the gates' own, and the report says which.
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
from learner.policy.registry import BASE_VERSION, CHAMPION, PolicyRegistry, version_number


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
    draw: str = "gates",
) -> dict[str, Any] | None:
    """The final champion vs v0 (`report.comparison`'s figures, and which tasks: `draw`);
    None when v0 is still champion. `config`: the learner's gate settings (the same draw,
    seeds and cache entries); `draw`: "unseen" or "gates" (the module's text)."""
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
        unseen_by = unseen_champions(gate, registry, final) if draw == "unseen" else ()
        evaluation = gate.run(final, BASE_VERSION, guards=False, unseen_by=unseen_by)
    test = sequential_summary(evaluation.test, config)
    tasks = "unseen" if unseen_by else "gates"
    return comparison(BASE_VERSION, final, test, evaluation.episodes) | {"draw": tasks}


def unseen_champions(gate: GateRunner, registry: PolicyRegistry, final: str) -> list[str]:
    """The versions whose gates' tasks the final check leaves out (every version before
    `final`: each gate drew from one of them); [] when fewer tasks than the test's first look
    would be left (the check then runs on the gates' own)."""
    last = version_number(final) or 0
    earlier = [v.version for v in registry.versions() if (version_number(v.version) or 0) < last]
    order, _ = gate.order(gate.suite.pool(), final, BASE_VERSION, earlier)
    return earlier if len(order) >= min(gate.config.looks) else []
