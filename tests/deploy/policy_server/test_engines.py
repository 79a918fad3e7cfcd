"""Which engine the policy server picks, and why it says so when it cannot take llama.cpp."""

import logging

import pytest
from transformers import GPT2Config, GPT2LMHeadModel

from deploy.policy_server.engines import EngineUnavailable, choose_engine
from learner.policy.tiny_model import build_tokenizer
from tests.deploy.policy_server.support import needs_llamacpp
from tests.model_cache import MODEL_CACHE


def _settings(**values):
    from deploy.policy_server.settings import PolicyServerSettings

    return PolicyServerSettings(_env_file=None, model_cache=MODEL_CACHE, **values)


@needs_llamacpp
def test_auto_takes_llama_cpp_for_a_llama_model_on_the_cpu():
    assert choose_engine(_settings(base_model="tiny")) == "llamacpp"
    assert choose_engine(_settings(base_model="tiny", policy_engine="transformers")) == (
        "transformers"
    )


def test_auto_falls_back_to_transformers_and_says_why(caplog):
    with caplog.at_level(logging.WARNING, logger="deploy.policy_server.engines"):
        assert choose_engine(_settings(base_model="tiny", device="cuda:0")) == "transformers"
    assert "policy engine: transformers, not llama.cpp" in caplog.text


@needs_llamacpp
def test_a_model_llama_cpp_cannot_take_is_transformers_or_a_clear_error(tmp_path, caplog):
    folder = tmp_path / "gpt2-tiny"
    config = GPT2Config(vocab_size=469, n_positions=64, n_embd=32, n_layer=1, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    with caplog.at_level(logging.WARNING, logger="deploy.policy_server.engines"):
        assert choose_engine(_settings(base_model=str(folder))) == "transformers"
    assert "Llama-architecture" in caplog.text and "'gpt2'" in caplog.text
    with pytest.raises(EngineUnavailable, match="ARLOOP_POLICY_ENGINE=llamacpp cannot run"):
        choose_engine(_settings(base_model=str(folder), policy_engine="llamacpp"))
