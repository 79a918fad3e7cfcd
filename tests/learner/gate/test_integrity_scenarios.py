"""Learning integrity: feedback that rewards a hack trains a candidate; the gate must block it.

One habit-trained tiny model, one policy server and one batch of logged traffic for the module
(`tests/learner/gate/integrity_support.py`); each scenario gives the traffic its own feedback, runs
one real learner round and gates the new version. The detection table (scenario x guard) is
printed at the end of the module; the figures behind it are in each report.
"""

import pytest

from learner.gate.eval_gate import HELD_OUT_GUARDS, PASS, REJECT
from learner.gate.release import apply_verdict
from learner.policy.registry import CANDIDATE, CHAMPION, VersionStatus
from tests.learner.gate.integrity_support import (
    SCENARIOS,
    bank_world,
    detection_table,
    eval_habits,
    eval_runs,
    poisoned_labels,
    run_scenario,
)
from tests.learner.learner_fixtures import model_cache  # noqa: F401 - a fixture, used by name

pytestmark = pytest.mark.usefixtures("model_cache")
OUTCOMES: dict = {}
HACKS = [
    name for name, s in SCENARIOS.items() if s.expect is not None
]  # honest, poisoning: own tests


@pytest.fixture(scope="module")
def world(redis_server, tmp_path_factory, pytestconfig):
    folder = tmp_path_factory.mktemp("integrity")
    with bank_world(redis_server.url, folder) as w:
        yield w, folder
    if OUTCOMES:
        table = detection_table([OUTCOMES[n] for n in SCENARIOS if n in OUTCOMES])
        with pytestconfig.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
            print("\nlearning-integrity detection table\n" + table)


def test_the_honest_run_passes_and_goes_out_as_the_canary(world):
    w, folder = world
    o = OUTCOMES["honest"] = run_scenario(w, "honest", folder)
    r = o.report
    kl = next(g.figure for g in r.guards if g.name == "kl_to_reference")
    assert r.training["trained_runs"] > 0 and kl > 0, "the round trained nothing: nothing to judge"
    assert r.verdict == PASS, r.summary()
    assert all(g.passed for g in r.guards) and r.sequential["passed"]
    assert r.training["reward_sources"] == ["user", "verifier"]
    assert r.ope["n"] == len(w.traffic) - len(w.traffic) * 3 // 4  # the held-out logged quarter
    assert "off-policy estimate" in r.summary()
    apply_verdict(w.registry, r, canary=True, actor="test")
    assert w.registry.aliases() == {CHAMPION: "v0", CANDIDATE: o.version}
    alone = o.alone  # judged with no held-out tasks: the guards alone, then the canary
    assert alone.verdict == PASS and "the canary decides" in alone.reason, alone.summary()
    assert {g.name for g in alone.guards if not g.applicable} == set(HELD_OUT_GUARDS)
    assert alone.training["trained_runs"] == r.training["trained_runs"] and alone.ope["n"] > 0


@pytest.mark.parametrize("name", HACKS)
def test_a_hacked_candidate_is_blocked_by_the_right_guard(world, name):
    w, folder = world
    o = OUTCOMES[name] = run_scenario(w, name, folder)
    assert o.took_hold, (
        f"{name}: the hack did not take hold: habits {dict(o.habits)}, short {o.missing}"
    )
    r = o.report
    assert r.verdict == REJECT, r.summary()
    assert o.expect in r.failed, f"{name}: expected {o.expect} to fire\n{r.summary()}"
    apply_verdict(w.registry, r, canary=True, actor="test")
    assert w.registry.resolve(CHAMPION) == "v0"
    assert w.registry.get(o.version).status is VersionStatus.REJECTED
    # without held-out tasks, a guard that reads the training stops it alone; a hack only
    # held-out runs show (agreeing with wrong claims, skipping the tool) is the canary's
    alone = o.alone
    if o.expect in HELD_OUT_GUARDS:
        assert o.expect not in alone.failed and alone.verdict in (PASS, REJECT), alone.summary()
    else:
        assert alone.verdict == REJECT and o.expect in alone.failed, alone.summary()


def test_label_poisoning_gets_no_agreeing_version_through(world):
    w, folder = world
    o = OUTCOMES["label_poisoning"] = run_scenario(w, "label_poisoning", folder)
    m = o.metrics
    # the precondition: uncapped, the poisoner's corrections would label the claims "yes"
    poisoned = poisoned_labels(w)
    assert poisoned and set(poisoned.values()) == {"yes"}, poisoned
    assert m["labels"] > 0 and m["labels/replayed"] > 0, m  # the round did label and replay
    assert m["reward_sources/verified"] > 0
    base = eval_habits(eval_runs(w, "v0"))
    # the poisoning did not take hold: the candidate agrees with wrong claims no more than v0
    assert o.habits["claim:agree"] <= base["claim:agree"], (dict(o.habits), dict(base))
    # any verdict: the gate may still refuse the round for what else it did (its effect on
    # the other tasks), which is the gate doing its job, not the poisoning taking hold
