"""Spans around graph nodes and tool calls reach an OTLP/HTTP collector when configured, and
nothing is installed when not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.fakes.scripted_llm import Reply

REPO = Path(__file__).resolve().parents[2]
RUN = textwrap.dedent(
    """
    import asyncio, sys
    from opentelemetry import trace
    from agents.policy_client import PolicyClient, PolicyConfig
    from agents.react import build_react, run_input
    from agents.run_context import RunContext
    from deploy.telemetry import setup_tracing
    from tests.fakes.tools import Add
    from tools.registry import ToolRegistry

    endpoint, llm = sys.argv[1] or None, sys.argv[2]
    print("configured", setup_tracing("test", endpoint))
    ctx = RunContext(PolicyClient(PolicyConfig("openai/m", api_base=llm, api_key="k", retries=0)),
                     ToolRegistry([Add()]), "You add.", "u1")
    state = asyncio.run(build_react().ainvoke(run_input("2+3?", 4), context=ctx))
    print("answer", state["messages"][-1].content)
    provider = trace.get_tracer_provider()
    print("provider", type(provider).__name__)
    if hasattr(provider, "shutdown"):
        provider.shutdown()  # flushes the batch
    """
)


class Collector:
    """A local OTLP/HTTP endpoint that keeps the span names it receives."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, dict]] = []
        seen = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            attrs = {a.key: a.value.string_value for a in span.attributes}
                            seen.append((span.name, attrs))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def run(endpoint: str, llm) -> str:
    done = subprocess.run(
        [sys.executable, "-c", RUN, endpoint, llm.base_url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_spans_of_nodes_and_tool_calls_go_to_the_configured_collector(llm):
    collector = Collector()
    llm.push(Reply(tool_calls=[("add", '{"a": 2, "b": 3}')]), Reply(content="5"))
    out = run(collector.url, llm)
    assert "configured True" in out and "answer 5" in out
    names = [name for name, _ in collector.spans]
    assert names.count("node.model") == 2 and names.count("node.tools") == 1
    assert "node.recall" in names and names.count("policy.complete") == 2
    [tool] = [attrs for name, attrs in collector.spans if name == "tool.add"]
    assert tool["arloop.tool"] == "add"
    collector.server.shutdown()


def test_without_an_endpoint_nothing_is_installed_or_exported(llm):
    llm.push(Reply(content="5"))
    out = run("", llm)
    assert "configured False" in out and "answer 5" in out
    assert "provider ProxyTracerProvider" in out  # the API's no-op default
