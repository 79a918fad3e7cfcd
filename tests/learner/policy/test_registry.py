import pytest

from agents.events import PolicyAliasMoved, PolicyPublished
from learner.policy.registry import (
    CANDIDATE,
    CHAMPION,
    AliasConflict,
    PolicyRegistry,
    PolicyVersion,
    UnknownVersion,
    VersionStatus,
)


def _version(reg: PolicyRegistry, parent="v0") -> PolicyVersion:
    v = reg.next_version()
    return PolicyVersion(
        version=v,
        parent=parent,
        base_model="tiny",
        checkpoint_uri=f"file:///ckpt/{v}",
        checkpoint_kind="lora",
    )


def test_base_is_registered_once_as_champion(redis_client):
    reg = PolicyRegistry(redis_client)
    first = reg.ensure_base("tiny")
    again = reg.ensure_base("tiny")
    assert first.version == again.version == "v0"
    assert reg.aliases() == {CHAMPION: "v0"}
    assert [type(e) for e in reg.history()] == [PolicyPublished, PolicyAliasMoved]


def test_publish_then_move_alias_compare_and_set(redis_client):
    reg = PolicyRegistry(redis_client)
    reg.ensure_base("tiny")
    rec = _version(reg)
    reg.publish(rec)
    assert reg.get(rec.version).status is VersionStatus.READY
    assert reg.move_alias(CHAMPION, rec.version, expect="v0", reason="test", actor="t") == "v0"
    assert reg.resolve(CHAMPION) == rec.version
    # A second writer that still believes v0 is champion loses.
    with pytest.raises(AliasConflict):
        reg.move_alias(CHAMPION, "v0", expect="v0", reason="late", actor="other")
    assert reg.resolve(CHAMPION) == rec.version


def test_candidate_only_if_unset_and_clear(redis_client):
    reg = PolicyRegistry(redis_client)
    reg.ensure_base("tiny")
    a, b = _version(reg), _version(reg)
    reg.publish(a)
    reg.publish(b)
    reg.move_alias(CANDIDATE, a.version, expect="", reason="gate", actor="learner-1")
    with pytest.raises(AliasConflict):
        reg.move_alias(CANDIDATE, b.version, expect="", reason="gate", actor="learner-2")
    reg.move_alias(CANDIDATE, None, expect=a.version, reason="promoted", actor="t")
    assert CANDIDATE not in reg.aliases()


def test_unknown_versions_are_refused(redis_client):
    reg = PolicyRegistry(redis_client)
    reg.ensure_base("tiny")
    with pytest.raises(UnknownVersion):
        reg.resolve("v99")
    with pytest.raises(UnknownVersion):
        reg.move_alias(CHAMPION, "v99", reason="x", actor="t")
    assert reg.resolve(CHAMPION) == "v0"
