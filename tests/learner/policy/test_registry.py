import threading

import pytest

from agents.events import PolicyAliasMoved, PolicyPublished
from learner.policy.registry import (
    CANDIDATE,
    CHAMPION,
    TRANSITIONS,
    AliasConflict,
    IllegalTransition,
    PolicyRegistry,
    PolicyVersion,
    ReleaseError,
    UnknownVersion,
    VersionStatus,
    version_name,
    version_number,
)

S = VersionStatus


@pytest.fixture
def reg(redis_client) -> PolicyRegistry:
    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    return registry


def _version(reg: PolicyRegistry, parent="v0") -> PolicyVersion:
    v = reg.next_version()
    return PolicyVersion(
        version=v,
        parent=parent,
        base_model="tiny",
        checkpoint_uri=f"file:///ckpt/{v}",
        checkpoint_kind="lora",
    )


def _published(reg: PolicyRegistry) -> str:
    record = _version(reg)
    reg.publish(record)
    return record.version


def _promote(reg: PolicyRegistry, version: str) -> None:
    reg.promote(version, expect=reg.aliases().get(CHAMPION), reason="test", actor="t")


def _state(reg: PolicyRegistry) -> tuple:
    """Everything a write could change: aliases, each version's status and error, the events."""
    statuses = {v.version: (v.status, v.error) for v in reg.versions()}
    return reg.aliases(), statuses, len(reg.history(count=1000))


def test_version_names_and_numbers():
    assert version_name(3) == "v3" and version_number(version_name(12)) == 12
    assert [version_number(v) for v in ("v0", "v12", "champion", "v3x", None)] == [
        0,
        12,
        None,
        None,
        None,
    ]


def test_base_is_registered_once_as_champion(redis_client):
    reg = PolicyRegistry(redis_client)
    first = reg.ensure_base("tiny")
    again = reg.ensure_base("tiny")
    assert first.version == again.version == "v0"
    assert reg.aliases() == {CHAMPION: "v0"} and first.status is S.CHAMPION
    assert [type(e) for e in reg.history()] == [PolicyPublished, PolicyAliasMoved]


def test_publish_then_promote_compare_and_set(reg):
    rec = _version(reg)
    reg.publish(rec)
    assert reg.get(rec.version).status is S.READY
    with pytest.raises(ReleaseError, match="already in the registry"):
        reg.publish(rec)
    assert reg.promote(rec.version, expect="v0", reason="test", actor="t") == "v0"
    assert reg.resolve(CHAMPION) == rec.version
    # A second writer that still believes v0 is champion loses.
    other = _published(reg)
    with pytest.raises(AliasConflict, match="champion points at v1, not v0"):
        reg.promote(other, expect="v0", reason="late", actor="other")
    assert reg.resolve(CHAMPION) == rec.version


def test_a_promote_moves_the_alias_and_both_statuses_in_one_write(reg):
    v = _published(reg)
    before = len(reg.history())
    reg.promote(v, expect="v0", reason="won", actor="ops", retired_error="replaced")
    assert reg.aliases() == {CHAMPION: v}
    assert reg.get(v).status is S.CHAMPION and reg.get(v).error is None
    assert (reg.get("v0").status, reg.get("v0").error) == (S.RETIRED, "replaced")
    [moved] = reg.history()[before:]
    assert (moved.alias, moved.previous, moved.version, moved.actor) == (CHAMPION, "v0", v, "ops")


def test_promoting_the_candidate_clears_it_in_the_same_write(reg):
    v = _published(reg)
    reg.open_candidate(v, reason="gate", actor="t")
    assert reg.get(v).status is S.CANDIDATE
    _promote(reg, v)
    assert reg.aliases() == {CHAMPION: v} and reg.get(v).status is S.CHAMPION
    moves = [(e.alias, e.version) for e in reg.history() if isinstance(e, PolicyAliasMoved)]
    assert moves[-2:] == [(CHAMPION, v), (CANDIDATE, None)]


def test_a_stale_compare_and_set_changes_neither_alias_nor_status(reg):
    a, b = _published(reg), _published(reg)
    _promote(reg, a)
    before = _state(reg)
    with pytest.raises(AliasConflict, match="another writer moved it first"):
        reg.promote(b, expect="v0", reason="stale read", actor="late")
    assert _state(reg) == before
    assert reg.get(b).status is S.READY and reg.get("v0").status is S.RETIRED


