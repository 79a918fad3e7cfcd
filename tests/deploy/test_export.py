"""`arloop export` end to end: runs and feedback through the real agent API (PHI scrubbed before
Redis by the real scrubber), read into the learner's store by the real learner, exported as
parquet / JSON lines, loaded with `datasets`, and trained on one step by TRL's own trainers."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from datasets import load_dataset
from rich.console import Console
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from agents.pii import shared_scrubber
from deploy.cli import app
from deploy.export import parse_since
from deploy.learn.loop import Learner
from deploy.learn.settings import LearnerSettings
from learner.policy.tiny_model import save_tiny_model
from tests.fakes.scripted_llm import Reply

runner = CliRunner()
PHONE = "555-201-3344"


def _log_traffic(api, llm, phone_in: str = "") -> None:
    """Two prompts, each answered well once and badly once, rated four ways."""
    answers = iter(["It is 42.", "It is 40.", "It is 7.", "It is 8."])
    llm.responder = lambda request: Reply(content=next(answers))
    for n, (question, verdicts) in enumerate(
        [("What is 12+30?", [("rating", 5), ("thumbs", -1)]), ("What is 3+4?", [(None, 1.0)])]
        + [("What is 3+4?", [(None, 0.0)])]
    ):
        for kind, value in verdicts:
            body = api.run(f"{question}{phone_in}", user=f"u{n}{kind}").json()
            common = {
                "trajectory_id": body["trajectory_id"],
                "feedback_token": body["feedback_token"],
            }
            fields = {"key": "correct", "score": value} if kind is None else {"kind": kind}
            fields |= {"value": value} if kind else {"comment": f"call me on {PHONE}"}
            reply = api.feedback(**common, **fields, user_id=f"u{n}{kind}")
            assert reply.status_code == 202, reply.text


def _read_into_store(redis_url: str, data_dir: Path) -> None:
    settings = LearnerSettings(
        _env_file=None,
        redis_url=redis_url,
        data_dir=data_dir,
        base_model="tiny",
        read_block_ms=10,
        metrics_port=0,
        eval_gate=False,
    )
    learner = Learner(settings, Console(file=io.StringIO()))
    learner.start(once=True)
    while not learner.poll():  # until both streams are read into the store
        pass
    learner.store.close()


@pytest.fixture
def exported(start_api, llm, redis_url, tmp_path):
    """A data directory whose learner store holds the scrubbed traffic; `export(...)` runs the CLI."""
    api = start_api(scrubber=shared_scrubber().scrub)  # loaded here: uvicorn starts in time
    _log_traffic(api, llm, phone_in=f" My number is {PHONE}.")
    _read_into_store(redis_url, tmp_path / "data")
    env = {"ARLOOP_DATA_DIR": str(tmp_path / "data"), "ARLOOP_REDIS_URL": redis_url}

    def export(*args: str):
        return runner.invoke(app, ["export", *args], env=env)

    return export, tmp_path


@pytest.mark.parametrize(
    ("fmt", "suffix", "columns", "count"),
    [
        ("trl-grpo", "parquet", {"prompt", "completion", "reward"}, 4),
        ("sft", "jsonl", {"prompt", "completion", "reward"}, 2),
        ("kto", "parquet", {"prompt", "completion", "label"}, 4),
        ("dpo", "jsonl", {"prompt", "chosen", "rejected"}, 2),
    ],
)
def test_each_format_loads_with_datasets_scrubbed_in_trls_columns(
    exported, fmt, suffix, columns, count
):
    export, tmp_path = exported
    out = tmp_path / f"{fmt}.{suffix}"
    result = export("--format", fmt, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {count} {fmt} rows" in result.output
    data = load_dataset("parquet" if suffix == "parquet" else "json", data_files=str(out))["train"]
    assert columns <= set(data.column_names) and len(data) == count
    raw = out.read_bytes().decode("utf-8", "replace")
    assert PHONE not in raw and "[PHONE]" in raw  # scrubbed before Redis: the export shows it
    first = data[0]
    assert first["prompt"][-1]["role"] == "user" and first["prompt"][-1]["content"].startswith(
        "What is"
    )


def test_since_and_pack_filter_and_bad_options_are_refused(exported):
    export, tmp_path = exported
    out = tmp_path / "x.jsonl"
    assert export("--format", "trl-grpo", "--out", str(out), "--since", "1h").exit_code == 0
    later = export("--format", "trl-grpo", "--out", str(out), "--since", "2999-01-01")
    assert later.exit_code == 1 and "nothing to export" in later.output
    other = export("--format", "trl-grpo", "--out", str(out), "--pack", "medical")
    assert other.exit_code == 1  # the tutor's runs are not the medical pack's
    bad = export("--format", "grpo", "--out", str(out))
    assert bad.exit_code == 2 and "one of trl-grpo, dpo, kto, sft" in bad.output
    csv = export("--format", "dpo", "--out", str(tmp_path / "x.csv"))
    assert csv.exit_code == 2 and "a .parquet or a .jsonl file" in csv.output
    when = export("--format", "dpo", "--out", str(out), "--since", "yesterday")
    assert when.exit_code == 2 and "give a span (7d, 12h, 30m)" in when.output
    assert parse_since("2h", 10_000.0) == 10_000.0 - 7200
    assert parse_since("1970-01-02", 0.0) == 86_400.0


def test_runs_logged_without_scrubbing_are_refused_unless_scrubbed_now(
    start_api, llm, redis_url, tmp_path
):
    api = start_api(scrub_phi=False)
    _log_traffic(api, llm, phone_in=f" My number is {PHONE}.")
    _read_into_store(redis_url, tmp_path / "data")
    env = {"ARLOOP_DATA_DIR": str(tmp_path / "data"), "ARLOOP_REDIS_URL": redis_url}
    out = tmp_path / "grpo.jsonl"
    refused = runner.invoke(app, ["export", "--format", "trl-grpo", "--out", str(out)], env=env)
    assert refused.exit_code == 1 and "hold text the PHI scrubber still finds" in refused.output
    assert PHONE not in refused.output and not out.exists()  # nothing written, nothing echoed
    args = ["export", "--format", "trl-grpo", "--out", str(out), "--scrub"]
    scrubbed = runner.invoke(app, args, env=env)
    assert scrubbed.exit_code == 0 and PHONE not in out.read_text() and "[PHONE]" in out.read_text()


def test_no_learner_store_says_where_it_looked(tmp_path):
    env = {"ARLOOP_DATA_DIR": str(tmp_path)}
    result = runner.invoke(app, ["export", "--format", "dpo", "--out", "x.jsonl"], env=env)
    assert result.exit_code == 2 and "no learner store at" in result.output


def test_trls_trainers_take_the_exported_datasets_for_a_step(exported):
    from trl import (
        DPOConfig,
        DPOTrainer,
        GRPOConfig,
        GRPOTrainer,
        KTOConfig,
        KTOTrainer,
        SFTConfig,
        SFTTrainer,
    )

    export, tmp_path = exported
    model = str(save_tiny_model(tmp_path / "tiny"))
    args = {"max_steps": 1, "per_device_train_batch_size": 2, "report_to": "none"}
    args |= {"use_cpu": True, "save_strategy": "no", "learning_rate": 1e-2}
    seen: list[float] = []

    def logged(prompts, completions, reward, **_):  # GRPO hands each row's reward column over
        seen.extend(reward)
        return list(reward)

    trainers = {
        "dpo": lambda d, o: DPOTrainer(model, args=DPOConfig(o, **args), train_dataset=d),
        "kto": lambda d, o: KTOTrainer(model, args=KTOConfig(o, **args), train_dataset=d),
        "sft": lambda d, o: SFTTrainer(model, args=SFTConfig(o, **args), train_dataset=d),
        "trl-grpo": lambda d, o: GRPOTrainer(
            model,
            reward_funcs=logged,
            args=GRPOConfig(o, num_generations=2, max_completion_length=8, **args),
            train_dataset=d,
        ),
    }
    before = list(AutoModelForCausalLM.from_pretrained(model).parameters())
    rewards: list[float] = []
    for fmt, make in trainers.items():
        out = tmp_path / f"{fmt}.parquet"
        assert export("--format", fmt, "--out", str(out)).exit_code == 0
        data = load_dataset("parquet", data_files=str(out))["train"]
        rewards += data["reward"] if fmt == "trl-grpo" else []
        trainer = make(data, str(tmp_path / f"run-{fmt}"))
        trainer.train()
        if fmt != "trl-grpo":  # GRPO's logged reward is one per prompt: zero advantage
            moved = any(
                not torch.equal(a, b)
                for a, b in zip(before, trainer.model.parameters(), strict=True)
            )
            assert moved, fmt
    assert seen and set(seen) <= set(rewards)  # the exported rewards reached the reward function
