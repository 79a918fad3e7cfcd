"""One private model cache per test session: tests never write to `~/.cache/arloop`.

Loaders get it as `cache_dir=MODEL_CACHE`; settings built in tests and the processes tests
start read it as ARLOOP_MODEL_CACHE, which the session fixture sets.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

MODEL_CACHE = Path(tempfile.mkdtemp(prefix="arloop-test-models-"))


@pytest.fixture(scope="session", autouse=True)
def model_cache() -> Iterator[Path]:
    """The session's model cache, also as ARLOOP_MODEL_CACHE (removed at the end)."""
    saved = os.environ.get("ARLOOP_MODEL_CACHE")
    os.environ["ARLOOP_MODEL_CACHE"] = str(MODEL_CACHE)
    yield MODEL_CACHE
    if saved is None:
        os.environ.pop("ARLOOP_MODEL_CACHE", None)
    else:
        os.environ["ARLOOP_MODEL_CACHE"] = saved
    shutil.rmtree(MODEL_CACHE, ignore_errors=True)
