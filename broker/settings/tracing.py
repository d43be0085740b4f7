"""OpenTelemetry spans of /mcp requests (broker/tracing.py, docs/tracing.md)."""

from __future__ import annotations

from dataclasses import dataclass

from broker.settings.reader import Reader


@dataclass(frozen=True)
class TracingSettings:
    # A span per /mcp request, exported by OTLP/HTTP as the standard OTEL_* variables say.
    enabled: bool = False


def tracing_settings(r: Reader) -> TracingSettings:
    return TracingSettings(
        enabled=r.flag(
            "TRACING",
            False,
            doc=(
                "`1`: an OpenTelemetry span per `/mcp` request (names and timings only) with the "
                "sandbox's spans under it, exported by OTLP/HTTP as the standard `OTEL_*` variables say "
                "([docs/tracing.md](docs/tracing.md))"
            ),
        )
    )
