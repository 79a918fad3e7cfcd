"""OpenTelemetry tracing, on only when configured: `ARLOOP_OTLP_ENDPOINT` set.

`setup_tracing` installs the SDK's tracer provider with a batching OTLP/HTTP exporter; the
spans `agents.tracing` opens (graph nodes, tool calls, policy calls) then go to the collector.
Unset, nothing is imported or installed: the API's no-op spans cost next to nothing.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def setup_tracing(process: str, endpoint: str | None) -> bool:
    """Export this process's spans over OTLP/HTTP to `endpoint`; False (nothing done) if unset."""
    if not endpoint:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise RuntimeError(
            f"ARLOOP_OTLP_ENDPOINT is set but the OpenTelemetry SDK is missing ({exc}): "
            "pip install 'arloop[otel]', or unset ARLOOP_OTLP_ENDPOINT"
        ) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": f"arloop-{process}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)
    log.info("exporting spans over OTLP/HTTP to %s", endpoint)
    return True
