"""
Shared test settings: no telemetry from Haystack's test runs (the machines have no internet anyway), the SQuAD 2.0 dev
subset beside the checkout as `$HAYSTACK_FUSION_SQUAD`, and the OpenAI-compatible test server
(`tests.support.openai_server`) as fixtures.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from haystack import tracing
from haystack_integrations.tracing.opentelemetry import OpenTelemetryTracer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.support.openai_server import OpenAIServer

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

SHARED_SQUAD = Path(__file__).resolve().parents[2] / "shared/data/squad2-dev-subset/squad2_dev_subset.json"
"""The SQuAD 2.0 dev subset the integration tests and their expected numbers are made on, in `../shared` beside the
checkout. The package does not look for it: when it is there and `$HAYSTACK_FUSION_SQUAD` is unset, the variable
names it, so `haystack_fusion.corpus.default_squad_path()` (in this process and in the child processes tests start)
gives it instead of downloading the whole dev set."""

if SHARED_SQUAD.is_file():
    os.environ.setdefault("HAYSTACK_FUSION_SQUAD", str(SHARED_SQUAD))


@pytest.fixture
def start_openai_server() -> Iterator[Callable[..., OpenAIServer]]:
    """
    Start OpenAI-compatible test servers on 127.0.0.1: `start_openai_server(reply=..., latency=...)` takes
    `OpenAIServer`'s settings and returns the started server. Every server it started is stopped after the test.
    """
    # fastapi and uvicorn (the dev extra): only for the tests that use it
    from tests.support.openai_server import OpenAIServer

    servers: list[OpenAIServer] = []

    def start(**settings: Any) -> OpenAIServer:
        server = OpenAIServer(**settings).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def openai_server(start_openai_server: Callable[..., OpenAIServer]) -> OpenAIServer:
    """An OpenAI-compatible test server with the default settings (replies "Paris" at once), stopped after the test."""
    return start_openai_server()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Haystack traced into a private OpenTelemetry provider whose finished spans stay in memory."""
    # the OpenTelemetry SDK and Haystack's tracer for it: only for the tests that use them
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable_tracing(OpenTelemetryTracer(provider.get_tracer("haystack-fusion-tests")))
    try:
        yield exporter
    finally:
        tracing.disable_tracing()
        provider.shutdown()
