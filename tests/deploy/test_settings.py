"""The settings: every knob documented once, nested names set nested models, old names refused."""

from __future__ import annotations

import os

import pytest
from pydantic import BaseModel, ValidationError

from deploy.learn.settings import RENAMED, LearnerSettings
from deploy.policy_server.settings import PolicyServerSettings
from deploy.settings import DEV_SECRET, AgentApiSettings
from deploy.vllm_sync.settings import VllmSyncSettings

PROCESSES = [AgentApiSettings, PolicyServerSettings, LearnerSettings, VllmSyncSettings]
SECRET = "s" * 40


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No ARLOOP_* from the machine or the session leaks into these tests."""
    for name in list(os.environ):
        if name.startswith("ARLOOP_"):
            monkeypatch.delenv(name)
    return monkeypatch


def _undocumented(model: type[BaseModel], path: str = "") -> list[str]:
    """Fields without a description, through nested models."""
    missing = []
    for name, field in model.model_fields.items():
        if not (field.description or "").strip():
            missing.append(path + name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            missing += _undocumented(field.annotation, f"{path}{name}.")
    return missing


def _nested_fields(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    return {
        name: f.annotation
        for name, f in model.model_fields.items()
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
    }


@pytest.mark.parametrize("settings", PROCESSES, ids=lambda c: c.__name__)
def test_every_setting_is_documented_down_to_the_nested_models(settings):
    assert _undocumented(settings) == []


def test_the_learners_config_models_are_nested_not_copied():
    nested = _nested_fields(LearnerSettings)
    assert set(nested) == {"train", "round", "gate", "guards", "canary"}
    flat = set(LearnerSettings.model_fields)
    for name, model in nested.items():  # no knob of a nested model is declared flat as well
        assert not {f"{name}_{f}" for f in model.model_fields} & flat, name
        assert model.model_config["frozen"] and model.model_config["extra"] == "forbid"


def test_nested_names_set_the_nested_models(clean_env, tmp_path):
    clean_env.setenv("ARLOOP_TRAIN__LEARNING_RATE", "3e-4")
    clean_env.setenv("ARLOOP_TRAIN__WEIGHT_DECAY", "0.01")
    clean_env.setenv("ARLOOP_TRAIN__LORA_TARGETS", '["q_proj", "v_proj"]')
    clean_env.setenv("ARLOOP_ROUND__BATCH_SIZE", "12")
    clean_env.setenv("ARLOOP_GUARDS__MAX_KL", "0.3")
    clean_env.setenv("ARLOOP_GATE__ALPHA", "0.1")
    clean_env.setenv("ARLOOP_CANARY__ENABLED", "false")
    dotenv = tmp_path / ".env"
    dotenv.write_text("ARLOOP_TRAIN__ENTROPY_COEF=0.05\nARLOOP_GUARDS__MAX_CLIP_RATIO=0.4\n")
    s = LearnerSettings(_env_file=dotenv)
    assert (s.train.learning_rate, s.train.weight_decay, s.train.entropy_coef) == (3e-4, 0.01, 0.05)
    assert s.train.lora_targets == ("q_proj", "v_proj") and s.train.lora_rank == 16
    assert s.round.batch_size == 12 and s.round.epochs == 1
    assert (s.guards.max_kl, s.guards.max_clip_ratio, s.guards.max_eval_drop) == (0.3, 0.4, 0.05)
    assert s.gate.alpha == 0.1 and s.canary.enabled is False and s.canary.min_per_arm == 30


def test_a_nested_model_may_be_given_whole_and_a_misspelt_knob_is_refused(clean_env):
    clean_env.setenv("ARLOOP_CANARY", '{"enabled": false, "margin": 0.2}')
    s = LearnerSettings(_env_file=None)
    assert (s.canary.enabled, s.canary.margin) == (False, 0.2)
    clean_env.setenv("ARLOOP_GUARDS__MAX_KLL", "0.3")
    with pytest.raises(ValidationError, match=r"guards\.max_kll\s+Extra inputs are not permitted"):
        LearnerSettings(_env_file=None)


def test_the_policy_endpoint_is_declared_once_for_both_processes(clean_env):
    clean_env.setenv("ARLOOP_POLICY_API_BASE", "http://policy:9000/v1")
    clean_env.setenv("ARLOOP_POLICY_MODEL", "openai/mine")
    clean_env.setenv("ARLOOP_POLICY_TIMEOUT_S", "7")
    agents = AgentApiSettings(_env_file=None, policy_retries=0, policy_temperature=0.7)
    learner = LearnerSettings(_env_file=None, eval_max_tokens=32)
    for config in (agents.policy_config(), learner.policy_config()):
        assert (config.api_base, config.model, config.timeout_s) == (
            "http://policy:9000/v1",
            "openai/mine",
            7.0,
        )
    assert (agents.policy_config().retries, agents.policy_config().temperature) == (0, 0.7)
    assert learner.policy_config().max_tokens == 32 and learner.policy_config().versioned
    assert learner.policy_config().temperature == 0.0  # eval runs: greedy, the learner's knob


STRONG_KEY = "qV3x-9ZpLw2T_kR7mNa4Bc8YdE1fGh6J"  # 32 characters, ~150 bits by the estimate
STRONG_SECRET = "p8Kq2_Zr7Lx-Wm4Nv9Bt3Yc6Hd1Jf5Gs0Ae"
PRODUCTION = {
    "redis_url": f"rediss://arloop-agents:{STRONG_SECRET}@redis.internal:6379/0",
    "secret_key": STRONG_SECRET,
    "api_keys": [STRONG_KEY],
}


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"redis_url": None}, "ARLOOP_REDIS_URL must be set in production"),
        ({"redis_url": "redis://10.0.0.5:6379/0"}, "has no credentials"),
        (
            {"redis_url": "redis://arloop-agents:arloop-development-redis-agents-password@r:6379"},
            "Redis password .* too weak for production .*development value",
        ),
        ({"redis_url": "redis://arloop-agents:short@r:6379/0"}, "Redis password .*fewer than 24"),
        ({"secret_key": DEV_SECRET}, "ARLOOP_SECRET_KEY is too weak.*development value"),
        ({"secret_key": "short"}, "ARLOOP_SECRET_KEY is too weak.*fewer than 32"),
        ({"secret_key": "a" * 64}, "ARLOOP_SECRET_KEY is too weak.*0 bits of entropy"),
        ({"api_keys": []}, "ARLOOP_API_KEYS is empty"),
        ({"api_keys": ["a"]}, "too weak for production.*fewer than 24"),
        ({"api_keys": ["dev-key"]}, "development key"),
        ({"api_keys": ["ab" * 16]}, "bits of entropy, fewer than 96"),
        (
            {"policy_api_key": "arloop-development-policy-key-agents"},
            "ARLOOP_POLICY_API_KEY is the development value",
        ),
        (
            {"api_keys": [{"key": STRONG_KEY, "name": "web", "identity": "signed"}]},
            "ARLOOP_USER_TOKEN_SECRET is unset",
        ),
        (
            {"api_keys": [{"key": STRONG_KEY, "name": "web", "identity": "user"}]},
            "`user` is set exactly when identity is 'user'",
        ),
    ],
)
def test_production_refuses_weak_values_naming_the_fix(clean_env, overrides, message):
    clean_env.setenv("ARLOOP_ENV", "production")
    with pytest.raises(ValidationError, match=message) as caught:
        AgentApiSettings(_env_file=None, **(PRODUCTION | overrides))
    fixes = ("token_urlsafe", "redis://<user>:<password>@", "rediss://", "give each client")
    assert any(fix in str(caught.value) for fix in fixes) or "identity" in message


def test_production_accepts_strong_values_and_warns_on_every_interface(clean_env, caplog):
    clean_env.setenv("ARLOOP_ENV", "production")
    ok = AgentApiSettings(_env_file=None, **PRODUCTION)
    assert ok.env == "production" and caplog.records == []
    AgentApiSettings(_env_file=None, host="0.0.0.0", **PRODUCTION)
    assert "listening on every interface" in caplog.text
    with pytest.raises(ValidationError, match="has no credentials"):  # every process
        LearnerSettings(_env_file=None, redis_url="redis://10.0.0.5:6379/0")
    learner = LearnerSettings(
        _env_file=None, redis_url="redis://10.0.0.5:6379/0", redis_password=STRONG_SECRET
    )
    assert learner.redis_options(learner.redis_url)["password"] == STRONG_SECRET
    clean_env.setenv("ARLOOP_REDIS_PASSWORD", STRONG_SECRET)
    placeholder = "arloop-development-policy-key-learner"  # the manifests' Secret's value
    with pytest.raises(ValidationError, match="ARLOOP_POLICY_API_KEY is the development value"):
        LearnerSettings(_env_file=None, redis_url=learner.redis_url, policy_api_key=placeholder)
    clean_env.setenv("ARLOOP_ENV", "development")
    assert LearnerSettings(_env_file=None, policy_api_key=placeholder).policy_api_key == placeholder


def test_development_keeps_working_out_of_the_box(clean_env):
    dev = AgentApiSettings(_env_file=None)
    assert dev.secret_key == DEV_SECRET
    assert [k.key.get_secret_value() for k in dev.api_keys] == ["dev-key"]
    assert dev.api_keys[0].identity == "any" and dev.api_keys[0].name.startswith("key-")


def test_a_token_ttl_beyond_the_longest_life_is_refused(clean_env):
    with pytest.raises(ValidationError, match="feedback_token_ttl_s"):
        AgentApiSettings(_env_file=None, feedback_token_ttl_s=10**12)


@pytest.mark.parametrize(
    "old, new",
    [
        ("ARLOOP_LEARNING_RATE", "ARLOOP_TRAIN__LEARNING_RATE"),
        ("ARLOOP_GUARD_MAX_KL", "ARLOOP_GUARDS__MAX_KL"),
        ("ARLOOP_FEEDBACK_WINDOW_S", "ARLOOP_ROUND__FEEDBACK_WINDOW_S"),
        ("ARLOOP_OPE_MIN_ESS", "ARLOOP_GATE__MIN_ESS"),
        ("ARLOOP_CANARY", "ARLOOP_CANARY__ENABLED"),
        ("ARLOOP_GRAD_ACCUM_STEPS", "ARLOOP_ROUND__BATCH_SIZE"),
    ],
)
def test_an_old_name_is_refused_with_the_new_one(clean_env, tmp_path, old, new):
    clean_env.setenv(old, "1")
    with pytest.raises(ValidationError, match=f"{old} is no longer read: set {new}"):
        LearnerSettings(_env_file=None)
    clean_env.delenv(old)
    dotenv = tmp_path / ".env"
    dotenv.write_text(f"{old}=1\n")
    with pytest.raises(ValidationError, match=f"{old} is no longer read: set {new}"):
        LearnerSettings(_env_file=dotenv)
    AgentApiSettings(_env_file=dotenv)  # another process's old name is not this one's concern


def test_every_rename_points_at_a_knob_that_exists():
    nested = _nested_fields(LearnerSettings)
    for old, hint in RENAMED.items():
        section, _, field = hint.split()[0].removeprefix("ARLOOP_").lower().partition("__")
        assert field in nested[section].model_fields, hint
        assert old.removeprefix("ARLOOP_").lower() not in LearnerSettings.model_fields or (
            old == "ARLOOP_CANARY"  # now the nested model's own name (JSON); a bool is refused
        )


def test_unchanged_flat_names_still_work(clean_env):
    for name, value in {
        "ARLOOP_MIN_EPISODES": "3",
        "ARLOOP_ROUND_INTERVAL_S": "5",
        "ARLOOP_EVAL_PACKS": '["tutoring"]',
        "ARLOOP_TUTORING_SOURCE": "gsm8k",
        "ARLOOP_TUTORING_EVAL_SIZE": "7",
        "ARLOOP_MODEL_CACHE": "/tmp/models",
    }.items():
        clean_env.setenv(name, value)
    s = LearnerSettings(_env_file=None)
    assert (s.min_episodes, s.round_interval_s, s.eval_packs) == (3, 5.0, ["tutoring"])
    assert (s.tutoring_source, s.tutoring_eval_size, str(s.model_cache)) == (
        "gsm8k",
        7,
        "/tmp/models",
    )
    assert str(PolicyServerSettings(_env_file=None).model_cache) == "/tmp/models"


def test_each_server_has_its_own_port_and_host_and_the_shared_names_still_work(clean_env):
    clean_env.setenv("ARLOOP_PORT", "9000")
    clean_env.setenv("ARLOOP_HOST", "10.0.0.1")
    shared = AgentApiSettings(_env_file=None), PolicyServerSettings(_env_file=None)
    assert [(s.host, s.port) for s in shared] == [("10.0.0.1", 9000)] * 2  # as before
    clean_env.setenv("ARLOOP_AGENTS_PORT", "9100")
    clean_env.setenv("ARLOOP_POLICY_PORT", "9200")
    clean_env.setenv("ARLOOP_POLICY_HOST", "0.0.0.0")
    agents, policy = AgentApiSettings(_env_file=None), PolicyServerSettings(_env_file=None)
    assert (agents.host, agents.port) == ("10.0.0.1", 9100)  # own port, the shared host
    assert (policy.host, policy.port) == ("0.0.0.0", 9200)
    assert AgentApiSettings(_env_file=None, port=7).port == 7  # by field name too


def test_one_env_file_runs_both_servers(clean_env, tmp_path):
    dotenv = tmp_path / ".env"
    dotenv.write_text("ARLOOP_AGENTS_PORT=9100\nARLOOP_POLICY_PORT=9200\n")
    agents, policy = AgentApiSettings(_env_file=dotenv), PolicyServerSettings(_env_file=dotenv)
    assert (agents.port, policy.port) == (9100, 9200)
    clean_env.setenv("ARLOOP_POLICY_PORT", "70000")
    with pytest.raises(ValidationError, match="ARLOOP_POLICY_PORT"):
        PolicyServerSettings(_env_file=dotenv)
