"""The batching engine on its own: exact logprobs under left padding, per-row parameters."""

import threading
from types import SimpleNamespace

import pytest
import torch

from learner.logprobs import completion_logprobs
from learner.policy.generation.engine import (
    FinishEvent,
    GenerationEngine,
    Row,
    SamplingParams,
    TokenEvent,
)
from learner.policy.generation.rows import penalise, safe_len
from learner.policy.models import load_base
from tests.model_cache import MODEL_CACHE


class Collector:
    """Events of some rows, gathered from the engine thread."""

    def __init__(self, rows: int) -> None:
        self.events, self.left, self.done = [], rows, threading.Event()
        self.lock = threading.Lock()

    def emit(self, event) -> None:
        with self.lock:
            self.events.append(event)
            if isinstance(event, FinishEvent):
                self.left -= 1
                if self.left == 0:
                    self.done.set()

    def finishes(self) -> dict[int, FinishEvent]:
        assert self.done.wait(60), "engine did not finish the rows"
        return {e.index: e for e in self.events if isinstance(e, FinishEvent)}


@pytest.fixture(scope="module")
def policy():
    model, tok = load_base("tiny", cache_dir=MODEL_CACHE)
    return SimpleNamespace(model=model, tokenizer=tok)


@pytest.fixture
def engine():
    batches = []
    eng = GenerationEngine(max_batch_size=8, batch_window_s=0.05, on_batch=batches.append)
    eng.batches = batches
    eng.start()
    yield eng
    eng.stop()


def _prompt(tok, text: str) -> list[int]:
    return tok(
        f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )["input_ids"]


def _run(engine, policy, prompts, params, stream=False) -> dict[int, FinishEvent]:
    got = Collector(len(prompts))
    rows = [
        Row(policy, p, sp, got.emit, index=i, stream=stream)
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
    ]
    engine.submit(rows)
    return got.finishes(), got


def test_batched_rows_of_different_lengths_have_exact_logprobs(engine, policy):
    tok = policy.tokenizer
    prompts = [
        _prompt(tok, "hi"),
        _prompt(tok, "What is 12 plus 30? Use the calculator tool."),
        _prompt(tok, "A patient reports a headache"),
    ]
    params = [
        SamplingParams(temperature=0.0, max_tokens=5),
        SamplingParams(temperature=0.8, max_tokens=12, seed=1),
        SamplingParams(temperature=1.3, top_p=0.9, max_tokens=9, seed=2),
    ]
    out, _ = _run(engine, policy, prompts, params)
    # One prefill for all three (left-padded), then each row leaves when its budget is spent.
    assert engine.batches == [3] * 5 + [2] * 4 + [1] * 3
    for i, p in enumerate(prompts):
        f = out[i]
        assert len(f.token_ids) == params[i].max_tokens and f.finish_reason == "length"
        ref = completion_logprobs(policy.model, p, f.token_ids, tok.pad_token_id)
        torch.testing.assert_close(torch.tensor(f.logprobs), ref, atol=1e-4, rtol=0)


def test_greedy_is_argmax_and_top_logprobs_are_sorted(engine, policy):
    p = _prompt(policy.tokenizer, "hello")
    out, _ = _run(
        engine, policy, [p], [SamplingParams(temperature=0.0, max_tokens=6, top_logprobs=3)]
    )
    f = out[0]
    for token, lp, top in zip(f.token_ids, f.logprobs, f.tops, strict=True):
        assert top[0][0] == token and top[0][1] == pytest.approx(lp)
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)


def test_a_seed_fixes_the_sample_whatever_else_is_batched(engine, policy):
    tok = policy.tokenizer
    p = _prompt(tok, "Think step by step")
    sp = SamplingParams(temperature=1.0, max_tokens=10, seed=7)
    alone, _ = _run(engine, policy, [p], [sp])
    other = _prompt(tok, "yes no thanks good bad correct wrong sorry")
    before = len(engine.batches)
    together, _ = _run(engine, policy, [p, other], [sp, SamplingParams(max_tokens=3)])
    assert engine.batches[before] == 2
    assert alone[0].token_ids == together[0].token_ids
    unseeded, _ = _run(engine, policy, [p, p], [SamplingParams(max_tokens=10)] * 2)
    assert unseeded[0].token_ids != unseeded[1].token_ids  # 10 tokens from ~300: never equal


def test_tiny_top_p_is_greedy(engine, policy):
    p = _prompt(policy.tokenizer, "Use the calculator")
    greedy, _ = _run(engine, policy, [p], [SamplingParams(temperature=0.0, max_tokens=8)])
    nucleus, _ = _run(
        engine, policy, [p], [SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=8, seed=3)]
    )
    assert greedy[0].token_ids == nucleus[0].token_ids


