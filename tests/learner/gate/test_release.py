"""Release moves on a real registry: reject, canary, promote, roll back; racing writers."""

import threading

import pytest

from agents.events import PolicyAliasMoved, PolicyRejected, PolicyRolledBack
from learner.gate.eval_gate import GateReport
from learner.gate.release import (
    ReleaseError,
    apply_verdict,
    checkpoint_problem,
    previous_champion,
    promote,
    rollback,
)
from learner.policy.registry import CANDIDATE, CHAMPION, VersionStatus
from learner.publish import register, write_checkpoint
from learner.store import CommittedVersion
from tests.learner.gate.release_support import add_version
from tests.learner.learner_fixtures import open_store


def _lora_files(folder) -> None:
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (folder / name).write_text("{}")


def _report(version: str, verdict: str, failed=()) -> GateReport:
    return GateReport(version, "v0", verdict, list(failed), f"{verdict}: {', '.join(failed)}")


def test_a_rejected_candidate_never_moves_the_champion(registry, tmp_path):
    v = add_version(registry, tmp_path)
    message = apply_verdict(registry, _report(v, "reject", ["goodhart"]), canary=True, actor="l1")
    assert message.startswith(f"{v} rejected")
    assert registry.aliases() == {CHAMPION: "v0"}
    record = registry.get(v)
    assert record.status is VersionStatus.REJECTED and record.report["failed"] == ["goodhart"]
    rejected = [e for e in registry.history() if isinstance(e, PolicyRejected)]
    assert (rejected[-1].version, rejected[-1].failed) == (v, ["goodhart"])
    with pytest.raises(ReleaseError, match="was rejected"):
        promote(registry, v, actor="ops", reason="try")
    assert registry.resolve(CHAMPION) == "v0"


def test_a_pass_opens_the_canary_or_with_it_off_promotes(registry, tmp_path):
    a, b = add_version(registry, tmp_path), add_version(registry, tmp_path)
    assert "canary on" in apply_verdict(registry, _report(a, "pass"), canary=True, actor="l1")
    assert registry.aliases() == {CHAMPION: "v0", CANDIDATE: a}
    assert registry.get(a).status is VersionStatus.CANDIDATE
    assert registry.get(a).report["canary"]["started_at"] > 0
    assert "is the champion" in apply_verdict(
        registry, _report(b, "pass"), canary=False, actor="l1"
    )
    assert registry.resolve(CHAMPION) == b and registry.get("v0").status is VersionStatus.RETIRED


