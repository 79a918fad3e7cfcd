"""What `arloop demo` sets up: its options, the gate it runs, and each process's settings.

`DemoOptions` is what `arloop demo --help` offers; `stack_env` turns it into the `ARLOOP_*`
variables of the policy server, the agent API and the learner (`deploy/demo/run.py` starts
them and runs the rounds). The demo's gate (`DEMO_GATE`, `FINAL_CHECK`) is smaller than
`arloop learn`'s, sized for its minutes, with the error rates that buys.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from agents.packs.base import Pack

API_KEY = "demo-" + secrets.token_hex(8)


@dataclass(frozen=True)
class DemoOptions:
    """What `arloop demo --help` offers; the defaults take 6-7.5 minutes on 2 cores."""

    rounds: int = 2
    users: int = 8
    """Simulated users talking to the agent API at once."""
    episodes: int = 32
    """Runs (visits) per round; `group` users bring the same problem."""
    group: int | None = None
    """Users who bring the same problem; None: the pack's (`GROUPS`)."""
    eval_size: int = 480
    """Held-out problems the gates draw from (their looks: up to 48 of them, sampled 6 times;
    `final_draw="unseen"`: the final check from the rest)."""
    model: str = "smollm2"
    pack: str = "tutoring"
    """The pack whose agents the users talk to and the gate judges: `tutoring` (students) or
    `medical` (patients)."""
    seed: int = 0
    """Seeds the users' sampling and feedback noise (and, unless `draw` is set, the problems)."""
    draw: int | None = None
    """Seeds which training problems the students bring; None: `seed` (one knob for both)."""
    report_dir: Path = Path("reports")
    data_dir: Path | None = None
    """Default: a fresh `.arloop/demo-<time>`."""
    temperature: float = 0.7
    """Sampling temperature of the served policy; the gate samples alike (what users get)."""
    max_tokens: int = 32
    threads: int | None = None
    """torch and llama.cpp threads of the policy server and of the learner: traffic, training
    and the gate take turns, so each may use every free core while it works. None: the cores
    idle when the demo starts, at most `MAX_THREADS` (`free_threads`)."""
    silence: float = 0.1
    noise: float = 0.05
    closing_visit: bool = True
    """After the last round, the learner stops and one more round of students visits the
    final champion: its thumbs-up rate is measured on the same traffic as the others'."""
    learning_rate: float = 2e-4
    kl_coef: float = 0.04
    phase_timeout_s: float = 900.0
    gate_samples: int = 6
    """Samples of each held-out task in a round's gate and in the final check (`DEMO_GATE`)."""
    subrounds: int = 2
    """The learner's verified sub-rounds a round (`ARLOOP_ROUND__SUBROUNDS`): fewer than
    `arloop learn`'s default, so that the demo ends within 7 minutes on 2 cores."""
    resample_n: int = 4
    """Runs of each labelled prompt a sub-round (`ARLOOP_ROUND__RESAMPLE_N`); fewer than
    `arloop learn`'s default, as `subrounds`."""
    hint_n: int = 0
    """Hinted runs of a labelled prompt none of whose runs solved it, a sub-round
    (`ARLOOP_ROUND__HINT_N`; 0, `arloop learn`'s default: no hints)."""
    fresh_draw: bool = False
    """Whether each round's gate draws its own held-out tasks from its champion, as `arloop
    learn` does by default (`ARLOOP_GATE__FRESH_DRAW`). Off, every gate runs v0's draw:
    round 2's gate finds v1's runs cached from round 1's (it was the candidate there), and
    the final check (`final_draw="gates"`) finds v2's from round 2's. The learning bench turns it
    on, as it was measured."""
    final_draw: Literal["unseen", "gates"] = "gates"
    """Which held-out tasks the final check (v2 against v0) runs: "gates", v0's draw, where
    both versions' runs come from the gates' cache, or "unseen", tasks no gate ran (free of
    the choice the gates made; both versions run them afresh, 30-50 s more on 2 cores; the
    two measured +0.006 apart on the same v2s in 8 runs). Unseen falls back to the gates'
    tasks where the pool leaves fewer than the test's first look (`deploy.demo.compare`)."""


