"""A settings error, explained: one line per bad variable with its value and a working example."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError

from deploy.learn.settings import LearnerSettings
from deploy.policy_server.settings import PolicyServerSettings
from deploy.settings import AgentApiSettings
from deploy.settings_errors import explain


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("ARLOOP_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize(
    ("cls", "env", "line"),
    [
        (
            AgentApiSettings,
            {"ARLOOP_PACKS": "tutoring"},
            """ARLOOP_PACKS: 'tutoring' is not a JSON list; example: ARLOOP_PACKS='["tutoring"]'""",
        ),
        (
            AgentApiSettings,
            {"ARLOOP_CANARY_SHARE": "2"},
            "ARLOOP_CANARY_SHARE: '2' is out of range (must be >= 0.0 and <= 1.0); "
            "example: ARLOOP_CANARY_SHARE=0.1",
        ),
        (
            PolicyServerSettings,
            {"ARLOOP_PORT": "x"},  # the shared name: named as set, the process's own suggested
            "ARLOOP_PORT: 'x' is not a valid integer (unable to parse string as an "
            "integer); example: ARLOOP_POLICY_PORT=8001",
        ),
        (
            LearnerSettings,
            {"ARLOOP_TRAIN__LEARNING_RATE": "fast"},
            "ARLOOP_TRAIN__LEARNING_RATE: 'fast' is not a valid number (unable to parse string "
            "as a number); example: ARLOOP_TRAIN__LEARNING_RATE=0.0001",
        ),
        (
            LearnerSettings,
            {"ARLOOP_REPORT_TO": '["wandb"]'},
            "ARLOOP_REPORT_TO: 'wandb' is not one of 'tensorboard'; "
            """example: ARLOOP_REPORT_TO='["tensorboard"]'""",
        ),
        (
            LearnerSettings,
            {"ARLOOP_CANARY": "{enabled"},
            "ARLOOP_CANARY: '{enabled' is not valid JSON (Expecting property name enclosed in "
            "double quotes); example: ARLOOP_CANARY__ENABLED=true",
        ),
        (
            LearnerSettings,
            {"ARLOOP_GUARD_MAX_KL": "0.3"},
            "ARLOOP_GUARD_MAX_KL is no longer read: set ARLOOP_GUARDS__MAX_KL",
        ),
        (
            AgentApiSettings,
            {  # a check across fields names its variables itself
                "ARLOOP_ENV": "production",
                "ARLOOP_SECRET_KEY": "p8Kq2_Zr7Lx-Wm4Nv9Bt3Yc6Hd1Jf5Gs0Ae",
                "ARLOOP_API_KEYS": '["qV3x-9ZpLw2T_kR7mNa4Bc8YdE1fGh6J"]',
            },
            "ARLOOP_REDIS_URL must be set in production",
        ),
    ],
)
def test_each_error_is_one_line_with_the_variable_the_value_and_an_example(
    clean_env, cls, env, line
):
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises((ValidationError, SettingsError)) as caught:
        cls(_env_file=None)
    (explained,) = explain(caught.value, cls)
    assert explained.startswith(line), explained
    assert "\n" not in explained


def test_every_production_problem_gets_its_own_line(clean_env):
    clean_env.setenv("ARLOOP_ENV", "production")
    clean_env.setenv("ARLOOP_SECRET_KEY", "short")
    with pytest.raises(ValidationError) as caught:
        AgentApiSettings(_env_file=None)
    explained = explain(caught.value, AgentApiSettings)
    assert [line.split(" ")[0] for line in explained] == [
        "ARLOOP_REDIS_URL",
        "ARLOOP_SECRET_KEY",
        "API",  # the development key
    ], explained


def test_every_bad_variable_gets_its_own_line(clean_env):
    clean_env.setenv("ARLOOP_CANARY_SHARE", "-1")
    clean_env.setenv("ARLOOP_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError) as caught:
        AgentApiSettings(_env_file=None)
    lines = explain(caught.value, AgentApiSettings)
    assert [line.split(":")[0] for line in lines] == ["ARLOOP_LOG_FORMAT", "ARLOOP_CANARY_SHARE"]
