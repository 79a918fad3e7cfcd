"""schemathesis against the agent API's OpenAPI schema, every check on (`--checks all`):
the answers match what the schema documents (statuses, bodies, content types), schema-valid
requests are accepted and invalid ones refused, and nothing is a 500. Loopback only, bounded
in examples per operation and in time; the seed is fixed so a run repeats."""

from __future__ import annotations

import subprocess
import sys

from tests.fakes.api import API_KEY
from tests.fakes.scripted_llm import Reply

MAX_EXAMPLES = 30
CONFIG = """
[checks.negative_data_rejection]
# an input over ARLOOP_MAX_INPUT_CHARS (the schema's maxLength) is a documented 413
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422",
                     "428", "429", "5xx"]
"""


def test_agent_api_conforms_to_its_openapi_schema(start_api, llm, tmp_path):
    llm.responder = lambda request: Reply(content="ok")
    api = start_api(max_input_chars=2000, run_rate_per_minute=10_000)
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run"),
        f"{api.server.url}/openapi.json",
        *("--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--seed", "7"),
        *("--workers", "1", "--request-timeout", "30", "--generation-database", "none"),
        *("-H", f"Authorization: Bearer {API_KEY}", "--no-color", "--max-failures", "20"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=480)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-12000:]
    assert "Operations:       20 selected / 20 total" in report


POLICY_CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "413", "415", "5xx"]
[checks.positive_data_acceptance]
# a schema-valid request can still be out of the server's bounds (n, max_tokens, a model name)
expected-statuses = ["2xx", "400", "401", "403", "404"]
"""


def test_policy_server_conforms_to_its_openapi_schema(redis_url, tmp_path):
    """The same run against the policy server (tiny model, transformers engine, a key)."""
    from tests.deploy.policy_server.support import running_server, tiny_settings

    key = "schemathesis-key-Hq3vN8sKx2Lm7Pd4Rt9Wb"
    settings = tiny_settings(redis_url, max_tokens_cap=8, max_n=2, policy_keys=[key])
    config = tmp_path / "schemathesis.toml"
    config.write_text(POLICY_CONFIG)
    with running_server(settings) as base:
        command = [
            *(sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run"),
            f"{base.removesuffix('/v1')}/openapi.json",
            *("--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--seed", "7"),
            *("--workers", "1", "--request-timeout", "60", "--generation-database", "none"),
            *("-H", f"Authorization: Bearer {key}", "--no-color", "--max-failures", "20"),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=480)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-12000:]
    assert "Operations:       7 selected / 7 total" in report  # /tokenize the 7th
