"""Decision heads: fitted deterministically, a prompt's latest label wins, features as served."""

from __future__ import annotations

import torch

from learner.policy.heads import (
    Head,
    features,
    fit,
    head_layer,
    prompt_digest,
    read_heads,
    write_heads,
)
from learner.policy.models import load_base
from tests.model_cache import MODEL_CACHE

LABELS = ["low", "mid", "high"]


def _clusters(n: int, seed: int = 0) -> list[tuple[str, str, torch.Tensor]]:
    """n examples per label, around three separated centres in 8 dimensions."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.eye(8, dtype=torch.float64)[:3] * 4
    return [
        (f"p{k}-{i}", label, centres[k] + torch.randn(8, generator=gen, dtype=torch.float64))
        for k, label in enumerate(LABELS)
        for i in range(n)
    ]


def test_a_fitted_head_reads_the_labels_of_new_points():
    head = fit(Head("level", LABELS, 1).with_examples(_clusters(6)))
    test = _clusters(20, seed=1)

    right = sum(head.predict(x)[0] == y for _, y, x in test)
    assert right / len(test) >= 0.9
    label, probs = head.predict(test[0][2])
    assert set(probs) == set(LABELS) and abs(sum(probs.values()) - 1) < 1e-3


def test_fitting_is_deterministic():
    a = fit(Head("level", LABELS, 1).with_examples(_clusters(4)))
    b = fit(Head("level", LABELS, 1).with_examples(_clusters(4)))
    assert a.weight == b.weight and a.bias == b.bias


def test_a_prompt_labelled_again_keeps_only_its_latest_label():
    x = torch.ones(8, dtype=torch.float64)
    head = Head("level", LABELS, 1).with_examples([("p", "low", x), ("q", "mid", x)])
    head = head.with_examples([("p", "high", x), ("r", "not a label", x)])

    assert [(e["prompt"], e["label"]) for e in head.examples] == [("q", "mid"), ("p", "high")]


def test_one_label_alone_fits_nothing():
    head = fit(Head("level", LABELS, 1).with_examples(_clusters(3)[:3]))
    assert not head.fitted and len(head.examples) == 3


def test_heads_survive_their_file(tmp_path):
    head = fit(Head("level", LABELS, 1).with_examples(_clusters(3)))
    write_heads(tmp_path, {"level": head})

    again = read_heads(tmp_path)["level"]
    x = _clusters(1, seed=5)[0][2]
    assert again.predict(x) == head.predict(x)
    assert read_heads(tmp_path / "nothing") == {} and read_heads(None) == {}


def test_features_of_a_text_do_not_depend_on_the_others_read_with_it():
    model, tokenizer = load_base("tiny", cache_dir=MODEL_CACHE)
    layer = head_layer(model.config)
    together = features(model, tokenizer, ["a short one", "and a somewhat longer message"], layer)
    alone = features(model, tokenizer, ["and a somewhat longer message"], layer)

    assert together.shape == (2, model.config.hidden_size) and together.dtype == torch.float64
    assert torch.equal(together[1], alone[0])
    assert not torch.equal(together[0], together[1])


def test_a_prompt_is_kept_as_a_digest_not_its_text():
    digest = prompt_digest("triage\x1fmy baby is 3 weeks old with a fever")
    assert "baby" not in digest and len(digest) == 32


def test_features_stop_at_their_layer_and_equal_the_full_forwards_hidden_states():
    model, tokenizer = load_base("tiny", cache_dir=MODEL_CACHE)
    layer = head_layer(model.config)
    text = "my ear hurts since this morning"
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        full = model(ids, output_hidden_states=True).hidden_states[layer][0].mean(0).double()

    hooks = dict(model.model.layers[layer - 1]._forward_hooks)

    assert torch.allclose(features(model, tokenizer, [text], layer)[0], full, atol=1e-6)
    assert dict(model.model.layers[layer - 1]._forward_hooks) == hooks  # its hook is gone
