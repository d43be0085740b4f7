"""A real OTLP/HTTP trace receiver for the tests: what the broker's exporter sends, decoded.

The broker runs as a subprocess, so its spans are collected the way a collector would: the
exporter POSTs protobuf `ExportTraceServiceRequest`s to `/v1/traces` (OTEL_EXPORTER_OTLP_ENDPOINT
points here) and each is kept raw (for the canary check) and decoded (for the assertions).
"""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    end_ns: int
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    attributes: dict[str, Any]
    trace_state: str
    service: str  # the resource's service.name


@dataclass
class Receiver:
    endpoint: str
    bodies: list[bytes] = field(default_factory=list)
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def in_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def raw(self) -> bytes:
        with self.lock:
            return b"".join(self.bodies)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


def _decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for resource in request.resource_spans:
        service = {a.key: _value(a.value) for a in resource.resource.attributes}.get("service.name", "")
        for scope in resource.scope_spans:
            for s in scope.spans:
                out.append(
                    ReceivedSpan(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        kind=s.kind,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        status_code=s.status.code,
                        status_message=s.status.message,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        trace_state=s.trace_state,
                        service=service,
                    )
                )
    return out


@contextlib.contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            receiver = holder[0]
            spans = _decode(body) if self.path == "/v1/traces" else []
            with receiver.lock:
                receiver.bodies.append(body)
                receiver.spans.extend(spans)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(Receiver(endpoint=f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
