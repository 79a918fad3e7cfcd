import io

import pytest
from rich.console import Console

from deploy.learn.loop import Learner
from deploy.learn.plan import round_plan
from deploy.learn.round_line import summary_line
from deploy.learn.runner import main
from deploy.learn.settings import LearnerSettings
from learner.policy.registry import BaseModelMismatch, PolicyRegistry
from tests.learner.learner_events import feedback, trajectory, xadd


def _learner(redis_url, tmp_path, **kw) -> tuple[Learner, io.StringIO]:
    kw = {"min_episodes": 3, "round_interval_s": 3600.0, "read_block_ms": 10, **kw}
    kw.setdefault("eval_gate", False)  # these rounds publish straight to champion
    settings = LearnerSettings(
        redis_url=redis_url,
        data_dir=tmp_path,
        base_model="tiny",
        train={"learning_rate": 0.05},
        **kw,
    )
    out = io.StringIO()
    return Learner(settings, Console(file=out, width=200, record=True)), out


def _rated_runs(redis_client, n):
    for i in range(n):
        t = trajectory(answer="The answer is 42." if i % 2 else "no", logprobs=True, user=f"u{i}")
        xadd(redis_client, t)
        xadd(redis_client, feedback(t.event_id, "thumbs", 1 if i % 2 else -1, user=f"u{i}"))


def _catch_up(learner: Learner) -> None:
    while not learner.poll():
        pass


def test_a_round_waits_for_min_episodes_or_the_interval(redis_url, redis_client, tmp_path):
    learner, _ = _learner(redis_url, tmp_path)
    learner.start()
    _rated_runs(redis_client, 2)
    _catch_up(learner)
    assert not learner.round_due()  # 2 < min_episodes, interval not reached
    _rated_runs(redis_client, 1)
    _catch_up(learner)
    assert learner.round_due()
    eager, _ = _learner(redis_url, tmp_path, min_episodes=100, round_interval_s=0.0)
    assert eager.round_due()  # few episodes, but the interval has passed
    idle, _ = _learner(redis_url, tmp_path / "empty", min_episodes=100, round_interval_s=0.0)
    assert not idle.round_due()  # the interval passed, but nothing waits
    for one in (learner, eager, idle):
        one.store.close()


def test_once_prints_a_summary_line_and_the_status_shows_the_champion(
    redis_url, redis_client, tmp_path
):
    learner, out = _learner(redis_url, tmp_path)
    _rated_runs(redis_client, 4)
    assert learner.run(once=True) == 0
    line = summary_line(learner.last)
    assert line.startswith("v1 <- v0  episodes 4  samples 4  pairs 0  reward +0.000")
    assert line in out.getvalue() and line.endswith("champion")
    status = Console(file=io.StringIO(), width=200, record=True)
    status.print(learner.status_view())
    text = status.export_text()
    assert "champion" in text and "v1" in text and "8" in text  # 8 trained events
    learner.store.close()


def test_a_registry_of_another_base_model_is_refused(redis_url, redis_client, tmp_path):
    PolicyRegistry(redis_client).ensure_base("smollm2")
    learner, _ = _learner(redis_url, tmp_path)
    with pytest.raises(
        BaseModelMismatch, match="ARLOOP_BASE_MODEL is 'tiny'.*ARLOOP_BASE_MODEL=smollm2"
    ):
        learner.start()
    learner.store.close()


