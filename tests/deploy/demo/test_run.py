"""`arloop demo --quick`: the whole loop on the tiny model, one round, real processes.

The demo runs once per session (`quick_demo` in tests/deploy/conftest.py); after it has stopped
its stack, its Redis is started again on the demo's data directory (append-only file) and every
figure of the report is recomputed from what is there.
"""

import json
import random
from collections import Counter

import pytest

from agents.events import STREAM_EVAL_TRAJECTORIES, STREAM_FEEDBACK, STREAM_TRAJECTORIES, decode
from agents.packs import get_pack
from agents.packs.tutoring import tutoring_pack
from deploy.demo.options import (
    MAX_THREADS,
    DemoOptions,
    free_threads,
    idle_shares,
    stack_env,
    with_threads,
)
from deploy.demo.report import headline
from deploy.demo.run import main, round_tasks
from deploy.demo.visits import visit_tasks
from learner.policy.registry import CHAMPION, PolicyRegistry
from tests.deploy.policy_server.support import needs_llamacpp


@pytest.fixture
def demo(quick_demo):
    """The session's one quick demo run (tests/deploy/conftest.py)."""
    return quick_demo


def events(client, stream):
    return [decode(fields) for _, fields in client.xrange(stream)]


def test_the_report_is_written_with_its_plots(demo):
    report, folder, _, said = demo
    assert {p.name for p in folder.iterdir()} >= {
        "report.json",
        "report.md",
        "kl.png",
        "length.png",
        "success_reward.png",
    }
    assert all((folder / n).stat().st_size > 1000 for n in ("kl.png", "success_reward.png"))
    saved = json.loads((folder / "report.json").read_text())
    assert [v["version"] for v in saved["versions"]] == ["v0", "v1"]
    assert saved["rounds"][0]["served_by"] == "v0" and saved["rounds"][0]["runs"] == 8
    closing = saved["rounds"][-1]  # the students' closing visit on the final champion
    assert len(saved["rounds"]) == 2 and closing["served_by"] == saved["champion"]
    assert closing["runs"] == 8 and closing["version"] is None and "closing visit" in said
    markdown = (folder / "report.md").read_text()
    assert "| v1 " in markdown and headline(report) in markdown
    assert "round 1" in said  # progress was shown


def test_versions_and_verdicts_match_the_registry(demo):
    _, folder, client, _ = demo
    registry = PolicyRegistry(client)
    saved = json.loads((folder / "report.json").read_text())
    assert {v.version for v in registry.versions()} == {r["version"] for r in saved["versions"]}
    assert registry.aliases()[CHAMPION] == saved["champion"]
    v1 = next(r for r in saved["versions"] if r["version"] == "v1")
    gate = registry.get("v1").report
    assert gate is not None and (gate["verdict"], gate["reason"]) == (v1["verdict"], v1["reason"])
    assert v1["status"] == registry.get("v1").status.value
    assert v1["train_reward"] == registry.get("v1").metrics["reward"]
    if saved["improvement"] is not None:  # the gates ran all 12 of the quick pool's tasks
        assert saved["improvement"]["draw"] == "gates"


def test_traffic_and_eval_figures_are_what_redis_holds(demo):
    _, folder, client, _ = demo
    saved = {r["version"]: r for r in json.loads((folder / "report.json").read_text())["versions"]}
    runs = events(client, STREAM_TRAJECTORIES)
    served = Counter(t.policy_version for t in runs)
    assert served == Counter({v: r["traffic_runs"] for v, r in saved.items() if r["traffic_runs"]})
    by_run = {t.trajectory_id: t.policy_version for t in runs}
    thumbs = [f for f in events(client, STREAM_FEEDBACK) if f.kind.value == "thumbs"]
    for v, row in saved.items():
        mine = [f.value for f in thumbs if by_run.get(f.trajectory_id) == v]
        assert (row["thumbs_up"], row["thumbs_down"]) == (mine.count(1), mine.count(-1)), v
    pack = tutoring_pack("templates", 12)
    tasks = {t.id: t for t in pack.tasks("eval")}
    solved: dict[str, dict[str, bool]] = {}
    forms = Counter()
    for t in events(client, STREAM_EVAL_TRAJECTORIES):
        forms[t.metadata["arloop.form"]] += 1
        if t.metadata["arloop.form"] == "sampled":  # what users get; the guards' runs are greedy
            task = tasks[t.metadata["arloop.task"]]
            verdict = pack.verify(task, t.output) >= 1
            solved.setdefault(t.metadata["arloop.eval"], {})[task.id] = verdict
    assert forms["sampled"] and forms["greedy"], forms
    for v, row in saved.items():  # the gates' and final check's whole runs: 8 of the 12 tasks
        assert (row["eval_solved"], row["eval_n"]) == (sum(solved[v].values()), 8), v


