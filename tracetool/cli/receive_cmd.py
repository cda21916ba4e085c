"""``tracetool receive``: an OTLP trace receiver for servers tracetool did not write."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click


@click.command()
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Trace directory to write (default: a new temporary directory, printed).")
@click.option("--force", is_flag=True, help="Replace the trace in a non-empty output directory.")
@click.option("--otlp-grpc", "grpc_addr", default="127.0.0.1:4317", show_default=True, metavar="HOST:PORT",
              help="OTLP/gRPC address ('off' for none; port 0 picks a free one).")
@click.option("--otlp-http", "http_addr", default="127.0.0.1:4318", show_default=True, metavar="HOST:PORT",
              help="OTLP/HTTP address, path /v1/traces ('off' for none; port 0 picks a free one).")
@click.option("--duration", type=click.FloatRange(0, min_open=True), default=None, metavar="S",
              help="Stop after S seconds (default: run until Ctrl-C or SIGTERM).")
@click.option("--max-body-bytes", type=click.IntRange(1024), default=16 << 20, show_default=True,
              help="Largest payload accepted (HTTP 413 / gRPC RESOURCE_EXHAUSTED beyond).")
@click.option("--idle", "idle_s", type=click.FloatRange(0.1), default=10.0, show_default=True, metavar="S",
              help="Seconds a trace stays open for late spans before its stray spans are settled.")
@click.option("--read-timeout", "read_timeout_s", type=click.FloatRange(0.1), default=10.0, show_default=True,
              metavar="S", help="Seconds an OTLP/HTTP request's headers and body, or an OTLP/gRPC call's "
                                "message, may take to arrive (HTTP 408, gRPC DEADLINE_EXCEEDED beyond; the OTLP "
                                "exporters' own timeout is 10 s).")
@click.option("--max-connections", type=click.IntRange(1), default=128, show_default=True,
              help="OTLP/HTTP connections open at once (HTTP 503 beyond), and gRPC calls at once.")
def receive(output: Path | None, force: bool, grpc_addr: str, http_addr: str, duration: float | None,
            max_body_bytes: int, idle_s: float, read_timeout_s: float, max_connections: int) -> int:
    """Receive OpenTelemetry spans over OTLP and write them as a trace.

    \b
        tracetool receive -o server-trace
        vllm serve MODEL --otlp-traces-endpoint http://127.0.0.1:4317
        tracetool probe http://127.0.0.1:8000/v1 -o client-trace
        tracetool merge client-trace server-trace -o joined

    An OpenTelemetry trace receiver: OTLP/gRPC (default 127.0.0.1:4317) and
    OTLP/HTTP with protobuf or JSON bodies on /v1/traces (default
    127.0.0.1:4318), bound to loopback unless told otherwise. The spans that
    vLLM (llm_request), SGLang (request slices), TGI (router spans) and any
    server following the OpenTelemetry GenAI conventions publish become
    server.request, queue, prefill and decode spans per request on the
    server's clock, with token counts; what a server does not report stays
    not measured, and other spans are kept as otlp:<name>. Every span is also
    kept as it came in the otlp_spans table, with its W3C trace id, which
    `tracetool merge` joins on when the server kept its own request ids.
    Malformed payloads, wrong content types, oversized bodies and unknown
    attribute types get a 4xx and one line on stderr; the receiver goes on.
    A request that does not arrive within --read-timeout gets 408 (a gRPC
    call whose message does not, DEADLINE_EXCEEDED), idle connections
    close, and beyond --max-connections a client gets 503 (gRPC:
    RESOURCE_EXHAUSTED).
    Ctrl-C, SIGTERM or --duration stop it and close the trace (exit 0)
    within about a second, whatever the clients are doing.
    See docs/otlp.md.
    """
    from tracetool.otlp.receiver import ReceiveConfig, run_receiver

    out = output or Path(tempfile.mkdtemp(prefix="tracetool-receive-"))
    grpc = None if grpc_addr.strip().lower() in ("off", "none", "") else grpc_addr
    http = None if http_addr.strip().lower() in ("off", "none", "") else http_addr
    cfg = ReceiveConfig(out=out, grpc=grpc, http=http, duration_s=duration, max_body_bytes=max_body_bytes,
                        idle_s=idle_s, force=force or output is None, read_timeout_s=read_timeout_s,
                        max_connections=max_connections)
    return run_receiver(cfg)
