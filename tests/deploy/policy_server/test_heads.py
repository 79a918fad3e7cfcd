"""`POST /v1/heads/{name}`: the head of the version a model string names, on the base's states."""

from __future__ import annotations

import httpx
import pytest
import redis

from learner.policy.heads import Head, features, fit, head_layer, write_heads
from learner.policy.models import load_base
from learner.policy.registry import PolicyRegistry
from tests.deploy.policy_server.support import make_lora, publish, running_server, tiny_settings
from tests.model_cache import MODEL_CACHE

TEXTS = {
    "calm": ["I have a mild cold", "my nose is a bit runny", "slight cough since yesterday"],
    "alarm": ["crushing chest pain now", "I cannot breathe at all", "he collapsed and is blue"],
}


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory):
    """v1: a LoRA version carrying a `level` head fitted on TEXTS; v2: one without heads;
    the champion: the base, v0."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    model, tokenizer = load_base("tiny", cache_dir=MODEL_CACHE)
    layer = head_layer(model.config)
    rows = [(f"{label}-{i}", label, t) for label, ts in TEXTS.items() for i, t in enumerate(ts)]
    x = features(model, tokenizer, [t for _, _, t in rows], layer)
    head = fit(
        Head("level", list(TEXTS), layer).with_examples(
            [(p, y, x[i]) for i, (p, y, _) in enumerate(rows)]
        )
    )
    with_head = make_lora(tmp_path_factory.mktemp("v1") / "adapter", seed=1)
    write_heads(with_head, {"level": head})
    registry = PolicyRegistry(client)
    publish(registry, "lora", with_head, champion=False)
    publish(
        registry,
        "lora",
        make_lora(tmp_path_factory.mktemp("v2") / "adapter", seed=2),
        champion=False,
    )
    with running_server(tiny_settings(redis_server.url)) as base:
        yield base, head, (model, tokenizer)
    client.close()


def test_a_versions_head_labels_a_message_as_the_learner_reads_it(server):
    base, head, (model, tokenizer) = server
    text = "sudden crushing pain in my chest"
    answer = httpx.post(f"{base}/heads/level", json={"model": "arloop@v1", "input": text})

    assert answer.status_code == 200, answer.text
    body = answer.json()
    expected, probs = head.predict(features(model, tokenizer, [text], head.layer)[0])
    assert body["version"] == "v1" and body["label"] == expected
    assert body["probabilities"] == pytest.approx(probs, abs=1e-3)
    assert body["probability"] == pytest.approx(probs[expected], abs=1e-3)


def test_the_head_separates_what_it_was_fitted_on(server):
    base, _, _ = server
    said = {
        t: httpx.post(f"{base}/heads/level", json={"model": "arloop@v1", "input": t}).json()[
            "label"
        ]
        for ts in TEXTS.values()
        for t in ts
    }
    assert said == {t: label for label, ts in TEXTS.items() for t in ts}


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("level", {"model": "arloop@v2", "input": "hi"}, 404),  # a version without heads
        ("level", {"model": "arloop", "input": "hi"}, 404),  # the base: no heads
        ("other", {"model": "arloop@v1", "input": "hi"}, 404),  # no head of that name
        ("level", {"model": "arloop@v99", "input": "hi"}, 404),
        ("level", {"model": "gpt-4", "input": "hi"}, 404),
        ("level", {"model": "arloop"}, 400),
        ("level", {"model": "arloop", "input": "x" * 20_000}, 400),
        ("level", {"model": "arloop", "input": "hi", "extra": 1}, 400),
    ],
)
def test_what_has_no_head_or_is_malformed_gets_a_clear_error(server, path, body, status):
    base, _, _ = server
    answer = httpx.post(f"{base}/heads/{path}", json=body)

    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["message"]
