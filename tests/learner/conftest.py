"""Fixtures the learner tests share: a fresh store and a registry with the tiny base as v0."""

import pytest

from tests.learner.learner_fixtures import base_registry, open_store


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path)
    yield s
    s.close()


@pytest.fixture
def registry(redis_client):
    return base_registry(redis_client)
