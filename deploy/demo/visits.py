"""One demo visit: the simulated students use the agent API, then the demo waits for the
learning round their feedback starts, and for its gate ("round" is the learner's word).

The learner starts a round once `min_episodes` runs have feedback (the demo makes exactly that
many users speak up per round), trains, publishes a READY version, and its eval gate judges
it against the champion: pass makes it champion (the policy server reloads it before the next
round's traffic), reject leaves the champion as it was.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agents.packs.base import Pack, Task
from deploy.demo.stack import Stack, StackError
from deploy.demo.users import AgentClient, Behaviour, Visit, run_traffic
from learner.gate.eval_gate import ERROR
from learner.policy.registry import CHAMPION, PolicyRegistry, version_number


@dataclass
class VisitRecord:
    """What one visit and the round after it did, and how long each phase took."""

    round: int
    served_by: str
    visits: list[Visit]
    version: str | None = None
    verdict: str | None = None
    reason: str = ""
    seconds: dict[str, float] = field(default_factory=dict)


def visit_tasks(train: list[Task], problems: int, group: int, rng: random.Random) -> list[Task]:
    """`problems` training tasks, each brought by `group` users (the learner's prompt groups).

    The problems are spread evenly over the kinds (`meta["kind"]`: add, sub, ...): with a
    handful of groups a round, a draw that happens to be mostly one kind teaches that kind's
    operator everywhere (the tutor then writes `-` for products too).
    """
    kinds: dict[str, list[Task]] = {}
    for t in train:
        kinds.setdefault(t.meta.get("kind", ""), []).append(t)
    names = sorted(kinds)
    rng.shuffle(names)
    share = [names[i % len(names)] for i in range(problems)]
    chosen = [t for name in names for t in rng.sample(kinds[name], share.count(name))]
    rng.shuffle(chosen)
    return [t for t in chosen for _ in range(group)]


def traffic(
    stack: Stack,
    api_key: str,
    pack: Pack,
    tasks: list[Task],
    behaviour: Behaviour,
    *,
    users: int,
    quiet: int,
    seed: int,
    console: Console,
    label: str,
) -> list[Visit]:
    """The round's visits, `users` at a time, with a progress bar; exactly `quiet` stay silent."""
    silent = set(random.Random(f"quiet/{seed}").sample(range(len(tasks)), quiet))
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[line]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(label, total=len(tasks), line="")
        done: list[Visit] = []

        def seen(v: Visit) -> None:
            done.append(v)
            ok = sum(x.verdict.score >= 1.0 for x in done)
            progress.update(bar, advance=1, line=f"solved {ok}/{len(done)}")

        async def go() -> list[Visit]:
            client = AgentClient(stack.agents_url, api_key)
            try:
                return await run_traffic(
                    client,
                    pack,
                    tasks,
                    behaviour,
                    concurrency=users,
                    seed=seed,
                    prefix=f"r{seed}",
                    silent=silent,
                    on_visit=seen,
                )
            finally:
                await client.aclose()

        return asyncio.run(go())


def wait_for_verdict(
    stack: Stack,
    registry: PolicyRegistry,
    after: int,
    timeout_s: float,
    console: Console,
    label: str,
) -> tuple[str, dict]:
    """(version, gate report) of the first version numbered above `after` with a final verdict."""
    deadline = time.monotonic() + timeout_s
    with console.status(label) as status:
        while time.monotonic() < deadline:
            stack.check_alive()
            newer = [r for r in registry.versions() if (version_number(r.version) or 0) > after]
            report = newer[0].report if newer else None
            if report and report.get("verdict") not in (None, ERROR):
                return newer[0].version, report
            phase = "training" if not newer else f"eval gate on {newer[0].version}"
            status.update(f"{label}: {phase} ... {_last_line(stack)}")
            time.sleep(0.5)
    raise StackError(f"no gated version after {timeout_s:.0f} s: see {stack.logs}/learn.log")


def wait_for_serving(stack: Stack, version: str, timeout_s: float, console: Console) -> None:
    """Until the policy server serves `version` as champion (it reloads on the alias move)."""
    deadline = time.monotonic() + timeout_s
    with console.status(f"policy server loading {version} ..."):
        while time.monotonic() < deadline:
            stack.check_alive()
            if _serving(stack).get(CHAMPION) == version:
                return
            time.sleep(0.3)
    raise StackError(f"the policy server did not switch to {version}: see {stack.logs}/policy.log")


def _serving(stack: Stack) -> dict[str, str]:
    try:
        return httpx.get(f"{stack.policy_url[:-3]}/healthz", timeout=2).json().get("serving", {})
    except (httpx.HTTPError, ValueError):
        return {}


def _last_line(stack: Stack) -> str:
    lines = [p.tail(3).splitlines() for p in stack.procs if p.name == "learn"]
    last = [line.strip() for line in (lines[0] if lines else []) if line.strip()]
    return last[-1][:90] if last else ""


def timed(seconds: dict[str, float], name: str, fn: Callable, *args, **kwargs):
    """Run `fn`, adding its wall time to `seconds[name]`."""
    start = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.monotonic() - start
