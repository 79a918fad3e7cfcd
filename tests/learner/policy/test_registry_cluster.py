"""The registry on a real 3-master Redis Cluster: publish, promote and rollback are each one
script on keys of one slot (`{policy}`), fenced by the learner's lease in that same slot.
Before the hash tags the write script met CROSSSLOT (and a plain client MOVED)."""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster

from agents.events import POLICY_ALIASES, POLICY_VERSIONS, STREAM_POLICY, policy_version_key
from deploy.learn.lease import LearnerLease
from learner.gate.release import rollback
from learner.policy.registry import CHAMPION, Fenced, PolicyRegistry, PolicyVersion, VersionStatus


@pytest.fixture
def cluster(cluster_url):
    client = RedisCluster.from_url(cluster_url)
    yield client
    client.close()


def _record(reg: PolicyRegistry, tmp_path) -> PolicyVersion:
    v = reg.next_version()
    ckpt = tmp_path / v
    ckpt.mkdir()
    (ckpt / "adapter_model.safetensors").write_bytes(b"x")
    (ckpt / "adapter_config.json").write_text("{}")
    return PolicyVersion(v, "v0", "tiny", ckpt.as_uri(), "lora")


def test_the_registry_keys_share_one_slot_spread_from_the_streams(cluster):
    slots = {cluster.keyslot(k) for k in (POLICY_ALIASES, POLICY_VERSIONS, STREAM_POLICY)}
    slots.add(cluster.keyslot(policy_version_key("v7")))
    assert len(slots) == 1


def test_publish_promote_and_rollback_on_a_cluster(cluster, tmp_path):
    lease = LearnerLease(cluster, "learner-1@elsewhere:1", ttl_s=30)
    reg = PolicyRegistry(cluster, fence=lease.acquire())
    reg.ensure_base("tiny")
    first, second = _record(reg, tmp_path), None
    reg.publish(first)
    assert reg.promote(first.version, expect="v0", reason="won", actor="t") == "v0"
    second = _record(reg, tmp_path)
    reg.publish(second)
    reg.promote(second.version, expect=first.version, reason="won", actor="t")
    assert rollback(reg, actor="ops", reason="worse live") == (second.version, first.version)
    assert reg.aliases() == {CHAMPION: first.version}
    assert reg.get(second.version).status is VersionStatus.RETIRED
    assert reg.get(first.version).status is VersionStatus.CHAMPION
    assert len(reg.history(count=100)) >= 5


def test_a_fenced_out_learner_writes_nothing_on_a_cluster(cluster, tmp_path):
    first = LearnerLease(cluster, "learner-1@elsewhere:1", ttl_s=30)
    reg = PolicyRegistry(cluster, fence=first.acquire())
    reg.ensure_base("tiny")
    first.release()
    taken = LearnerLease(cluster, "learner-1@elsewhere:2", ttl_s=30).acquire()
    assert taken.value.startswith("2|")  # the token grew
    with pytest.raises(Fenced, match="learner-1@elsewhere:2"):
        reg.publish(_record(reg, tmp_path))
    assert reg.versions()[-1].version == "v0"
