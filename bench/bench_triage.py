"""Triage with the default model: red flags escalated, answers returned, level accuracy, latency.

Starts Redis, `arloop serve policy` (the default model, SmolLM2-135M-Instruct, on this CPU)
and `arloop serve agents` (the medical pack) as a user would, then sends messages one at a time
over HTTP to `triage`: a subset of the pack's held-out cases (`--cases`, spread over the four
levels), of the probe messages written for this check and kept out of every training and
eval split (`agents/packs/data/triage_probe.jsonl`, `--probes`, spread over red flags,
negated red flags, floors, follow-up questions and the rest; `--probes all` runs every one)
and of the blind sets (`agents/packs/data/triage_heldout*.jsonl`, `--heldout`: messages
written from public guidance by someone who had not read the rules).
A probe that lacks what would change its level holds the patient's `reply`: when the agent
asks, the reply goes to the same thread and the case is judged on the answer to it (the
question counted as one more turn in the latency). Prints, per message and in total: the
level returned and the model's own (before the envelope or fallback), who answered, red
flags escalated (by what the user got, and by the model itself), non-emergencies sent to
emergency, negated red flags escalated by the rules, questions asked (by the model, by the
rules), the fallback's levels, answers returned that fail the pack's checks (must be 0),
level accuracy (overall and of the model's own answers) and latency p50/p95 per turn and per
case.

The peer, in the same run on the first `--peer` messages, each right after the agent's own
run of it (this machine is shared: both meet the same load): the triage agent as it was
before this pack had generation settings (the server's temperature 1.0, 512 tokens a call,
three 600-character passages, no stop at the `Triage:` line, retries on red flags too), run
through the same policy server. Also printed: the policy server's CPU seconds per run (both
cores), a figure less sensitive than wall time to what else the machine runs.

`--checkpoint DIR` serves a trained version instead of the base model: a checkpoint folder a
demo or the learner published (`<data dir>/checkpoints/vN`, with the level head it carries),
registered as v1 and made champion before the agent API starts, so the agent's replies take
that version's words and its head's level as users would get them.

    .venv/bin/python bench/bench_triage.py [--cases 6] [--probes 12|all] [--heldout 0|all]
        [--peer 3] [--threads 1] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx
import redis
import redis.asyncio as aioredis

from agents.events import STREAM_TRAJECTORIES, TrajectoryEvent, decode
from agents.packs.medical import KB_DIR, check, triage
from agents.packs.triage_cases import cases
from agents.packs.triage_rules import rules
from agents.policy_client import PolicyConfig
from agents.runtime import AgentRuntime
from deploy.demo.stack import Stack
from learner.policy.registry import PolicyRegistry, PolicyVersion
from tools.kb_search import KbSearch
from tools.verifiers import LEVELS, triage_level

PROBE_FILE = ROOT / "agents" / "packs" / "data" / "triage_probe.jsonl"
HELDOUT_FILES = sorted((ROOT / "agents" / "packs" / "data").glob("triage_heldout*.jsonl"))
"""Messages written from public guidance by someone who had not read the rules (`--heldout`);
each set was blind when written, and the rules were improved on it afterwards (see the docs)."""
KEY = "bench-key"


@dataclass(frozen=True)
class Message:
    source: str  # eval | probe
    id: str
    text: str
    level: str
    red_flag: bool
    negated: bool
    reply: str | None = None  # the patient's answer to a follow-up question


@dataclass
class Result:
    message: Message
    seconds: float
    server_cpu_s: float  # CPU time the policy server spent on it (both cores)
    output: str
    status: str
    answered_by: str
    model_level: str | None
    model_escalated: bool | None
    failed_checks: list[str]
    attempts: int
    model_passed: bool
    turns: list[float]  # seconds of each turn (a follow-up question adds one)
    asked_by: str | None  # model | rules | None: who asked the follow-up question
    fallback_level: str | None
    head_level: str | None = None  # the served version's level head's, where it has one


def spread(items: list, key, n: int) -> list:
    """`n` items taking each group in turn (round robin over `key`), in file order within one."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    out, i = [], 0
    while len(out) < min(n, len(items)):
        for g in groups.values():
            if i < len(g) and len(out) < n:
                out.append(g[i])
        i += 1
    return out