def test_two_learners_passing_at_once_one_canary_wins_the_other_is_told(registry, tmp_path):
    versions = [add_version(registry, tmp_path) for _ in range(2)]
    barrier, messages = threading.Barrier(2), {}

    def learner(v: str) -> None:
        barrier.wait()
        messages[v] = apply_verdict(registry, _report(v, "pass"), canary=True, actor=f"l-{v}")

    threads = [threading.Thread(target=learner, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winner = registry.aliases()[CANDIDATE]
    loser = next(v for v in versions if v != winner)
    assert "canary on" in messages[winner]
    told = (  # the winner's canary seen before the move, or the move refused (a true race)
        f"{loser} passed the gate but stays READY: {winner}'s canary is still running",
        f"{loser} passed the gate but stays READY: candidate points at {winner}, not nothing: "
        "another writer moved it first",
    )
    assert messages[loser].startswith(told), messages[loser]
    assert registry.get(loser).status is VersionStatus.READY


def test_a_pass_while_another_canary_runs_says_so_and_what_to_run_next(registry, tmp_path):
    a, b = add_version(registry, tmp_path), add_version(registry, tmp_path)
    apply_verdict(registry, _report(a, "pass"), canary=True, actor="l1")
    message = apply_verdict(registry, _report(b, "pass"), canary=True, actor="l1")
    assert message.startswith(f"{b} passed the gate but stays READY: {a}'s canary is still running")
    assert f"`arloop policy promote {a}`" in message and "rollback --candidate" in message
    assert "another writer" not in message
    assert registry.aliases() == {CHAMPION: "v0", CANDIDATE: a}
    assert registry.get(b).status is VersionStatus.READY and registry.get(b).report is None


def test_two_learners_publishing_directly_at_once_one_becomes_champion(registry, tmp_path):
    barrier, published = threading.Barrier(2), {}

    def learner(i: int) -> None:
        """Its own store and checkpoints; both trained from v0 and register at the same time."""
        store = open_store(tmp_path / f"learner-{i}")
        version = registry.next_version()
        path = write_checkpoint(tmp_path / f"ck{i}", version, _lora_files, {})
        manifest = {
            "base_model": "tiny",
            "kind": "lora",
            "created_at": 1.0,
            "metrics": {},
            "trained_event_ids": [],
        }
        committed = CommittedVersion(version, "v0", path, manifest, registered=False)
        store.commit_version(committed, [])
        barrier.wait()
        published[i] = register(store, registry, committed, f"learner-{i}")
        store.close()

    threads = [threading.Thread(target=learner, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [p for p in published.values() if p.champion]
    losers = [p for p in published.values() if not p.champion]
    assert len(winners) == len(losers) == 1
    assert registry.resolve(CHAMPION) == winners[0].version
    assert "another writer moved it first" in losers[0].conflict
    assert registry.get(losers[0].version).status is VersionStatus.READY


def test_rollback_goes_to_the_previous_champion_and_records_it(registry, tmp_path):
    a, b = add_version(registry, tmp_path), add_version(registry, tmp_path)
    promote(registry, a, actor="ops", reason="first")
    promote(registry, b, actor="ops", reason="second")
    assert previous_champion(registry, b) == a
    assert rollback(registry, actor="ops", reason="bad answers") == (b, a)
    assert registry.resolve(CHAMPION) == a and registry.get(b).status is VersionStatus.RETIRED
    event = [e for e in registry.history() if isinstance(e, PolicyRolledBack)][-1]
    assert (event.from_version, event.to_version, event.actor) == (b, a, "ops")
    moves = [e for e in registry.history() if isinstance(e, PolicyAliasMoved)]
    assert moves[-1].reason == "rollback: bad answers"


def test_rollback_to_a_version_whose_checkpoint_is_gone_leaves_the_champion(registry, tmp_path):
    a, b = add_version(registry, tmp_path), add_version(registry, tmp_path)
    promote(registry, b, actor="ops", reason="x")
    (tmp_path / a / "adapter_model.safetensors").unlink()
    with pytest.raises(
        ReleaseError,
        match=f"cannot roll back to {a}: .* has no "
        "adapter_model.safetensors. The champion stays v2",
    ):
        rollback(registry, to=a, actor="ops", reason="x")
    for f in (tmp_path / a).iterdir():
        f.unlink()
    (tmp_path / a).rmdir()
    assert "does not exist" in checkpoint_problem(registry.get(a))
    with pytest.raises(ReleaseError, match="does not exist"):
        rollback(registry, to=a, actor="ops", reason="x")
    assert registry.resolve(CHAMPION) == b and registry.get(b).status is VersionStatus.CHAMPION
    assert not [e for e in registry.history() if isinstance(e, PolicyRolledBack)]


def test_a_verdict_the_table_refuses_is_reported_and_changes_nothing(registry, tmp_path):
    before = registry.aliases(), registry.get("v0").status, len(registry.history())
    message = apply_verdict(
        registry, _report("v0", "reject", ["goodhart"]), canary=True, actor="l1"
    )
    assert message.startswith("v0: the verdict (reject) cannot be applied")
    assert "cannot go from champion to rejected" in message
    assert (registry.aliases(), registry.get("v0").status, len(registry.history())) == before


def test_a_rollback_moves_the_alias_both_statuses_and_its_event_together(registry, tmp_path):
    a = add_version(registry, tmp_path)
    promote(registry, a, actor="ops", reason="first")
    before = len(registry.history())
    assert rollback(registry, actor="ops", reason="bad answers") == (a, "v0")
    assert registry.aliases() == {CHAMPION: "v0"}
    assert registry.get("v0").status is VersionStatus.CHAMPION
    assert (registry.get(a).status, registry.get(a).error) == (
        VersionStatus.RETIRED,
        "rolled back: bad answers",
    )
    moved, rolled = registry.history()[before:]
    assert (moved.alias, moved.previous, moved.version) == (CHAMPION, a, "v0")
    assert (rolled.from_version, rolled.to_version) == (a, "v0")