DEMO_GATE: dict[str, Any] = {
    # a smaller gate than `arloop learn`'s (looks at 40/80/120 tasks, 8 samples a task, 40
    # whole runs, 24 guard runs), sized for the demo's minutes: 6 samples a task, a quarter
    # fewer runs than 8, where a truly equal candidate still passes about 66 % of the time
    # (77 % with 8) and a true 10-point regression 0.1 % (tests/learner/gate/test_sequential.py
    # simulates them; in six demo runs the first 6 of 8 samples gave all 12 gates the release
    # decision the 8 gave). Each gate stops once "not worse" is settled (the release decision
    # is the same); "improved" is settled by the final check, v2 against v0.
    "looks": [24, 48],
    "full_tasks": 8,
    "guard_tasks": 8,
    "stop_when_released": True,
    "ope_max_runs": 64,
}
"""The learner's gate settings (`ARLOOP_GATE__*`) in the demo, with `DemoOptions.gate_samples`;
its final check uses them too."""
FINAL_CHECK = DEMO_GATE | {"stop_when_released": False}
"""The final check: a demo gate's test and whole runs, run on until "improved" is settled, on
the tasks `DemoOptions.final_draw` names: the gates' samples a task (6: a true 20-point gain
shows "improved" at its first look 76 % of the time and by the last look always,
`tests/learner/gate/test_sequential.py`; on the gates' own tasks that first look is their
cached runs), and 8 whole runs give the users' view."""


GROUPS = {"tutoring": 4, "medical": 1}
"""Users per problem by pack: students in fours (the learner's prompt groups); every patient
with a case of their own, so the clinic's dispositions label distinct messages (the level
head learns from distinct cases: 8 cases labelled 4 times teach it what 8 labels do)."""


MAX_THREADS = 2
"""The most threads the demo picks by itself: what its minutes were measured with (2 cores)."""


def free_threads(idle: list[float], most: int = MAX_THREADS) -> int:
    """Threads for the demo's processes from each usable core's idle share (0..1): the cores
    at least 80 % idle, at least 1, at most `most`. llama.cpp's threads meet at a barrier after
    every operation and torch's after every parallel loop, so a thread on a core another
    process keeps busy holds the others up: on 2 cores with one kept busy, 2 threads decoded at
    0.8 tokens/s where 1 decoded 39 (`PolicyServerSettings.llamacpp_threads`)."""
    return max(1, min(most, sum(share >= 0.8 for share in idle)))


def idle_shares(seconds: float = 1.0) -> list[float]:
    """The idle share of each core this process may run on, measured over `seconds`."""
    import psutil

    pinned = getattr(psutil.Process(), "cpu_affinity", None)  # not on macOS
    usable = (pinned and pinned()) or range(psutil.cpu_count() or 1)
    busy = psutil.cpu_percent(interval=seconds, percpu=True)
    return [1.0 - busy[i] / 100.0 for i in usable if i < len(busy)]


def with_threads(opts: DemoOptions, idle: list[float] | None = None) -> DemoOptions:
    """`opts` with `threads` set: as given, else `free_threads` of the cores idle now."""
    if opts.threads is not None:
        return opts
    return replace(opts, threads=free_threads(idle_shares() if idle is None else idle))


def group_of(opts: DemoOptions) -> int:
    return opts.group or GROUPS.get(opts.pack, 4)


def quick(opts: DemoOptions) -> DemoOptions:
    """The tiny model, one round, a handful of runs: the whole path in well under a minute."""
    return replace(
        opts,
        model="tiny",
        rounds=1,
        users=4,
        episodes=8,
        group=2,
        eval_size=12,
        max_tokens=12,
        # two versions of the random tiny model solve alike: on its 12 held-out tasks, 8
        # samples a task show "not worse", so the path through a release runs (6 do not)
        gate_samples=8,
    )


def quiet_runs(opts: DemoOptions) -> int:
    return round(opts.silence * opts.episodes)


def batch_size(opts: DemoOptions) -> int:
    """Rows the policy server decodes together, and the gate's runs in flight: two tasks' 8
    samples at once (measured: a gate 96 s at 8, 71 s at 16, `bench/bench_gate.py`)."""
    return max(16, opts.users)