def test_stop_string_cuts_text_and_finishes_the_row(engine, policy):
    p = _prompt(policy.tokenizer, "What is 12 plus 30?")
    free, _ = _run(engine, policy, [p], [SamplingParams(temperature=0.0, max_tokens=12)])
    text = free[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip("\ufffd") == stop and len(stop) == 2
    out, got = _run(
        engine,
        policy,
        [p],
        [SamplingParams(temperature=0.0, max_tokens=12, stop=(stop,))],
        stream=True,
    )
    f = out[0]
    assert f.finish_reason == "stop" and stop not in f.text and text.startswith(f.text)
    assert text.find(stop) == len(f.text)
    streamed = "".join(e.text for e in got.events if isinstance(e, TokenEvent))
    assert streamed == f.text  # nothing of the stop string ever reached the client


def test_rows_finish_independently_at_eos(engine, policy):
    tok = policy.tokenizer
    p = _prompt(tok, "hi")
    ref, _ = _run(engine, policy, [p], [SamplingParams(temperature=0.0, max_tokens=4)])
    # Make the greedy continuation's third token the end of turn for one policy copy.
    eos_model = _with_eos_after(policy, p, ref[0].token_ids[:2])
    out, _ = _run(engine, eos_model, [p, p], [SamplingParams(temperature=0.0, max_tokens=30)] * 2)
    for f in out.values():
        assert f.finish_reason == "stop" and f.token_ids[-1] == tok.eos_token_id


def test_policies_batch_separately(policy):
    batches = []
    eng = GenerationEngine(max_batch_size=8, batch_window_s=0.1, on_batch=batches.append)
    other = SimpleNamespace(
        model=load_base("tiny", cache_dir=MODEL_CACHE)[0], tokenizer=policy.tokenizer
    )
    with torch.no_grad():
        other.model.model.norm.weight.mul_(3.0)  # a visibly different distribution
    got = Collector(4)
    p = _prompt(policy.tokenizer, "hi")
    rows = [
        Row(pol, p, SamplingParams(temperature=0.0, max_tokens=4), got.emit, index=i, stream=False)
        for i, pol in enumerate([policy, other, policy, other])
    ]
    eng.submit(rows)
    eng.start()
    out = got.finishes()
    eng.stop()
    assert batches == [2] * 8  # two batches of two rows, four forward passes each
    for i, pol in enumerate([policy, other, policy, other]):
        ref = completion_logprobs(pol.model, p, out[i].token_ids, policy.tokenizer.pad_token_id)
        torch.testing.assert_close(torch.tensor(out[i].logprobs), ref, atol=1e-4, rtol=0)


def test_rows_join_a_running_batch_with_exact_logprobs(engine, policy):
    tok = policy.tokenizer
    long_prompt = _prompt(tok, "What is 12 plus 30? Use the calculator tool. Think step by step.")
    first = Collector(1)
    started = threading.Event()

    def emit(event):
        first.emit(event)
        if isinstance(event, TokenEvent) and len(first.events) >= 3:
            started.set()

    engine.submit(
        [Row(policy, _prompt(tok, "hi"), SamplingParams(temperature=0.0, max_tokens=40), emit)]
    )
    assert started.wait(30)
    out, _ = _run(
        engine, policy, [long_prompt], [SamplingParams(temperature=0.9, max_tokens=8, seed=4)]
    )
    assert 2 in engine.batches  # the newcomer decoded beside the running row
    running = first.finishes()[0]
    for prompt, f in ((_prompt(tok, "hi"), running), (long_prompt, out[0])):
        ref = completion_logprobs(policy.model, prompt, f.token_ids, tok.pad_token_id)
        torch.testing.assert_close(torch.tensor(f.logprobs), ref, atol=1e-4, rtol=0)


def test_another_version_waits_for_the_running_batch_not_behind_joiners(engine, policy):
    other = SimpleNamespace(
        model=load_base("tiny", cache_dir=MODEL_CACHE)[0], tokenizer=policy.tokenizer
    )
    p = _prompt(policy.tokenizer, "hi")
    got, started = Collector(3), threading.Event()

    def emit(event):
        got.emit(event)
        started.set()

    greedy = SamplingParams(temperature=0.0, max_tokens=20)
    before = len(engine.batches)
    engine.submit([Row(policy, p, greedy, emit, index=0)])
    assert started.wait(30)
    engine.submit([Row(other, p, greedy, got.emit, index=1, stream=False)])
    engine.submit([Row(policy, p, greedy, got.emit, index=2, stream=False)])
    got.finishes()
    finished = [e.index for e in got.events if isinstance(e, FinishEvent)]
    assert finished == [0, 1, 2]  # the waiting version went first; the late row did not join
    assert engine.batches[before:] == [1] * 60


def test_a_failing_model_fails_its_rows_and_the_engine_goes_on(engine, policy):
    broken = SimpleNamespace(model=_Raises(policy.model), tokenizer=policy.tokenizer)
    p = _prompt(policy.tokenizer, "hi")
    out, _ = _run(engine, broken, [p], [SamplingParams(max_tokens=3)])
    assert out[0].finish_reason == "error" and "boom" in out[0].error
    greedy = SamplingParams(temperature=0.0, max_tokens=3)  # unseeded sampling may stop early
    ok, _ = _run(engine, policy, [p], [greedy])
    assert ok[0].finish_reason == "length"


@pytest.mark.parametrize(
    "text, stops, safe",
    [
        ("abc", (), 3),
        ("ab\ufffd", (), 2),
        ("hello wor", ("world",), 6),
        ("hello", ("xyz",), 5),
        ("a##", ("###",), 1),
    ],
)
def test_safe_len_holds_back_partial_characters_and_stop_prefixes(text, stops, safe):
    assert safe_len(text, stops) == safe


class _Raises(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, **kwargs):
        raise RuntimeError("boom")


def _with_eos_after(policy, prompt, prefix):
    """The policy, but its greedy output ends right after `prefix`."""
    return SimpleNamespace(
        model=_EosAfter(policy.model, prefix[-1], policy.tokenizer.eos_token_id),
        tokenizer=policy.tokenizer,
    )


class _EosAfter(torch.nn.Module):
    """The model, but after token `last` the end-of-turn token wins (a logit bias)."""

    def __init__(self, model, last: int, eos: int) -> None:
        super().__init__()
        self.model, self.last, self.eos = model, last, eos
        self.config, self.generation_config = model.config, model.generation_config

    def forward(self, input_ids, **kwargs):
        out = self.model(input_ids=input_ids, **kwargs)
        hit = input_ids[:, -1] == self.last  # (B,)
        out.logits[hit, -1, self.eos] += 100.0
        return out


def test_penalties_are_openais_by_hand():
    """mu[j] - c[j] * frequency - (c[j] > 0) * presence, on the completion's own counts."""
    logits = torch.tensor([1.0, 2.0, 3.0, 0.5])
    counts = torch.tensor([0.0, 1.0, 3.0, 0.0])
    out = penalise(logits, counts, frequency=0.5, presence=0.25)
    assert out.tolist() == [1.0, 2.0 - 0.5 - 0.25, 3.0 - 1.5 - 0.25, 0.5]
    assert penalise(logits, counts, 0.0, 0.0).tolist() == logits.tolist()


def test_a_presence_penalty_stops_greedy_repeats_and_logprobs_stay_the_models(engine, policy):
    model, tok = policy.model, policy.tokenizer
    prompt = tok("a b a b a b a b", add_special_tokens=False)["input_ids"]
    plain, penalised = Collector(1), Collector(1)
    engine.submit(
        [Row(policy, prompt, SamplingParams(0.0, max_tokens=12), plain.emit, stream=False)]
    )
    free = plain.finishes()[0]
    assert len(set(free.token_ids)) < len(free.token_ids), "precondition: greedy repeats a token"
    params = SamplingParams(0.0, max_tokens=12, presence_penalty=100.0)
    engine.submit([Row(policy, prompt, params, penalised.emit, stream=False)])
    done = penalised.finishes()[0]
    assert len(set(done.token_ids)) == len(done.token_ids)  # each token at most once
    own = completion_logprobs(model, prompt, done.token_ids, tok.pad_token_id)
    torch.testing.assert_close(torch.tensor(done.logprobs), own, atol=1e-4, rtol=0)


def test_include_stop_keeps_the_stop_string(engine, policy):
    prompt = policy.tokenizer("hello there", add_special_tokens=False)["input_ids"]
    free = Collector(1)
    engine.submit(
        [Row(policy, prompt, SamplingParams(0.0, max_tokens=10), free.emit, stream=False)]
    )
    text = free.finishes()[0].text
    stop = text[3:5]
    kept = Collector(1)
    params = SamplingParams(0.0, max_tokens=10, stop=(stop,), include_stop=True)
    engine.submit([Row(policy, prompt, params, kept.emit, stream=False)])
    done = kept.finishes()[0]
    assert done.finish_reason == "stop" and done.text == text[: text.find(stop) + len(stop)]
