"""The learner's lease: one holder, a fencing token that only grows, registry writes refused
to a holder that lost it, and a dead holder's lease taken over without waiting."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agents.events import LEARNER_LEASE
from deploy.learn.lease import LearnerLease, LeaseHeld, holder_name
from learner.policy.registry import CHAMPION, Fenced, PolicyRegistry, PolicyVersion


def test_one_holder_at_a_time_and_the_token_grows(redis_client):
    first = LearnerLease(redis_client, "learner-1@elsewhere:1", ttl_s=30)
    second = LearnerLease(redis_client, "learner-1@elsewhere:2", ttl_s=30)
    fence = first.acquire()
    assert fence.value == "1|learner-1@elsewhere:1" and first.acquire() == fence  # idempotent
    with pytest.raises(LeaseHeld, match=r"learner-1@elsewhere:1 \(fencing token 1\)"):
        second.acquire()
    first.release()
    assert second.acquire().value.startswith("2|")
    assert not first.renew()  # the old holder learns it is out


def test_a_lease_whose_holder_died_on_this_host_is_taken_at_once(redis_client):
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    dead = holder_name("learner-1").rsplit(":", 1)[0] + ":" + gone.stdout.decode().strip()
    redis_client.set(LEARNER_LEASE, f"5|{dead}", px=30_000)
    lease = LearnerLease(redis_client, holder_name("learner-1"), ttl_s=30)
    assert lease.acquire().value.startswith("1|")  # a new token: the dead one is fenced out


def test_registry_writes_of_a_fenced_out_learner_are_refused(redis_client):
    lease = LearnerLease(redis_client, "learner-1@elsewhere:1", ttl_s=30)
    registry = PolicyRegistry(redis_client, fence=lease.acquire())
    registry.ensure_base("tiny")
    record = PolicyVersion("v1", "v0", "tiny", "file:///nowhere", "lora")
    registry.publish(record)
    redis_client.set(LEARNER_LEASE, "2|learner-1@elsewhere:2", px=30_000)  # another took it
    with pytest.raises(Fenced, match="now held by learner-1@elsewhere:2"):
        registry.promote("v1", expect="v0", reason="round", actor="learner-1")
    with pytest.raises(Fenced):
        registry.check_fence()
    unfenced = PolicyRegistry(redis_client)  # an operator's CLI is not fenced
    assert unfenced.aliases()[CHAMPION] == "v0"
    unfenced.promote("v1", expect="v0", reason="operator", actor="cli")
    assert unfenced.aliases()[CHAMPION] == "v1"
