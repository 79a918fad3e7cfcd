"""Prompt-prefix reuse in the engine: same tokens and logprobs as a plain prefill, fewer tokens run."""

from types import SimpleNamespace

import pytest
import torch

from learner.logprobs import completion_logprobs
from learner.policy.generation.engine import GenerationEngine, SamplingParams
from learner.policy.generation.prefix_cache import (
    MIN_PREFIX,
    PrefixCache,
    common_prefix_len,
    last_turn_start,
    turn_marker,
)
from learner.policy.models import load_base
from tests.learner.policy.test_engine import _prompt, _run
from tests.model_cache import MODEL_CACHE

HEAD = (
    "You are a maths tutor. Solve the problem, use the calculator, and end with a line "
    "'#### <number>'. Example: a farmer has 12 apples and buys 30 more. "
)
ASKS = ["How many now?", "What is 62 minus 18?", "Share 324 among 9.", "Seven boxes of 23?"]


@pytest.fixture(scope="module")
def policy():
    model, tok = load_base("tiny", cache_dir=MODEL_CACHE)
    return SimpleNamespace(model=model, tokenizer=tok)


def _engine(entries: int, alone: bool = False) -> GenerationEngine:
    eng = GenerationEngine(
        max_batch_size=8, batch_window_s=0.05, prefix_entries=entries, cache_alone=alone
    )
    eng.start()
    return eng


def _generate(policy, entries: int, asks, params):
    eng = _engine(entries)
    try:
        prompts = [_prompt(policy.tokenizer, HEAD + a) for a in asks]
        out, _ = _run(eng, policy, prompts, params)
        out2, _ = _run(eng, policy, prompts[::-1], params)  # a second batch: the head is cached
        return prompts, out, out2, eng.prefixes
    finally:
        eng.stop()


def test_common_prefix_leaves_every_prompt_a_token():
    assert common_prefix_len([[1, 2, 3, 4], [1, 2, 5]]) == 2
    assert common_prefix_len([[1, 2, 3], [1, 2, 3]]) == 2
    assert common_prefix_len([[7], [7, 8]]) == 0


def test_reused_heads_give_the_same_tokens_and_exact_logprobs(policy):
    greedy = [SamplingParams(temperature=0.0, max_tokens=8)] * len(ASKS)
    prompts, plain, plain2, none = _generate(policy, 0, ASKS, greedy)
    _, cached, cached2, prefixes = _generate(policy, 8, ASKS, greedy)
    assert none is None and prefixes.misses == 1 and prefixes.hits >= 1
    assert common_prefix_len(prompts) >= MIN_PREFIX
    for i in range(len(ASKS)):
        assert cached[i].token_ids == plain[i].token_ids
        assert cached2[i].token_ids == plain2[i].token_ids
        recomputed = completion_logprobs(
            policy.model, prompts[i], cached[i].token_ids, policy.tokenizer.pad_token_id
        )
        assert torch.allclose(torch.tensor(cached[i].logprobs), recomputed, atol=1e-4)


def test_sampled_rows_keep_their_seeds_with_a_cached_head(policy):
    sampled = [SamplingParams(temperature=1.0, max_tokens=6, seed=s) for s in range(len(ASKS))]
    _, plain, _, _ = _generate(policy, 0, ASKS, sampled)
    _, cached, _, _ = _generate(policy, 8, ASKS, sampled)
    assert [cached[i].token_ids for i in range(len(ASKS))] == [
        plain[i].token_ids for i in range(len(ASKS))
    ]


def test_short_heads_and_single_rows_make_no_entry(policy):
    cache, tok = PrefixCache(), policy.tokenizer
    assert cache.head(policy.model, [_prompt(tok, "hi"), _prompt(tok, "ho")]) == (0, None)
    assert cache.head(policy.model, [_prompt(tok, HEAD + "x")]) == (0, None)
    head, layers = cache.head(policy.model, [_prompt(tok, HEAD + a) for a in ASKS[:2]])
    assert head >= MIN_PREFIX and len(layers) == policy.model.config.num_hidden_layers
    # a single row that starts with the cached head now reuses it
    assert cache.head(policy.model, [_prompt(tok, HEAD + "y")])[0] == head


def test_entries_are_per_model_and_evicted_oldest_first(policy):
    other, _ = load_base("tiny", cache_dir=MODEL_CACHE)
    cache, tok = PrefixCache(max_entries=1), policy.tokenizer
    pair = [_prompt(tok, HEAD + a) for a in ASKS[:2]]
    cache.head(policy.model, pair)
    assert cache.head(other, pair)[0] > 0 and cache.misses == 2  # not the first model's entry
    cache.head(policy.model, pair)
    assert cache.misses == 3  # evicted by the other model's entry


def _chat(tok, system: str, user: str) -> list[int]:
    return tok(
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n",
        add_special_tokens=False,
    )["input_ids"]


def test_a_row_alone_caches_its_head_before_the_user_turn(policy):
    """One user at a time: the system turn is computed once, and logprobs stay exact."""
    cache, tok = PrefixCache(), policy.tokenizer
    assert turn_marker(tok), "precondition: the tiny tokenizer speaks ChatML"
    first, second = _chat(tok, HEAD, ASKS[0]), _chat(tok, HEAD, ASKS[1])
    head, layers = cache.head(policy.model, [first], turn_marker(tok))
    assert head == last_turn_start(first, turn_marker(tok)) >= MIN_PREFIX
    assert first[:head] == second[:head] and cache.misses == 1
    assert cache.head(policy.model, [second], turn_marker(tok))[0] == head and cache.hits == 1
    eng = _engine(8, alone=True)
    try:
        params = [SamplingParams(temperature=0.0, max_tokens=6)]
        out, _ = _run(eng, policy, [first], params)
        again, _ = _run(eng, policy, [second], params)
        assert eng.prefixes.hits >= 1
    finally:
        eng.stop()
    for prompt, done in ((first, out[0]), (second, again[0])):
        ref = completion_logprobs(policy.model, prompt, done.token_ids, tok.pad_token_id)
        torch.testing.assert_close(torch.tensor(done.logprobs), ref, atol=1e-4, rtol=0)