def test_two_writers_promoting_at_once_one_wins_and_statuses_follow_the_winner(reg):
    versions = [_published(reg) for _ in range(2)]
    barrier, lost = threading.Barrier(2), []

    def writer(v: str) -> None:
        barrier.wait()
        try:
            reg.promote(v, expect="v0", reason="race", actor=f"w-{v}")
        except AliasConflict:
            lost.append(v)

    threads = [threading.Thread(target=writer, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    [loser] = lost
    winner = reg.resolve(CHAMPION)
    assert {winner, loser} == set(versions)
    assert reg.get(winner).status is S.CHAMPION and reg.get(loser).status is S.READY
    assert reg.get("v0").status is S.RETIRED


def test_candidate_only_if_unset_and_withdraw(reg):
    a, b = _published(reg), _published(reg)
    reg.open_candidate(a, reason="gate", actor="learner-1")
    with pytest.raises(AliasConflict):
        reg.open_candidate(b, reason="gate", actor="learner-2")
    assert reg.get(b).status is S.READY
    reg.withdraw_candidate(a, error="rolled back: lost", reason="lost", actor="t")
    assert CANDIDATE not in reg.aliases()
    assert (reg.get(a).status, reg.get(a).error) == (S.REJECTED, "rolled back: lost")


def test_unknown_versions_are_refused(reg):
    with pytest.raises(UnknownVersion):
        reg.resolve("v99")
    with pytest.raises(UnknownVersion):
        reg.promote("v99", expect="v0", reason="x", actor="t")
    with pytest.raises(UnknownVersion):
        reg.mark_broken("v99", "gone")
    assert reg.resolve(CHAMPION) == "v0"


def test_a_broken_version_keeps_its_mark_when_an_alias_leaves_it(reg):
    a, b = _published(reg), _published(reg)
    _promote(reg, a)
    reg.mark_broken(a, "does not load")
    assert reg.aliases()[CHAMPION] == a  # serving keeps what it has; the alias stays
    _promote(reg, b)
    assert (reg.get(a).status, reg.get(a).error) == (S.BROKEN, "does not load")
    c = _published(reg)
    reg.open_candidate(c, reason="gate", actor="t")
    reg.mark_broken(c, "does not load")
    reg.withdraw_candidate(c, error="rolled back", reason="timeout", actor="t")
    assert CANDIDATE not in reg.aliases() and reg.get(c).status is S.BROKEN


# -- the table ------------------------------------------------------------------------------


def _into(reg: PolicyRegistry, status: VersionStatus) -> str:
    """A fresh version brought to `status` by public moves only."""
    v = _published(reg)
    if status is S.CANDIDATE:
        reg.open_candidate(v, reason="gate", actor="t")
    elif status is S.REJECTED:
        reg.reject(v, error="gate refused")
    elif status is S.CHAMPION:
        _promote(reg, v)
    elif status is S.RETIRED:
        _promote(reg, v)
        _promote(reg, _published(reg))
    elif status is S.BROKEN:
        reg.mark_broken(v, "does not load")
    assert reg.get(v).status is status
    return v


def _move(reg: PolicyRegistry, v: str, to: VersionStatus) -> None:
    """The public move that takes `v` to `to`."""
    if to is S.CHAMPION:
        _promote(reg, v)
    elif to is S.CANDIDATE:
        reg.open_candidate(v, reason="gate", actor="t")
    elif to is S.REJECTED and reg.aliases().get(CANDIDATE) == v:
        reg.withdraw_candidate(v, error="canary lost", reason="lost", actor="t")
    elif to is S.REJECTED:
        reg.reject(v, error="gate refused")
    elif to is S.RETIRED:
        _promote(reg, _published(reg))  # v is the champion the new one replaces
    elif to is S.BROKEN:
        reg.mark_broken(v, "does not load")


TABLE = [(a, b) for a, targets in TRANSITIONS.items() for b in sorted(targets)]


@pytest.mark.parametrize(("start", "end"), TABLE, ids=[f"{a}->{b}" for a, b in TABLE])
def test_every_transition_in_the_table_is_made_by_a_public_move(reg, start, end):
    v = _into(reg, start)
    _move(reg, v, end)
    assert reg.get(v).status is end
    for alias, version in reg.aliases().items():  # and the aliases agree with the statuses
        assert reg.get(version).status in (S(alias), S.BROKEN)


def test_the_table_covers_every_status_and_ready_is_only_entered_by_publish():
    assert set(TRANSITIONS) == set(S)
    assert all(S.READY not in targets for targets in TRANSITIONS.values())


ILLEGAL = [
    (a, b)
    for a in S
    for b in (S.CANDIDATE, S.REJECTED, S.CHAMPION)
    if b not in TRANSITIONS[a] and a is not b
]


@pytest.mark.parametrize(("start", "end"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
def test_a_move_the_table_refuses_raises_naming_both_states_and_writes_nothing(reg, start, end):
    v = _into(reg, start)
    before = _state(reg)
    with pytest.raises(IllegalTransition, match=f"{v} cannot go from {start} to {end}"):
        _move(reg, v, end)
    assert _state(reg) == before


def test_a_status_that_would_disagree_with_its_alias_is_refused(reg):
    v = _into(reg, S.CANDIDATE)
    before = _state(reg)
    with pytest.raises(IllegalTransition, match=f"candidate would name {v} while it is rejected"):
        reg.reject(v, error="the gate again")  # withdraw_candidate is the way out
    with pytest.raises(ReleaseError, match="already the champion"):
        _promote(reg, "v0")
    with pytest.raises(AliasConflict):  # a second candidate: the compare-and-set refuses first
        reg.open_candidate(v, reason="again", actor="t")
    assert _state(reg) == before