@needs_llamacpp
def test_the_default_export_is_quantised_and_the_learner_relogs_what_it_trained(demo):
    """Where llama.cpp runs, the policy server serves its default Q8_0 export, whose logprobs
    are not the learner's: the round recomputed the logged behaviour logprobs of every step it
    trained with the fp32 weights of the version that served it, and said how far apart."""
    _, _, client, _ = demo
    steps = [s for t in events(client, STREAM_TRAJECTORIES) for s in t.model_steps]
    assert steps and {s.engine for s in steps} == {"llamacpp-q8_0"}
    metrics = PolicyRegistry(client).get("v1").metrics
    assert metrics["behaviour/recomputed_steps"] > 0, metrics
    assert metrics["behaviour/kept_logged_steps"] == 0
    assert 0 < metrics["behaviour/engine_gap"] < 1


def test_a_used_data_directory_is_refused(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "something").write_text("x")
    opts = DemoOptions(report_dir=tmp_path / "reports", data_dir=tmp_path / "data")
    assert main(opts, tiny=True) == 1
    assert "not empty" in " ".join(capsys.readouterr().out.split())  # however it wraps


def test_the_closing_visit_is_logged_but_not_learned_from(demo):
    _, folder, client, _ = demo
    closing = json.loads((folder / "report.json").read_text())["rounds"][-1]
    cohort = f"r{3 * 1000 + closing['round']}"  # the demo's traffic prefix for that round
    runs = [t for t in events(client, STREAM_TRAJECTORIES) if t.metadata.get("cohort") == cohort]
    assert len(runs) == closing["runs"] == 8
    assert {t.policy_version for t in runs} == {closing["served_by"]}
    rated = {f.trajectory_id for f in events(client, STREAM_FEEDBACK)}
    assert rated & {t.trajectory_id for t in runs}  # its feedback is in Redis, for later
    assert {v.version for v in PolicyRegistry(client).versions()} == {"v0", "v1"}  # not trained


def test_a_round_spreads_its_problems_over_the_kinds_in_groups():
    tasks = visit_tasks(tutoring_pack().tasks("train"), 10, 4, random.Random(5))
    problems = [tasks[i] for i in range(0, len(tasks), 4)]
    assert len(tasks) == 40 and all(tasks[i].id == tasks[i - i % 4].id for i in range(40))
    counts = Counter(t.meta["kind"] for t in problems)
    assert set(counts) == {"add", "sub", "mul", "div"} and set(counts.values()) == {2, 3}
    assert len({t.id for t in problems}) == 10


def test_every_patient_brings_a_case_of_their_own():
    """The medical demo sent patients in fours, like students (a GRPO group): 32 visits were 8
    cases, and the clinic's dispositions on half the visits labelled 6-7 distinct messages a
    round, too few for the level head to pass the gate. Patients now bring 32 cases; students
    still come in fours, and `--group` still decides when given."""
    medical, tutoring = get_pack("medical"), get_pack("tutoring")
    patients = round_tasks(DemoOptions(pack="medical"), medical, 1)
    assert len(patients) == 32 and len({t.id for t in patients}) == 32
    students = round_tasks(DemoOptions(), tutoring, 1)
    assert len(students) == 32 and len({t.id for t in students}) == 8
    fours = round_tasks(DemoOptions(pack="medical", group=4), medical, 1)
    assert len({t.id for t in fours}) == 8


