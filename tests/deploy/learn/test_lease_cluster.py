"""The learner's lease on a real 3-master Redis Cluster: the lease and its fencing counter are
taken by one script, so they share the registry's slot (`{policy}`); one holder at a time."""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster

from agents.events import LEARNER_FENCE, LEARNER_LEASE, POLICY_ALIASES
from deploy.learn.lease import LearnerLease, LeaseHeld


@pytest.fixture
def cluster(cluster_url):
    client = RedisCluster.from_url(cluster_url)
    yield client
    client.close()


def test_one_holder_at_a_time_on_a_cluster(cluster):
    assert cluster.keyslot(LEARNER_LEASE) == cluster.keyslot(LEARNER_FENCE)
    assert cluster.keyslot(LEARNER_LEASE) == cluster.keyslot(POLICY_ALIASES)
    first = LearnerLease(cluster, "learner-1@elsewhere:1", ttl_s=30)
    second = LearnerLease(cluster, "learner-1@elsewhere:2", ttl_s=30)
    assert first.acquire().value == "1|learner-1@elsewhere:1"
    with pytest.raises(LeaseHeld, match="fencing token 1"):
        second.acquire()
    assert first.renew()
    first.release()
    assert second.acquire().value.startswith("2|") and not first.renew()
