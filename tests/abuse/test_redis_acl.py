"""Who may write what in Redis: the shipped ACL file (`deploy/manifests/redis-acl.conf`), one
user per process, with a password, over TLS.

The defect: arloop's Redis user was `default`, no password, `+@all`, so one `HSET
arloop:policy:aliases champion v1` from anywhere moved serving to another version. Here the
agent API serves runs and feedback as `arloop-agents` through TLS, and that user's attempt to
move the champion is refused; without credentials nothing gets in.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import redis

from agents.events import LEARNER_LEASE, POLICY_ALIASES, STREAM_FEEDBACK, STREAM_TRAJECTORIES
from deploy.embedded_redis import free_port, start_redis
from tests.fakes.scripted_llm import Reply

ACL = Path(__file__).parents[2] / "deploy" / "manifests" / "redis-acl.conf"
PASSWORDS = {
    "<agents-password>": "agents-" + "a1B2" * 8,
    "<learner-password>": "learner-" + "c3D4" * 8,
    "<policy-password>": "policy-" + "e5F6" * 8,
}


def _certificates(folder: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with openssl."""
    if shutil.which("openssl") is None:
        pytest.fail(
            "openssl is needed to make the test's TLS certificates: apt-get install openssl"
        )
    files = {n: folder / f"{n}.pem" for n in ("ca", "ca-key", "server", "server-key")}

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", str(files["ca-key"]), "-out", str(files["ca"]))  # fmt: skip
    csr = folder / "server.csr"
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", str(files["server-key"]), "-out", str(csr))  # fmt: skip
    ext = folder / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(files["ca"]), "-CAkey", str(files["ca-key"]),
        "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(files["server"]))  # fmt: skip
    return files


@pytest.fixture
def secured_redis(tmp_path):
    """redis-server with the shipped ACL file (passwords filled in), TLS only."""
    acl = ACL.read_text()
    for placeholder, password in PASSWORDS.items():
        acl = acl.replace(placeholder, password)
    (tmp_path / "acl.conf").write_text(acl)
    certs = _certificates(tmp_path)
    tls_port = free_port()
    extra = [
        *("--aclfile", str(tmp_path / "acl.conf"), "--port", "0"),
        *("--tls-port", str(tls_port), "--tls-cert-file", str(certs["server"])),
        *("--tls-key-file", str(certs["server-key"]), "--tls-ca-cert-file", str(certs["ca"])),
        *("--tls-auth-clients", "no"),
    ]
    learner = f"rediss://arloop-learner:{PASSWORDS['<learner-password>']}@127.0.0.1:{{port}}/0"
    server = start_redis(tmp_path / "data", tls_port, extra=extra, ready_url=learner)
    yield tls_port, certs["ca"]
    server.stop()


def test_the_agent_api_runs_as_its_own_user_over_tls_and_cannot_move_the_champion(
    start_api, llm, secured_redis
):
    port, ca = secured_redis
    agents = f"rediss://arloop-agents:{PASSWORDS['<agents-password>']}@127.0.0.1:{port}/0"
    learner = redis.Redis.from_url(
        agents.replace("arloop-agents", "arloop-learner").replace(
            PASSWORDS["<agents-password>"], PASSWORDS["<learner-password>"]
        ),
        ssl_ca_certs=str(ca),
    )
    learner.hset(POLICY_ALIASES, "champion", "v0")  # the learner owns the registry

    llm.responder = lambda request: Reply(content="ok")
    api = start_api(redis_url=agents, redis_ca_cert=ca)
    run = api.run("hello").json()
    fed = api.feedback(
        trajectory_id=run["trajectory_id"],
        feedback_token=run["feedback_token"],
        kind="thumbs",
        value=1,
    )
    assert fed.status_code == 202, fed.text
    assert api.http.get("/v1/dashboard").status_code == 200  # reads the registry
    assert learner.xlen(STREAM_TRAJECTORIES) == 1 and learner.xlen(STREAM_FEEDBACK) == 1

    as_agents = redis.Redis.from_url(agents, ssl_ca_certs=str(ca))
    assert as_agents.hget(POLICY_ALIASES, "champion") == b"v0"  # reading is allowed
    as_agents.get(LEARNER_LEASE)  # the dashboard reads who holds the learner's lease ...
    with pytest.raises(redis.exceptions.NoPermissionError):
        as_agents.set(LEARNER_LEASE, "1|not-a-learner")  # ... and cannot take it
    with pytest.raises(redis.exceptions.NoPermissionError):
        as_agents.hset(POLICY_ALIASES, "champion", "v1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        as_agents.flushall()
    assert learner.hget(POLICY_ALIASES, "champion") == b"v0"

    anonymous = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca))
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.hset(POLICY_ALIASES, "champion", "v1")
    untrusted = redis.Redis.from_url(agents)  # the server's certificate is not trusted
    with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
        untrusted.ping()
    for client in (learner, as_agents, anonymous, untrusted):
        client.close()