def test_the_policy_server_grants_what_the_packs_agents_ask_for():
    """The triage agent asks for 80 tokens a call; the demo's policy server capped every
    choice at the demo's `max_tokens` (32), so each visit of `arloop demo --pack medical`
    failed with a 502. The cap admits what the pack's agents ask for."""
    opts = DemoOptions()
    medical = get_pack("medical")
    asks = max(a.generation.max_tokens or 0 for a in medical.agents if a.generation)
    assert asks > opts.max_tokens  # the precondition: the pack asks for more than the default
    assert int(stack_env(opts, "", medical)["policy"]["ARLOOP_MAX_TOKENS_CAP"]) >= asks
    tutoring = stack_env(opts, "", get_pack("tutoring"))["policy"]
    assert tutoring["ARLOOP_MAX_TOKENS_CAP"] == str(opts.max_tokens)  # no agent of its own


def test_the_policy_servers_context_holds_a_reflexion_retry():
    """`arloop demo --pack medical` gave the policy server 1024 tokens of context; the triage
    agent's retry (its first attempt, the check's critique, a reflection) reached 1,002 tokens
    of prompt plus 80 to write, so every gate of a candidate failed closed until the demo gave
    up. A pack whose agents retry gets 2048; the tutor's single ReAct calls keep 1024."""
    opts = DemoOptions()
    medical = get_pack("medical")
    assert any(a.kind == "reflexion" and a.max_attempts > 1 for a in medical.agents)
    assert stack_env(opts, "", medical)["policy"]["ARLOOP_CONTEXT_LENGTH"] == "2048"
    tutoring = stack_env(opts, "", get_pack("tutoring"))["policy"]
    assert tutoring["ARLOOP_CONTEXT_LENGTH"] == "1024"


def test_the_demos_threads_are_the_cores_idle_at_start():
    """On 2 cores with one kept busy by other work, the demo gave the policy server and the
    learner 2 threads each; llama.cpp's and torch's threads wait for each other, and round 1's
    gate was still running at the demo's 900 s deadline. Without --threads the demo takes the
    cores idle when it starts (at most 2), and the processes get what it took."""
    assert free_threads([1.0, 0.98]) == 2  # an idle 2-core machine: as measured before
    assert free_threads([0.97, 0.02]) == 1  # one core kept busy
    assert free_threads([0.5, 0.6]) == 1  # two half-busy cores: not one free, still one thread
    assert free_threads([0.0] * 4) == 1
    assert free_threads([1.0] * 16) == MAX_THREADS
    assert free_threads([1.0] * 16, most=8) == 8

    busy = with_threads(DemoOptions(), idle=[1.0, 0.0])
    assert busy.threads == 1
    env = stack_env(busy, "")
    assert env["policy"]["ARLOOP_THREADS"] == env["policy"]["ARLOOP_LLAMACPP_THREADS"] == "1"
    assert env["learn"]["OMP_NUM_THREADS"] == "1"
    assert with_threads(DemoOptions(threads=2), idle=[1.0, 0.0]).threads == 2  # as asked

    shares = idle_shares(0.1)  # measured on this machine: one share a usable core, each 0..1
    assert shares and all(0.0 <= s <= 1.0 for s in shares)


def test_the_demo_gates_share_v0s_draw_unless_asked_for_fresh_ones(monkeypatch):
    """The learner reads the demo's gate settings from its environment: every gate runs v0's
    draw (its later gates reuse earlier runs), and `fresh_draw` (the learning bench's, as its
    figures were measured) gives each gate its champion's own draw."""
    from deploy.learn.settings import LearnerSettings

    def learner_gate(opts):
        for name, value in stack_env(opts, "http://policy")["learn"].items():
            monkeypatch.setenv(name, value)
        return LearnerSettings().gate

    assert learner_gate(DemoOptions()).fresh_draw is False
    assert learner_gate(DemoOptions(fresh_draw=True)).fresh_draw is True
    assert list(learner_gate(DemoOptions()).looks) == [24, 48]  # the rest of the demo's gate
