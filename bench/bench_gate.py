"""One eval gate on the default model with the champion's runs cached, and the same candidate
judged by the old gate.

Takes the data folder of a finished `make demo` (its Redis with the registry and the eval
cache, its checkpoints), copies it, and starts its Redis and a policy server on the copy, as
the demo does. Then, for `--candidate` against `--champion`:

1. **The gate** (`GateRunner.evaluate`, the learner's settings as the demo sets them, or
   `arloop learn`'s defaults with `--learn-defaults`), after the candidate's cached outcomes
   are forgotten: the champion's runs come from the cache, the candidate's are computed. The
   wall time per phase (sampled looks, whole runs and guard runs, the models' figures), the
   looks, the decision and the measured seed correlation.
2. **The old gate** (before issue 14): greedy whole runs of both versions on 40 held-out
   tasks (the first 40 of the same draw), passed unless an exact one-sided McNemar test finds
   the candidate worse at p < 0.05.

    .venv/bin/python bench/bench_gate.py [--data-dir .arloop/demo-<time>] [--candidate v2]
        [--champion v0] [--learn-defaults] [--export]

With `--export` the candidate's llama.cpp export is deleted first, so the policy server makes
it on the candidate's first request, as it does in the demo.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis

from agents.events import EVAL_CACHE_PREFIX
from deploy.demo.options import DemoOptions, stack_env
from deploy.demo.stack import Stack, StackError
from deploy.learn.agent_runs import gate_runner
from deploy.learn.settings import LearnerSettings
from learner.gate.draws import draw_seed, stratified_order
from learner.gate.stats import paired_comparison
from learner.policy.registry import PolicyRegistry
from learner.store import Store

OLD_TASKS = 40
OLD_ALPHA = 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="a finished demo's folder (default: the newest .arloop/demo-*)",
    )
    parser.add_argument("--candidate", default="v2")
    parser.add_argument("--champion", default="v0")
    parser.add_argument(
        "--learn-defaults",
        action="store_true",
        help="`arloop learn`'s gate (looks 40/80/120, run until both questions are settled) "
        "instead of the demo's (24/48, stopping once the release is decided)",
    )
    parser.add_argument(
        "--concurrency", type=int, help="eval runs in flight (default: the demo's setting)"
    )
    parser.add_argument(
        "--llamacpp-threads", type=int, help="the policy server's (default: the demo's)"
    )
    parser.add_argument(
        "--max-batch", type=int, help="the policy server's rows per step (default: the demo's)"
    )
    parser.add_argument(
        "--export",
        action="store_true",
        help="forget the candidate's llama.cpp export too, so the policy server exports it on "
        "its first request, as in the demo (default: the cached export is loaded)",
    )
    opts = parser.parse_args()
    if opts.data_dir is None:
        demos = sorted((ROOT / ".arloop").glob("demo-*/redis"))
        if not demos:  # `make bench` runs every bench: this one needs a demo first
            print("bench_gate: skipped, no demo data folder in .arloop/: run `make demo` first")
            return
        opts.data_dir = demos[-1].parent
    if not (opts.data_dir / "redis").is_dir():
        sys.exit(f"{opts.data_dir} is not a demo's data folder (no redis/ in it): run make demo")
    work = Path(tempfile.mkdtemp(prefix="arloop-bench-gate-")) / "data"
    shutil.copytree(opts.data_dir, work, ignore=shutil.ignore_patterns("port", "*.sock"))
    demo = DemoOptions()
    stack = Stack(work, stack_env(demo, "unused"))
    if opts.llamacpp_threads:
        stack.env["policy"]["ARLOOP_LLAMACPP_THREADS"] = str(opts.llamacpp_threads)
    if opts.max_batch:
        stack.env["policy"]["ARLOOP_MAX_BATCH_SIZE"] = str(opts.max_batch)
    url = stack.start_redis()
    try:
        if opts.export:
            print(f"export forgotten: {_forget_export(url, opts.candidate) or 'none was cached'}")
        stack.start(("policy",))
        learn_env = stack_env(demo, stack.policy_url)["learn"]
        if opts.learn_defaults:
            learn_env = {k: v for k, v in learn_env.items() if not k.startswith("ARLOOP_GATE__")}
        if opts.concurrency:
            learn_env["ARLOOP_EVAL_CONCURRENCY"] = str(opts.concurrency)
        os.environ.update(learn_env | {"ARLOOP_REDIS_URL": url, "ARLOOP_DATA_DIR": str(work)})
        settings = LearnerSettings()
        try:
            stack.wait_ready(300)
        except StackError as exc:
            sys.exit(f"bench_gate: {exc}")
        client = redis.Redis.from_url(url)
        registry = PolicyRegistry(client)
        candidate, champion = registry.resolve(opts.candidate), registry.resolve(opts.champion)
        forgotten = client.hlen(EVAL_CACHE_PREFIX + candidate)
        client.delete(EVAL_CACHE_PREFIX + candidate)
        print(
            f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}; {candidate} "
            f"against {champion} ({client.hlen(EVAL_CACHE_PREFIX + champion)} cached outcomes "
            f"of {champion}; {forgotten} of {candidate} forgotten)"
        )
        store_path = work / "learner" / "store.db"
        store = Store(store_path) if store_path.exists() else None
        gate = gate_runner(settings, url, registry, store)
        start = time.perf_counter()
        report = gate.evaluate(candidate, champion)
        seconds = time.perf_counter() - start
        print(report.summary())
        phases = ", ".join(f"{k} {v:.0f} s" for k, v in report.seconds.items())
        print(f"\nTHE GATE: {report.verdict} in {seconds:.0f} s wall ({phases})")

        start = time.perf_counter()
        pool = gate.suite.pool()
        order = stratified_order([i.stratum for i in pool], draw_seed(champion, gate.suite.name))
        items = [pool[i] for i in order[:OLD_TASKS]]
        greedy = [None] * len(items)
        old = {v: gate.suite.runs.episodes(v, items, greedy, 0.0)[0] for v in (champion, candidate)}
        cmp = paired_comparison(
            [int(o.solved) for o in old[champion]], [int(o.solved) for o in old[candidate]]
        )
        verdict = "REJECT (worse)" if cmp.p_worse < OLD_ALPHA else "PASS (not found worse)"
        print(
            f"THE OLD GATE ({OLD_TASKS} greedy whole runs, one-sided McNemar at "
            f"{OLD_ALPHA}): {champion} {cmp.champion_rate:.0%} -> {candidate} "
            f"{cmp.candidate_rate:.0%}, diff {cmp.diff:+.3f} (95% CI {cmp.ci_low:+.3f}.."
            f"{cmp.ci_high:+.3f}), p(worse) {cmp.p_worse:.3f}: {verdict}; "
            f"{time.perf_counter() - start:.0f} s (greedy runs cached where the guards ran them)"
        )
        if store is not None:
            store.close()
    finally:
        stack.stop()
        shutil.rmtree(work.parent, ignore_errors=True)  # the copy: Redis, store, checkpoints


def _forget_export(url: str, version: str) -> str:
    """Delete the candidate's cached GGUF (the default cache, the server's quantisation)."""
    from deploy.policy_server.llamacpp.loader import LlamaLoader
    from deploy.policy_server.settings import PolicyServerSettings

    settings = PolicyServerSettings()
    loader = LlamaLoader(
        cache_dir=settings.model_cache, quant=settings.llamacpp_quant, slots=1, threads=1
    )
    registry = PolicyRegistry(redis.Redis.from_url(url))
    record = registry.get(registry.resolve(version))
    path = loader.gguf_path(record)
    if not path.exists():
        return ""
    path.unlink()
    return path.name


if __name__ == "__main__":
    main()