def messages(n_cases: int, n_probes: int, n_heldout: int = 0) -> list[Message]:
    held = [
        Message("eval", c.id, c.message, c.level, c.red_flag, False)
        for c in sorted(cases("eval"), key=lambda c: c.id)
        if c.level != "ask"  # no reply to give: the probes' follow-up cases carry one
    ]
    probes = [json.loads(line) for line in PROBE_FILE.read_text().splitlines() if line.strip()]
    probe = [
        Message(
            "probe",
            p["id"],
            p["message"],
            p["level"],
            p["red_flag"],
            "negated" in p["kinds"],
            p.get("reply"),
        )
        for p in probes
    ]
    kind = lambda m: "red" if m.red_flag else "negated" if m.negated else "other"  # noqa: E731
    blind = [
        json.loads(line)
        for path in HELDOUT_FILES
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    written = [
        Message("held", b["id"], b["message"], b["level"], b["level"] == "emergency", False)
        for b in blind
    ]
    return (
        spread(held, lambda m: m.level, n_cases)
        + spread(probe, kind, n_probes)
        + spread(written, lambda m: m.level, n_heldout)
    )


def run_all(stack: Stack, chosen: list[Message], n_peer: int) -> tuple[list[Result], list[float]]:
    """Each message through the agent API; the first `n_peer` also through the peer, right
    after, so both meet the same load on this shared machine."""
    checks = check()
    trajectories = redis.Redis.from_url(stack.redis.url)
    server = next(p.process.pid for p in stack.procs if p.name == "policy")
    peer = Peer(stack)
    out, peer_seconds = [], []
    with httpx.Client(base_url=stack.agents_url, timeout=1800) as http:
        warm = {"input": "I have a cold.", "user_id": "warm-up"}  # loads the PHI scrubber
        http.post("/v1/agents/triage/runs", json=warm, headers={"Authorization": f"Bearer {KEY}"})
        for i, m in enumerate(chosen):
            start, cpu = time.perf_counter(), cpu_seconds(server)
            body = {"input": m.text, "user_id": f"bench{i}"}
            answer, turns = turn(http, body), []
            t = trajectory(trajectories, answer["trajectory_id"])
            turns.append(time.perf_counter() - start)
            asked_by, case = t.metadata.get("arloop.asked_by"), m.text
            if asked_by and m.reply:  # the patient answers the question on the same thread
                again = time.perf_counter()
                label = next(a.label for a in rules().asks if a.fact == t.metadata["arloop.asked"])
                case = f"{m.text}\n{label}: {m.reply}"
                body |= {"input": m.reply, "thread_id": answer["thread_id"]}
                answer = turn(http, body)
                t = trajectory(trajectories, answer["trajectory_id"])
                turns.append(time.perf_counter() - again)
            seconds, cpu = time.perf_counter() - start, cpu_seconds(server) - cpu
            escalated = t.metadata.get("arloop.model_escalated")
            result = Result(
                m,
                seconds,
                cpu,
                answer["output"],
                answer["status"],
                answer["answered_by"],
                triage_level(t.model_answer),
                None if escalated is None else escalated == "true",
                [] if asked_by and len(turns) == 1 else checks.problems(case, answer["output"]),
                int(t.metadata.get("arloop.attempts", "1")),
                t.metadata.get("arloop.model_checks") == "pass",
                turns,
                asked_by,
                t.metadata.get("arloop.fallback_level"),
                t.metadata.get("arloop.decision.level") or None,
            )
            out.append(result)
            print(row(result), flush=True)
            if i < n_peer:
                peer_seconds.append(peer.run(m, i))
    peer.close()
    return out, peer_seconds


def turn(http: httpx.Client, body: dict) -> dict:
    r = http.post("/v1/agents/triage/runs", json=body, headers={"Authorization": f"Bearer {KEY}"})
    r.raise_for_status()
    return r.json()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def trajectory(client: redis.Redis, trajectory_id: str) -> TrajectoryEvent:
    for _, fields in client.xrevrange(STREAM_TRAJECTORIES, count=50):
        event = decode(fields)
        if isinstance(event, TrajectoryEvent) and event.event_id == trajectory_id:
            return event
    raise LookupError(f"trajectory {trajectory_id} not on {STREAM_TRAJECTORIES}")


class Peer:
    """The agent as it was: no generation settings, long passages, the process's 512 tokens."""

    def __init__(self, stack: Stack) -> None:
        old = replace(
            triage(), generation=None, retry_when=None, guard=None, tools=(KbSearch(KB_DIR),)
        )
        self.loop = asyncio.new_event_loop()
        self.client = aioredis.from_url(stack.redis.url)
        policy = PolicyConfig("openai/arloop", stack.policy_url, "none", 1800.0, 0, max_tokens=512)
        self.runtime = AgentRuntime.on_redis(self.client, [old], policy)

    def run(self, m: Message, i: int) -> float:
        start = time.perf_counter()
        event = self.loop.run_until_complete(self.runtime.run("triage", m.text, f"peer{i}"))
        seconds = time.perf_counter() - start
        print(f"  {'  peer':<21} got {str(triage_level(event.output)):<12} {seconds:6.1f} s")
        return seconds

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


def row(r: Result) -> str:
    said = triage_level(r.output)
    flag = "RED " if r.message.red_flag else "neg " if r.message.negated else "    "
    return (
        f"  {r.message.id:<16} {flag} want {r.message.level:<12} got {str(said):<12} "
        f"model {str(r.model_level):<12} "
        + (f"head {r.head_level:<12} " if r.head_level else "")
        + f"{r.answered_by:<9} {r.seconds:6.1f} s"
        + (f" asked by {r.asked_by} ({len(r.turns)} turns)" if r.asked_by else "")
        + f" (server CPU {r.server_cpu_s:5.1f} s, {r.attempts} attempt{'s' * (r.attempts > 1)})"
        + (f"  FAILED: {r.failed_checks}" if r.failed_checks else "")
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(results: list[Result], peer: list[float]) -> dict:
    red = [r for r in results if r.message.red_flag]
    emergencies = [r for r in results if r.message.level == "emergency"]
    others = [r for r in results if r.message.level != "emergency"]
    neg = [r for r in results if r.message.negated]
    own = [r for r in results if r.answered_by == "model" and triage_level(r.output)]
    seconds = [r.seconds for r in results]
    out = {
        "messages": len(results),
        "emergencies": len(emergencies),
        "emergencies_escalated": sum(triage_level(r.output) == "emergency" for r in emergencies),
        "non_emergencies": len(others),
        "non_emergencies_sent_to_emergency": sum(
            triage_level(r.output) == "emergency" for r in others
        ),
        "level_accuracy": _share([triage_level(r.output) == r.message.level for r in results]),
        "model_answers_returned": len(own),
        "model_answers_level_accuracy": _share(
            [triage_level(r.output) == r.message.level for r in own]
        ),
        "model_level_accuracy": _share([r.model_level == r.message.level for r in results]),
        "head_levels": sum(r.head_level is not None for r in results),
        "head_level_accuracy": _share(
            [r.head_level == r.message.level for r in results if r.head_level is not None]
        ),
        "questions_asked": {k: sum(r.asked_by == k for r in results) for k in ("model", "rules")},
        "fallback_levels": {
            level: sum(r.fallback_level == level for r in results) for level in LEVELS
        },
        "red_flags": len(red),
        "red_flags_escalated": sum(triage_level(r.output) == "emergency" for r in red),
        "red_flags_escalated_by_model": sum(bool(r.model_escalated) for r in red),
        "negated": len(neg),
        "negated_escalated_by_rules": sum(r.answered_by == "envelope" for r in neg),
        "failed_answers_returned": sum(bool(r.failed_checks) for r in results),
        "model_answers_passing_checks": sum(r.model_passed for r in results),
        "passed_after_a_retry": sum(r.model_passed and r.attempts > 1 for r in results),
        "answered_by": {
            k: sum(r.answered_by == k for r in results) for k in ("model", "envelope", "fallback")
        },
        "p50_s": statistics.median(seconds),
        "p95_s": pct(seconds, 0.95),
        "turn_p50_s": statistics.median(t for r in results for t in r.turns),
        "turn_p95_s": pct([t for r in results for t in r.turns], 0.95),
        "server_cpu_p50_s": statistics.median(r.server_cpu_s for r in results),
    }
    if peer:
        out |= {
            "peer_messages": len(peer),
            "peer_p50_s": statistics.median(peer),
            "peer_p95_s": pct(peer, 0.95),
        }
        out["p50_ratio_to_peer"] = out["p50_s"] / out["peer_p50_s"]
    return out


def _share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else float("nan")


def serve_checkpoint(redis_url: str, folder: Path) -> str:
    """Register a published checkpoint folder as the champion of a fresh registry; its version."""
    manifest = json.loads((folder / "manifest.json").read_text())
    registry = PolicyRegistry(redis.Redis.from_url(redis_url))
    base = registry.ensure_base(manifest["base_model"])
    version = registry.next_version()
    record = PolicyVersion(
        version=version,
        parent=base.version,
        base_model=manifest["base_model"],
        checkpoint_uri=folder.resolve().as_uri(),
        checkpoint_kind=manifest["kind"],
        metrics=manifest.get("metrics", {}),
    )
    registry.publish(record)
    registry.promote(version, expect=base.version, reason="bench", actor="bench")
    return version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=6, help="held-out cases (spread over levels)")
    parser.add_argument(
        "--probes",
        type=lambda v: 10**6 if v == "all" else int(v),
        default=12,
        help="probe messages (spread over kinds), or all",
    )
    parser.add_argument(
        "--heldout",
        type=lambda v: 10**6 if v == "all" else int(v),
        default=0,
        help="messages of the blind held-out set (spread over levels), or all",
    )
    parser.add_argument("--peer", type=int, default=3, help="messages the peer runs (0: none)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of the policy server (ARLOOP_THREADS; 1 is best on a shared CPU)",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="serve this published checkpoint folder (e.g. a demo's <data dir>/checkpoints/v2, "
        "its level head included) as the champion instead of the base model",
    )
    parser.add_argument("--json", type=Path, help="also write the summary here")
    opts = parser.parse_args()
    if opts.checkpoint and not (opts.checkpoint / "manifest.json").is_file():
        parser.error(f"--checkpoint {opts.checkpoint}: no manifest.json there (not a checkpoint)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stack on a kill too
    chosen = messages(opts.cases, opts.probes, opts.heldout)
    assert all(m.level in LEVELS for m in chosen)
    with tempfile.TemporaryDirectory(prefix="arloop-bench-triage-") as tmp:
        stack = Stack(
            Path(tmp),
            env={
                "policy": {"ARLOOP_THREADS": str(opts.threads)},
                "agents": {
                    "ARLOOP_PACKS": '["medical"]',
                    "ARLOOP_API_KEYS": json.dumps([KEY]),
                    "ARLOOP_POLICY_TIMEOUT_S": "1800",
                    "ARLOOP_RUN_RATE_PER_MINUTE": "1000",
                },
            },
        )
        try:
            stack.start_redis()
            if opts.checkpoint:
                served = serve_checkpoint(stack.redis.url, opts.checkpoint)
                print(f"serving {opts.checkpoint} as {served}, the champion", flush=True)
            stack.env["agents"]["ARLOOP_POLICY_API_BASE"] = stack.policy_url
            stack.start(("policy", "agents"))
            print(
                "starting the policy server (the default model) and the agent API ...", flush=True
            )
            stack.wait_ready(600)
            print(f"{len(chosen)} messages through the agent API, one at a time:", flush=True)
            results, peer = run_all(stack, chosen, opts.peer)
        finally:
            stack.stop()
    figures = summary(results, peer) | {
        "load_average_1m": os.getloadavg()[0],
        "checkpoint": opts.checkpoint.name if opts.checkpoint else "base",
    }
    print(json.dumps(figures, indent=1))
    if opts.json:
        opts.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
