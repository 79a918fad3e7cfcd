"""A real S3-compatible server for the tests: moto's, in server mode, as its own process.

Nothing of boto3 is mocked: the code under test talks HTTP to it through the standard AWS
variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ...), which `s3_bucket` sets.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.embedded_redis import free_port


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """`moto_server` on a free loopback port for the session (skipped where moto is absent)."""
    binary = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    if not Path(binary).exists():
        pytest.skip("moto is not installed (`pip install 'moto[server]'`, in the dev extra)")
    port = free_port()
    process = subprocess.Popen(
        [binary, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch) -> str:
    """A fresh bucket on the session's server, the AWS variables pointing at it; its name."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = f"arloop-{uuid.uuid4().hex[:12]}"
    s3_client().create_bucket(Bucket=name)
    return name


def s3_client():
    """A plain boto3 client on the same server (what an operator, or an attacker, would use)."""
    import boto3

    return boto3.client("s3")