def test_bad_settings_exit_2_with_the_setting_named(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("ARLOOP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("ARLOOP_ROUND__MAX_USER_REWARD_SHARE", "5")
    assert main(once=True) == 2
    out = capsys.readouterr().out
    assert (
        "ARLOOP_ROUND__MAX_USER_REWARD_SHARE: '5' is out of range (must be > 0.0 and <= 1.0)" in out
    )
    assert "example: ARLOOP_ROUND__MAX_USER_REWARD_SHARE=" in out and "Traceback" not in out
    monkeypatch.delenv("ARLOOP_ROUND__MAX_USER_REWARD_SHARE")
    monkeypatch.setenv("ARLOOP_MAX_USER_REWARD_SHARE", "0.5")  # the name before it nested
    assert main(once=True) == 2
    out = capsys.readouterr().out
    assert "ARLOOP_MAX_USER_REWARD_SHARE is no longer read" in out
    assert "set ARLOOP_ROUND__MAX_USER_REWARD_SHARE" in out


def test_the_round_runs_with_the_settings_own_models(tmp_path):
    s = LearnerSettings(
        data_dir=tmp_path,
        train={"learning_rate": 1e-3, "full_finetune": True, "micro_batch_size": 4},
        round={"batch_size": 12, "silence_reward": 0.0},
        eval_gate=False,
        _env_file=None,
    )
    plan = round_plan(s)
    assert plan.train is s.train and plan.round is s.round  # no copy to drift from
    assert (plan.train.learning_rate, plan.round.batch_size) == (1e-3, 12)
    assert plan.checkpoints_dir == tmp_path / "checkpoints" and plan.actor == s.consumer
    assert plan.model_cache == s.model_cache and plan.promote  # no eval gate: straight to champion
    gated = s.model_copy(update={"eval_gate": True, "eval_packs": ["tutoring"]})
    assert not round_plan(gated).promote


def test_the_gate_is_on_by_default_for_the_installed_packs_with_eval_suites(tmp_path):
    s = LearnerSettings(data_dir=tmp_path, _env_file=None)
    assert s.eval_gate and s.eval_packs is None
    assert s.gate_packs() == [
        "medical",
        "tutoring",
    ]  # both built-in packs have eval suites (sorted)
    assert not round_plan(s).promote  # the release flow moves the aliases, not the round
    assert set(round_plan(s).grounding) == {"tutor", "tutor_hints", "triage"}
    off = LearnerSettings(data_dir=tmp_path, eval_gate=False, _env_file=None)
    assert off.gate_packs() == [] and round_plan(off).promote
    none = LearnerSettings(data_dir=tmp_path, eval_packs=[], _env_file=None)
    assert none.gate_packs() == [] and round_plan(none).promote
    one = LearnerSettings(data_dir=tmp_path, eval_packs=["medical"], _env_file=None)
    assert one.gate_packs() == ["medical"]


def test_replays_sample_with_the_agents_stops_and_penalties_at_the_rounds_temperature():
    from agents.packs import get_pack
    from deploy.learn.plan import groundings

    g = groundings([get_pack("medical")], "line")["triage"]
    assert g.max_tokens == 80 and g.include_stop and g.stop[-1] == "Triage: emergency"
    assert (g.frequency_penalty, g.presence_penalty) == (0.3, 0.3)
    assert not hasattr(g, "temperature")  # the round's, so greedy agents still explore
    tutor = groundings([get_pack("tutoring")], "line")["tutor"]
    assert tutor.stop == () and tutor.max_tokens is None


def test_once_with_a_canary_out_says_so_and_what_to_run_next_without_a_round(
    redis_url, redis_client, tmp_path
):
    from learner.gate.eval_gate import GateReport
    from learner.gate.release import apply_verdict
    from learner.policy.registry import CANDIDATE
    from tests.learner.gate.release_support import add_version

    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    v1 = add_version(registry, tmp_path / "checkpoints")
    apply_verdict(registry, GateReport(v1, "v0", "pass", [], "pass"), canary=True, actor="t")
    learner, out = _learner(redis_url, tmp_path, eval_gate=True, eval_packs=["tutoring"])
    _rated_runs(redis_client, 4)
    assert learner.run(once=True) == 0
    said = " ".join(out.getvalue().split())
    assert f"{v1} is the candidate and its canary is still running (canary {v1} vs v0: " in said
    assert "no round while it runs" in said and "another writer" not in said
    assert "`arloop learn` (without --once)" in said
    assert f"`arloop policy promote {v1}` or `arloop policy rollback --candidate`" in said
    assert learner.last is None and registry.aliases()[CANDIDATE] == v1  # no round, no v2
    learner.store.close()
