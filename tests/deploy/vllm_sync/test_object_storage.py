"""The vLLM sync with checkpoints on a real S3-compatible server (moto's): an `s3://` version is
fetched, its digest checked, and vLLM loads the fetched folder; a tampered one is never loaded."""

from __future__ import annotations

from learner.policy.registry import CHAMPION, PolicyVersion
from learner.policy.storage import folder_digest, upload_checkpoint
from tests.deploy.policy_server.support import make_lora
from tests.s3_server import s3_client


def _publish_s3(world, bucket: str, seed: int) -> tuple[str, str]:
    """A LoRA uploaded to the bucket and published with its digest, champion; (version, digest)."""
    version = world.registry.next_version()
    folder = make_lora(world.folders / "learner" / version, seed)
    uri, digest = f"s3://{bucket}/ck/{version}", folder_digest(folder)
    upload_checkpoint(folder, uri)
    record = PolicyVersion(version, None, "tiny", uri, "lora", checkpoint_digest=digest)
    world.registry.publish(record)
    expect = world.registry.aliases().get(CHAMPION)
    world.registry.promote(version, expect=expect, reason="test", actor="test")
    return version, digest


def test_an_s3_version_is_fetched_checked_and_loaded_from_the_local_copy(world, s3_bucket):
    world.sync.cache_dir = world.folders / "fetched"
    v1, digest = _publish_s3(world, s3_bucket, seed=1)
    record = world.sync.step()
    assert record.status == "ok", record.problems
    ((name, path),) = world.fake.loras.items()
    assert path == str(world.folders / "fetched" / "checkpoints" / f"{v1}-{digest[7:23]}")
    assert folder_digest(path) == digest
    assert record.routes[CHAMPION] == name and record.serving[CHAMPION] == v1
    assert record.digests[v1] == digest[:23]

    v2, expected = _publish_s3(world, s3_bucket, seed=2)
    other = make_lora(world.folders / "other", seed=3)
    key = f"ck/{v2}/adapter_model.safetensors"
    s3_client().upload_file(str(other / "adapter_model.safetensors"), s3_bucket, key)
    record = world.sync.step()
    assert record.routes[CHAMPION] == name and record.serving[CHAMPION] == v1  # the last good
    (problem,) = record.problems
    assert f"champion {v2} not delivered" in problem and expected in problem
    assert "registry recorded" in problem
    assert len(world.fake.loras) == 1  # the tampered adapter never reached vLLM
