"""`arloop serve vllm-sync` against a fake vLLM over real HTTP (vLLM's documented bodies and
error codes) and a real Redis: published LoRA versions load under new names, retired ones
unload after the drain, refusals and a vLLM that is down keep the last good adapter and say
so, and the delivery check catches what was never delivered."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from agents.events import POLICY_ALIASES
from deploy.policy_server.heartbeat import checkpoint_digest
from deploy.vllm_sync.check import delivery_check
from deploy.vllm_sync.record import read_record
from deploy.vllm_sync.vllm_api import VllmApi
from learner.policy.registry import CANDIDATE, CHAMPION
from tests.deploy.policy_server.support import make_lora
from tests.deploy.vllm_sync.conftest import DRAIN_S, loads_at_the_notice
from tests.fakes.servers import ServerThread


def _check(world):
    listed = world.sync.vllm.models()
    record = read_record(world.sync.client, "arloop")
    return {f.alias: f for f in delivery_check(world.registry, record, listed)}


def test_the_base_is_served_by_vllms_base_model_until_a_version_is_published(world):
    record = world.sync.step()
    assert record.status == "ok" and record.problems == []
    assert record.routes == {CHAMPION: "smollm2"} and record.serving == {CHAMPION: "v0"}
    assert world.fake.posted("load") == []
    assert _check(world)[CHAMPION].ok


def test_a_published_lora_loads_under_a_new_name_and_the_champion_routes_to_it(world):
    v1 = world.publish(seed=1)
    record = world.sync.step()
    name = world.adapter(v1)
    assert name.startswith("v1-") and len(name) == len("v1-") + 8
    assert world.fake.posted("load") == [
        {"lora_name": name, "lora_path": str(world.made[v1].resolve()), "load_inplace": False}
    ]
    assert world.fake.loras == {name: str(world.made[v1].resolve())}
    assert record.routes[CHAMPION] == name and record.serving[CHAMPION] == v1
    assert record.digests[v1] == checkpoint_digest(world.registry.get(v1))
    assert record.versions == {name: v1}
    assert world.sync.step().status == "ok"
    assert len(world.fake.posted("load")) == 1  # listed already: never loaded twice
    finding = _check(world)[CHAMPION]
    assert finding.ok and finding.model == name and finding.listed


def test_a_retired_version_is_unloaded_only_after_the_drain_grace(world):
    v1 = world.publish(seed=1)
    world.sync.step()
    old = world.adapter(v1)
    v2 = world.publish(seed=2)
    record = world.sync.step()
    assert record.routes[CHAMPION] == world.adapter(v2)
    assert old in world.fake.loras and old in record.retiring  # requests on it may still run
    assert record.versions[old] == v1  # a late answer from it is still attributed
    world.clock.now += DRAIN_S - 1
    assert old in world.sync.step().retiring and world.fake.posted("unload") == []
    world.clock.now += 1
    record = world.sync.step()
    assert world.fake.posted("unload") == [{"lora_name": old, "lora_int_id": None}]
    assert old not in world.fake.loras and old not in record.adapters and record.retiring == {}


def test_a_candidate_gets_its_own_adapter_and_leaves_when_withdrawn(world):
    world.publish(seed=1)
    v2 = world.publish(seed=2, champion=False)
    world.registry.open_candidate(v2, reason="test", actor="test")
    record = world.sync.step()
    assert record.routes[CANDIDATE] == world.adapter(v2) != record.routes[CHAMPION]
    world.registry.withdraw_candidate(v2, error="lost", reason="test", actor="test")
    world.clock.now += DRAIN_S
    world.sync.step()  # retiring starts now
    world.clock.now += DRAIN_S
    record = world.sync.step()
    assert CANDIDATE not in record.routes and world.adapter(v2) not in world.fake.loras


@pytest.mark.parametrize(
    "status, message",
    [(500, "CUDA out of memory"), (400, "LoRA rank 64 is greater than max_lora_rank 16")],
)
def test_a_refused_load_keeps_the_last_good_adapter_and_says_so(world, status, message):
    v1 = world.publish(seed=1)
    world.sync.step()
    v2 = world.publish(seed=2)
    world.fake.refuse_next(status, message)
    record = world.sync.step()
    assert record.routes[CHAMPION] == world.adapter(v1) and record.serving[CHAMPION] == v1
    assert record.status == "degraded"
    (problem,) = record.problems
    assert f"champion {v2} not delivered" in problem and f"{status}: {message}" in problem
    finding = _check(world)[CHAMPION]
    assert not finding.ok and f"{v2} was never delivered" in finding.problems[0]
    record = world.sync.step()  # vLLM takes it this time
    assert record.status == "ok" and record.routes[CHAMPION] == world.adapter(v2)
    assert _check(world)[CHAMPION].ok


def test_no_adapter_at_the_path_vllm_sees_is_its_404_and_the_last_good_stays(world):
    v1 = world.publish(seed=1)
    world.sync.step()
    world.sync.path_map = {str(world.folders.resolve()): "/mnt/elsewhere"}  # a wrong mount
    world.publish(seed=2)
    record = world.sync.step()
    assert record.routes[CHAMPION] == world.adapter(v1) and record.status == "degraded"
    assert "404: Loading lora v2-" in record.problems[0]
    assert "No adapter found for /mnt/elsewhere/v2" in record.problems[0]


def test_a_new_candidate_vllm_refuses_rides_on_the_champion_and_is_reported(world):
    v1 = world.publish(seed=1)
    world.sync.step()
    v2 = world.publish(seed=2, champion=False)
    world.registry.open_candidate(v2, reason="test", actor="test")
    world.fake.refuse_next(500, "engine dead")
    record = world.sync.step()
    assert record.routes[CANDIDATE] == record.routes[CHAMPION] == world.adapter(v1)
    assert record.serving[CANDIDATE] == v1  # what really answers canary threads
    finding = _check(world)[CANDIDATE]
    assert not finding.ok and f"{v2} was never delivered" in finding.problems[0]


def test_vllm_down_keeps_every_route_and_the_status_says_so(world):
    v1 = world.publish(seed=1)
    world.sync.step()
    world.server.stop()  # connection refused from now on
    v2 = world.publish(seed=2)
    record = world.sync.step()
    assert record.status == "down" and record.routes[CHAMPION] == world.adapter(v1)
    assert "unreachable" in record.problems[0] and "routes kept" in record.problems[0]
    assert read_record(world.sync.client, "arloop").status == "down"
    record = read_record(world.sync.client, "arloop")
    findings = {
        f.alias: f for f in delivery_check(world.registry, record, listed=None)
    }  # the check while vLLM is away
    assert "vLLM did not answer its model list" in findings[CHAMPION].problems
    assert f"{v2} was never delivered" in findings[CHAMPION].problems[0]
    world.restart_server()
    record = world.sync.step()
    assert record.status == "ok" and record.routes[CHAMPION] == world.adapter(v2)


def test_rewritten_checkpoint_files_are_a_digest_mismatch_then_a_new_name(world):
    v1 = world.publish(seed=1)
    world.sync.step()
    served = world.adapter(v1)
    make_lora(world.made[v1], seed=99)  # the files under the published URI change
    finding = _check(world)[CHAMPION]
    assert not finding.ok and finding.served_digest != finding.published_digest
    assert f"{served} was loaded from files with digest" in finding.problems[0]
    record = world.sync.step()
    assert record.routes[CHAMPION] == world.adapter(v1) != served  # never the same name twice
    assert served in record.retiring
    assert _check(world)[CHAMPION].ok


def test_a_restarted_vllm_forgets_adapters_the_check_says_so_and_the_sync_reloads(world):
    v1 = world.publish(seed=1)
    world.sync.step()
    world.fake.restart()
    finding = _check(world)[CHAMPION]
    assert not finding.ok and finding.listed is False
    assert "vLLM does not list" in finding.problems[0]
    record = world.sync.step()
    assert "no longer loaded in vLLM" in record.problems[0]
    assert world.adapter(v1) in world.fake.loras and record.routes[CHAMPION] == world.adapter(v1)
    assert world.sync.step().status == "ok"


def test_a_full_checkpoint_is_not_loaded_at_run_time_and_is_reported(world):
    v1 = world.publish(seed=1)
    world.sync.step()
    world.publish(seed=2, kind="full")
    record = world.sync.step()
    assert record.routes[CHAMPION] == world.adapter(v1)
    assert "full checkpoint: vLLM loads those only at start" in record.problems[0]


def test_only_adapters_the_sync_loaded_are_ever_unloaded(world):
    world.publish(seed=1)
    world.fake.loras["team-adapter"] = "/models/team"  # `--lora-modules` at vLLM's start
    world.sync.step()
    world.clock.now += 10 * DRAIN_S
    world.sync.step()
    assert "team-adapter" in world.fake.loras
    assert all(body["lora_name"] != "team-adapter" for body in world.fake.posted("unload"))


def test_the_api_names_vllms_errors_and_a_missing_runtime_lora_route(world):
    api = VllmApi(world.server.url + "/v1", timeout_s=5)  # a /v1 suffix is accepted
    with pytest.raises(Exception, match="404: The lora adapter 'nope' cannot be found."):
        api.unload("nope")
    bare = VllmApi(world.server.url.replace(str(world.server.port), "1"), timeout_s=2)
    with pytest.raises(Exception, match="unreachable"):
        bare.models()
    api.close()
    bare.close()


def test_the_command_runs_a_pass_and_its_check_exits_1_on_a_gap(world, redis_url, monkeypatch):
    from typer.testing import CliRunner

    from deploy.cli import app

    monkeypatch.setenv("ARLOOP_REDIS_URL", redis_url)
    monkeypatch.setenv("ARLOOP_VLLM_URL", world.server.url)
    v1 = world.publish(seed=1)
    runner = CliRunner()
    gap = runner.invoke(app, ["serve", "vllm-sync", "--check"])
    assert gap.exit_code == 1, gap.output
    assert f"champion: {v1} published sha256:" in gap.output and "NOT DELIVERED" in gap.output
    assert "no vllm-sync record: nothing was ever delivered" in gap.output
    once = runner.invoke(app, ["serve", "vllm-sync", "--once"])
    assert once.exit_code == 0, once.output
    assert world.adapter(v1) in world.fake.loras
    ok = runner.invoke(app, ["serve", "vllm-sync", "--check"])
    assert ok.exit_code == 0 and f"as {world.adapter(v1)}" in ok.output and ": ok" in ok.output
    monkeypatch.setenv("ARLOOP_VLLM_DRAIN_S", "-1")
    refused = runner.invoke(app, ["serve", "vllm-sync", "--once"])
    assert refused.exit_code == 2 and "ARLOOP_VLLM_DRAIN_S: '-1' is out of range" in refused.output


def test_the_loop_loads_a_version_at_the_registrys_notice_not_the_next_poll(world, redis_url):
    from deploy.vllm_sync.settings import VllmSyncSettings

    settings = VllmSyncSettings(
        _env_file=None, redis_url=redis_url, vllm_url=world.server.url, vllm_poll_s=60
    )
    loads_at_the_notice(world, settings)


def test_the_sync_runs_as_its_own_redis_user_of_the_shipped_acl(world, tmp_path):
    import redis

    from deploy.embedded_redis import free_port, start_redis
    from deploy.vllm_sync.sync import VllmSync
    from learner.policy.registry import PolicyRegistry
    from tests.deploy.manifests.test_redis_users import USERS, _write_acl

    passwords = {u: f"{u}-" + "k9Xq2" * 8 for u in USERS}
    assert _write_acl(passwords, tmp_path / "users").returncode == 0
    port = free_port()

    def url(user: str) -> str:
        return f"redis://arloop-{user}:{passwords[user]}@127.0.0.1:{port}/0"

    learner_url = url("learner")
    server = start_redis(
        tmp_path / "data",
        port,
        extra=["--aclfile", str(tmp_path / "users" / "users.acl")],
        ready_url=learner_url,
    )
    try:
        learner = redis.Redis.from_url(learner_url)
        registry = PolicyRegistry(learner)
        registry.ensure_base("tiny")
        as_sync = redis.Redis.from_url(url("vllm-sync"))
        sync = VllmSync(as_sync, world.sync.vllm, route_name="arloop", clock=world.clock)
        world.registry, world.sync = registry, sync
        v1 = world.publish(seed=1)
        record = sync.step()
        assert record.status == "ok" and record.serving["champion"] == v1
        as_agents = redis.Redis.from_url(url("agents"))
        assert read_record(as_agents, "arloop").routes == record.routes  # agents may read it
        with pytest.raises(redis.exceptions.NoPermissionError):
            as_sync.hset(POLICY_ALIASES, "champion", "v0")  # but never move an alias
        for client in (learner, as_sync, as_agents):
            client.close()
    finally:
        server.stop()


def test_an_alias_naming_a_missing_version_or_a_foreign_server_never_stops_the_sync(world):
    v1 = world.publish(seed=1)
    world.sync.step()
    world.sync.client.hset(POLICY_ALIASES, "candidate", "v99")  # a rewound registry
    record = world.sync.step()
    assert record.routes[CHAMPION] == world.adapter(v1) and "candidate v99" in record.problems[0]
    world.server.stop()
    other = Starlette(routes=[Route("/v1/models", lambda request: PlainTextResponse("hello"))])
    world.server = ServerThread(other, port=world.server.port).start()
    record = world.sync.step()  # something else answers on vLLM's port: no model list
    assert record.status == "down" and "not a model list" in record.problems[0]
    assert record.routes[CHAMPION] == world.adapter(v1)
