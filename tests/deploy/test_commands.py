"""`arloop policy list|promote|rollback` and `arloop eval` through the real CLI on a real Redis."""

import pytest
from typer.testing import CliRunner

from deploy.cli import app
from deploy.embedded_redis import free_port
from learner.gate.eval_gate import GateReport
from learner.gate.release import apply_verdict
from learner.policy.registry import CANDIDATE, CHAMPION, VersionStatus
from tests.learner.gate.release_support import add_version
from tests.learner.learner_fixtures import base_registry

runner = CliRunner()


@pytest.fixture
def registry(redis_client):
    return base_registry(redis_client)


@pytest.fixture
def arloop(redis_url, tmp_path):
    env = {
        "ARLOOP_REDIS_URL": redis_url,
        "ARLOOP_DATA_DIR": str(tmp_path / "data"),
        "COLUMNS": "250",
    }

    def invoke(*args: str, **extra: str):
        return runner.invoke(app, list(args), env=env | extra)

    return invoke


def _report(version, verdict, failed=()):
    return GateReport(version, "v0", verdict, list(failed), "because")


def test_list_shows_versions_aliases_verdicts_and_recent_moves(arloop, registry, tmp_path):
    good, bad = add_version(registry, tmp_path), add_version(registry, tmp_path)
    apply_verdict(registry, _report(good, "pass"), canary=True, actor="learner-1")
    apply_verdict(
        registry, _report(bad, "reject", ["reward_length_corr"]), canary=True, actor="learner-1"
    )
    result = arloop("policy", "list")
    assert result.exit_code == 0, result.output
    rows = {
        line.split("│")[1].strip(): line
        for line in result.output.splitlines()
        if line.count("│") > 5 and line.split("│")[1].strip().startswith("v")
    }
    assert "champion" in rows["v0"]
    assert "candidate" in rows[good] and "pass" in rows[good]
    assert "rejected" in rows[bad] and "reward_length_corr" in rows[bad]
    assert f"candidate: - -> {good}" in result.output
    assert "PolicyRejected" in result.output and "learner-1" in result.output


def test_promote_moves_the_champion_and_refuses_a_rejected_version(arloop, registry, tmp_path):
    good, bad = add_version(registry, tmp_path), add_version(registry, tmp_path)
    apply_verdict(registry, _report(bad, "reject", ["goodhart"]), canary=True, actor="gate")
    refused = arloop("policy", "promote", bad)
    assert (
        refused.exit_code == 1 and "was rejected" in refused.output and "--force" in refused.output
    )
    assert registry.resolve(CHAMPION) == "v0"
    done = arloop("policy", "promote", good)
    assert done.exit_code == 0 and f"{good} is the champion (was v0)" in done.output
    assert registry.get(good).status is VersionStatus.CHAMPION
    unknown = arloop("policy", "promote", "v99")
    assert unknown.exit_code == 1 and "no such version" in unknown.output


def test_rollback_to_a_gone_checkpoint_is_a_clear_error_and_the_champion_stays(
    arloop, registry, tmp_path
):
    old, new = add_version(registry, tmp_path), add_version(registry, tmp_path)
    assert arloop("policy", "promote", old).exit_code == 0
    assert arloop("policy", "promote", new).exit_code == 0
    (tmp_path / old / "adapter_model.safetensors").unlink()
    result = arloop("policy", "rollback")
    assert result.exit_code == 1
    assert f"cannot roll back to {old}" in result.output and "has no" in result.output
    assert registry.resolve(CHAMPION) == new
    ok = arloop("policy", "rollback", "--to", "v0")
    assert ok.exit_code == 0 and f"champion rolled back from {new} to v0" in ok.output
    assert registry.resolve(CHAMPION) == "v0"
    assert "PolicyRolledBack" in arloop("policy", "list").output


def test_rollback_of_the_canary_candidate(arloop, registry, tmp_path):
    v = add_version(registry, tmp_path)
    nothing = arloop("policy", "rollback", "--candidate")
    assert nothing.exit_code == 1 and "no candidate is out" in nothing.output
    apply_verdict(registry, _report(v, "pass"), canary=True, actor="gate")
    result = arloop("policy", "rollback", "--candidate")
    assert result.exit_code == 0 and f"candidate {v} rolled back" in result.output
    assert CANDIDATE not in registry.aliases() and registry.resolve(CHAMPION) == "v0"
    assert registry.get(v).status is VersionStatus.REJECTED


def test_eval_without_a_pack_or_with_the_server_down_exits_2(arloop, registry, tmp_path):
    add_version(registry, tmp_path)
    none = arloop("eval", ARLOOP_EVAL_GATE="false")
    assert none.exit_code == 2 and "no eval pack (ARLOOP_EVAL_GATE" in none.output
    down = arloop(
        "eval",
        "--json",
        "--apply",
        ARLOOP_EVAL_PACKS='["tests.deploy.learn.test_agent_runs:echo_pack"]',
        ARLOOP_POLICY_API_BASE=f"http://127.0.0.1:{free_port()}/v1",
    )
    assert down.exit_code == 2 and '"verdict": "error"' in down.output
    assert "stays READY" in down.output and registry.resolve(CHAMPION) == "v0"
    unknown = arloop("eval", ARLOOP_EVAL_PACKS='["nonexistent"]')
    assert unknown.exit_code == 2 and "unknown agent pack 'nonexistent'" in unknown.output
    assert "installed packs are medical, tutoring" in unknown.output


def test_serve_refuses_bad_settings_and_pack_names_with_a_message(arloop):
    cooking = arloop("serve", "agents", ARLOOP_PACKS='["cooking"]')
    assert cooking.exit_code == 2 and "unknown agent pack 'cooking'" in cooking.output
    assert "fix ARLOOP_PACKS" in cooking.output and "Traceback" not in cooking.output
    production = arloop("serve", "agents", ARLOOP_ENV="production")
    assert production.exit_code == 2 and "ARLOOP_REDIS_URL has no credentials" in production.output
    secured = arloop(
        "serve", "agents", ARLOOP_ENV="production", ARLOOP_REDIS_PASSWORD="p" + "x9Y2z" * 8
    )
    assert secured.exit_code == 2 and "ARLOOP_SECRET_KEY is too weak" in secured.output
    stale = arloop("learn", "--once", ARLOOP_GUARD_MAX_KL="0.3")
    assert stale.exit_code == 2 and "set ARLOOP_GUARDS__MAX_KL" in stale.output
    gpu = arloop(
        "serve",
        "policy",
        ARLOOP_POLICY_ENGINE="llamacpp",
        ARLOOP_DEVICE="cuda",
        ARLOOP_BASE_MODEL="tiny",
    )
    assert gpu.exit_code == 2 and "ARLOOP_POLICY_ENGINE=llamacpp cannot run" in gpu.output
    assert "Traceback" not in gpu.output
