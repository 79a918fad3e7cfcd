import pytest
import torch
from safetensors.torch import load_file, save_file

from learner.policy.models import (
    CheckpointError,
    load_base,
    load_checkpoint,
    load_version,
    publish_once,
)
from learner.policy.registry import PolicyVersion
from tests.deploy.policy_server.support import make_full, make_lora
from tests.model_cache import MODEL_CACHE

IDS = torch.tensor([[1, 40, 41, 42, 43, 44, 2]])


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _record(uri: str, kind: str, version: str = "v1") -> PolicyVersion:
    return PolicyVersion(
        version=version, parent="v0", base_model="tiny", checkpoint_uri=uri, checkpoint_kind=kind
    )


@pytest.fixture(scope="module")
def base_logits():
    model, _ = load_base("tiny", cache_dir=MODEL_CACHE)
    return _logits(model)


def test_base_uri_loads_the_base(base_logits):
    model, tok = load_version(_record("base:tiny", "base", "v0"), cache_dir=MODEL_CACHE)
    assert torch.equal(_logits(model), base_logits)
    assert tok.pad_token_id is not None


def test_lora_merged_equals_the_adapter_applied(tmp_path, base_logits):
    folder = make_lora(tmp_path / "lora", seed=1)
    record = _record(folder.as_uri(), "lora")
    merged, _ = load_version(record, cache_dir=MODEL_CACHE)
    unmerged, _ = load_version(record, cache_dir=MODEL_CACHE, merge=False)
    assert not hasattr(merged, "peft_config")  # a plain model: decoding costs what the base does
    assert hasattr(unmerged, "peft_config")
    torch.testing.assert_close(_logits(merged), _logits(unmerged), atol=1e-5, rtol=0)
    assert (_logits(merged) - base_logits).abs().max() > 1e-2  # the adapter really changes it


def test_full_checkpoint_keeps_its_weights_and_tokenizer(tmp_path, base_logits):
    folder = make_full(tmp_path / "full", seed=2)
    model, tok = load_version(_record(folder.as_uri(), "full"), cache_dir=MODEL_CACHE)
    again, _ = load_checkpoint(folder, base_model="tiny", cache_dir=MODEL_CACHE)
    assert torch.equal(_logits(model), _logits(again))
    assert (_logits(model) - base_logits).abs().max() > 1e-2
    assert tok.eos_token == "<|im_end|>"


def test_uri_with_spaces_as_path_as_uri_writes_it(tmp_path):
    folder = make_lora(tmp_path / "with space", seed=3)
    assert "%20" in folder.as_uri()
    load_version(_record(folder.as_uri(), "lora"), cache_dir=MODEL_CACHE)


def _corrupt_lora(tmp_path):
    folder = make_lora(tmp_path / "bad-lora", seed=4)
    (folder / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    return folder


def _empty_lora(tmp_path):
    folder = make_lora(tmp_path / "empty-lora", seed=5)
    save_file({"unrelated": torch.zeros(1)}, str(folder / "adapter_model.safetensors"))
    return folder


def _weightless_full(tmp_path):
    folder = make_full(tmp_path / "bad-full", seed=6)
    (folder / "model.safetensors").unlink()
    return folder


def _partial_full(tmp_path):
    folder = make_full(tmp_path / "partial-full", seed=9)
    weights = load_file(str(folder / "model.safetensors"))
    weights = {k: v for k, v in weights.items() if "layers.1.mlp" not in k}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _truncated_full(tmp_path):
    folder = make_full(tmp_path / "short-full", seed=7)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    return folder


@pytest.mark.parametrize(
    "make, kind, needle",
    [
        (_corrupt_lora, "lora", "does not load"),
        (_empty_lora, "lora", "incomplete"),
        (_weightless_full, "full", "does not load"),
        (_truncated_full, "full", "does not load"),
        (_partial_full, "full", "lacks weights"),
        (lambda p: p / "missing", "lora", "does not exist"),
        (lambda p: make_lora(p / "kind", seed=8), "delta", "unknown checkpoint kind"),
    ],
)
def test_broken_checkpoints_raise_checkpoint_error(tmp_path, make, kind, needle):
    folder = make(tmp_path)
    with pytest.raises(CheckpointError, match=needle):
        load_version(_record(folder.as_uri(), kind), cache_dir=MODEL_CACHE)


@pytest.mark.parametrize("uri", ["gs://bucket/v1", "file://relative/v1", "/abs/no/scheme"])
def test_unsupported_uris_are_refused(uri):
    with pytest.raises(CheckpointError, match="URI"):
        load_version(_record(uri, "lora"), cache_dir=MODEL_CACHE)


def test_an_s3_checkpoint_without_a_recorded_digest_is_refused_unfetched():
    with pytest.raises(CheckpointError, match="no digest in the registry"):
        load_version(_record("s3://bucket/v1", "lora"), cache_dir=MODEL_CACHE)


def _finished(folder, text: str):
    folder.mkdir()
    (folder / "model.safetensors").write_text(text)
    return folder


def test_two_processes_converting_the_default_model_at_once_both_end_with_one_cache(tmp_path):
    """The policy server and the learner may both convert SmolLM2 on a first start: each
    saves into its own folder; the first rename publishes, the second keeps the first's."""
    target = tmp_path / "smollm2-135m-instruct"
    first = _finished(tmp_path / "smollm2-135m-instruct.partial-1-1", "first")
    second = _finished(tmp_path / "smollm2-135m-instruct.partial-2-1", "second")
    publish_once(first, target, "model.safetensors")
    publish_once(second, target, "model.safetensors")  # lost the race: no error
    assert (target / "model.safetensors").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_a_publish_that_fails_without_a_complete_cache_raises_and_leaves_nothing(tmp_path):
    target = tmp_path / "cache"
    target.mkdir()
    (target / "stray").write_text("not a model")  # a folder there, but not a finished cache
    partial = _finished(tmp_path / "cache.partial-1-1", "mine")
    with pytest.raises(OSError):
        publish_once(partial, target, "model.safetensors")
    assert not partial.exists()
