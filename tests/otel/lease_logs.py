"""Lease log records from the OpenTelemetry Python SDK, for leaseline's
OTLP tests (tests/otlp.rs).

A holder logs through Python's `logging` with the SDK's LoggingHandler,
inside a span, as a service instrumented with OpenTelemetry would. Its
resource names the holder once (`lease.source`, `lease.holder_id`,
`lease.backend`); each record names the lease, the kind and the token.
Four records: acquired, renewed, released for LEASE, and one without a
lease id, which leaseline must refuse and keep.

  lease_logs.py send URL LEASE    export through the SDK's OTLP/HTTP
      exporter (protobuf, gzip) to URL (.../v1/logs), via a proxy here that
      forwards the first export and then loses its answer (503, as a
      dropped connection would), so the exporter sends the batch again.
      Prints a JSON report: what leaseline answered each attempt, whether
      the SDK's export succeeded, and the span's trace and span ids.
  lease_logs.py encode FILE LEASE    write the same records as one
      ExportLogsServiceRequest in protobuf: what the Collector's Kafka
      exporter writes with `encoding: otlp_proto`.
"""

import http.server
import json
import logging
import sys
import threading
import urllib.error
import urllib.request

from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    InMemoryLogRecordExporter,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

RESOURCE = Resource.create(
    {
        "service.name": "billing",
        "lease.source": "holder",
        "lease.holder_id": "pod-1",
        "lease.backend": "etcd",
    }
)


def emit(provider, lease):
    """Logs the four records inside one span; returns its ids as hex."""
    log = logging.getLogger("leases")
    log.setLevel(logging.INFO)
    log.propagate = False
    log.handlers = [LoggingHandler(level=logging.INFO, logger_provider=provider)]
    tracer = TracerProvider(resource=RESOURCE).get_tracer("leases")
    with tracer.start_as_current_span("nightly-billing") as span:
        log.info(
            "lease acquired",
            extra={
                "lease.kind": "acquired",
                "lease.id": lease,
                "lease.fencing_token": 7,
                "lease.ttl_ms": 10000,
                "lease.mono_ms": 1000.5,
                "lease.keepalive_sent_mono_ms": 990.0,
            },
        )
        log.info(
            "lease renewed",
            extra={
                "lease.kind": "renewed",
                "lease.id": lease,
                "lease.fencing_token": 7,
                "lease.ttl_ms": 10000,
            },
        )
        log.info(
            "lease released",
            extra={"lease.kind": "released", "lease.id": lease, "lease.fencing_token": 7},
        )
        log.warning(
            "released something",
            extra={"lease.kind": "released", "lease.fencing_token": 7},
        )
        ctx = span.get_span_context()
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


class LosesFirstAnswer(http.server.BaseHTTPRequestHandler):
    """Forwards each export to the target; the first one's answer is lost."""

    target = ""
    attempts = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        headers = {
            k: self.headers[k]
            for k in ("Content-Type", "Content-Encoding")
            if self.headers[k] is not None
        }
        req = urllib.request.Request(self.target, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status, reply, ctype = r.status, r.read(), r.headers["Content-Type"]
        except urllib.error.HTTPError as e:
            status, reply, ctype = e.code, e.read(), e.headers["Content-Type"]
        LosesFirstAnswer.attempts.append(status)
        if len(LosesFirstAnswer.attempts) == 1:
            # leaseline has the batch; the exporter never hears so.
            self.send_response(503)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


class Recording(OTLPLogExporter):
    results = []

    def export(self, batch):
        result = super().export(batch)
        Recording.results.append(result.name)
        return result


def send(url, lease):
    LosesFirstAnswer.target = url
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), LosesFirstAnswer)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    exporter = Recording(
        endpoint=f"http://127.0.0.1:{proxy.server_address[1]}/v1/logs",
        compression=Compression.Gzip,
        timeout=60,
    )
    provider = LoggerProvider(resource=RESOURCE)
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    trace_id, span_id = emit(provider, lease)
    provider.force_flush(60_000)
    provider.shutdown()
    proxy.shutdown()
    print(
        json.dumps(
            {
                "attempts": LosesFirstAnswer.attempts,
                "results": Recording.results,
                "trace_id": trace_id,
                "span_id": span_id,
            }
        )
    )


def encode(path, lease):
    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=RESOURCE)
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    trace_id, span_id = emit(provider, lease)
    with open(path, "wb") as f:
        f.write(encode_logs(memory.get_finished_logs()).SerializeToString())
    print(json.dumps({"trace_id": trace_id, "span_id": span_id}))


if __name__ == "__main__":
    mode, arg, lease = sys.argv[1:4]
    {"send": send, "encode": encode}[mode](arg, lease)