def stack_env(
    opts: DemoOptions, policy_url: str, pack: Pack | None = None
) -> dict[str, dict[str, str]]:
    """The `ARLOOP_*` settings of each process (`pack`: the demo's, whose agents may ask for
    more tokens than `max_tokens`: the triage agent writes up to 80)."""
    threads = str(opts.threads or MAX_THREADS)
    trainable = str(opts.episodes - quiet_runs(opts))
    # how the agents sample and write tools: the learner's sub-rounds resample alike
    sampling = {
        "ARLOOP_TOOL_FORMAT": "line",  # what the pack's worked example is sized for
        "ARLOOP_POLICY_TEMPERATURE": str(opts.temperature),
        "ARLOOP_POLICY_MAX_TOKENS": str(opts.max_tokens),
    }
    return {
        "policy": {
            "ARLOOP_BASE_MODEL": opts.model,
            "ARLOOP_THREADS": threads,
            "ARLOOP_MAX_BATCH_SIZE": str(batch_size(opts)),
            # a ReAct call stays under 600 tokens: 1024 keeps each slot's KV (reserved up front
            # by llama.cpp) and its copies small; a Reflexion retry carries its first attempt,
            # the check's critique and a reflection (the triage agent's reached 1,002 tokens)
            "ARLOOP_CONTEXT_LENGTH": str(context_length(pack)),
            "ARLOOP_BATCH_WINDOW_MS": "20",
            "ARLOOP_MAX_TOKENS_CAP": str(token_cap(opts, pack)),
            "ARLOOP_RELOAD_POLL_S": "1",
            "ARLOOP_TOOL_FORMAT": sampling["ARLOOP_TOOL_FORMAT"],
            # llama.cpp's threads spin: the demo's phases take turns, so the free cores are its
            # while it decodes (traffic, the gate) and it is idle while the learner trains
            "ARLOOP_LLAMACPP_THREADS": threads,
        },
        "agents": {
            "ARLOOP_PACKS": f'["{opts.pack}"]',
            "ARLOOP_POLICY_API_BASE": policy_url,
            **{k: v for k, v in sampling.items() if k != "ARLOOP_TOOL_FORMAT"},
            "ARLOOP_CANARY_SHARE": "0",
            "ARLOOP_API_KEYS": f'["{API_KEY}"]',
            "ARLOOP_SECRET_KEY": secrets.token_hex(32),
            "ARLOOP_RUN_RATE_PER_MINUTE": "100000",
            "ARLOOP_FEEDBACK_RATE_PER_MINUTE": "100000",
            "OMP_NUM_THREADS": "1",
        },
        "learn": {
            "ARLOOP_BASE_MODEL": opts.model,
            **sampling,
            "OMP_NUM_THREADS": threads,
            "ARLOOP_MIN_EPISODES": trainable,
            "ARLOOP_ROUND__MAX_EPISODES": trainable,
            "ARLOOP_ROUND_INTERVAL_S": "1e9",
            "ARLOOP_ROUND__FEEDBACK_WINDOW_S": "30",
            "ARLOOP_TRIM_INTERVAL_S": "1e9",  # the report reads every event back
            "ARLOOP_READ_BLOCK_MS": "300",
            "ARLOOP_TRAIN__LEARNING_RATE": str(opts.learning_rate),
            "ARLOOP_TRAIN__KL_COEF": str(opts.kl_coef),
            "ARLOOP_TRAIN__MICRO_BATCH_SIZE": "8",
            "ARLOOP_EVAL_PACKS": f'["{opts.pack}"]',
            "ARLOOP_TUTORING_EVAL_SIZE": str(opts.eval_size),
            "ARLOOP_POLICY_API_BASE": policy_url,
            "ARLOOP_EVAL_MAX_TOKENS": str(opts.max_tokens),
            "ARLOOP_EVAL_CONCURRENCY": str(batch_size(opts)),
            "ARLOOP_CANARY__ENABLED": "false",
            **{f"ARLOOP_GATE__{k.upper()}": json.dumps(v) for k, v in DEMO_GATE.items()},
            "ARLOOP_GATE__FRESH_DRAW": json.dumps(opts.fresh_draw),
            "ARLOOP_GATE__SAMPLES": str(opts.gate_samples),
            "ARLOOP_ROUND__TRAIN_AFTER_TOOL": "false",  # the tutor's answer turn copies the calculator
            "ARLOOP_ROUND__SUBROUNDS": str(opts.subrounds),
            "ARLOOP_ROUND__RESAMPLE_N": str(opts.resample_n),
            "ARLOOP_ROUND__HINT_N": str(opts.hint_n),
        },
    }


def context_length(pack: Pack | None) -> int:
    """The policy server's context for the demo: 1024, 2048 when an agent of the pack retries
    (Reflexion: the retry's prompt holds the attempt it retries)."""
    agents = pack.agents if pack else ()
    return 2048 if any(a.kind == "reflexion" and a.max_attempts > 1 for a in agents) else 1024


def token_cap(opts: DemoOptions, pack: Pack | None) -> int:
    """The most completion tokens the policy server grants a choice: the demo's `max_tokens`,
    or more where one of the pack's agents sets its own (else its requests are refused)."""
    agents = pack.agents if pack else ()
    return max([opts.max_tokens, *(a.generation.max_tokens or 0 for a in agents if a.generation)])
