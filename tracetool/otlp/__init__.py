"""OpenTelemetry traces from servers tracetool did not write: decode, map, record.

Production servers (vLLM, SGLang, TGI) publish per-request timings as
OpenTelemetry spans over OTLP. This package turns them into a v1 trace:

* :mod:`tracetool.otlp.decode` reads OTLP payloads (protobuf, or the OTLP
  JSON encoding) with the official ``opentelemetry-proto`` messages into
  plain :class:`~tracetool.otlp.decode.OtelSpan` records, refusing what is
  malformed with :class:`~tracetool.otlp.decode.BadPayload`;
* :mod:`tracetool.otlp.mapping` reads each server's spans as tracetool's
  phases (``server.request``, ``queue``, ``prefill``, ``decode``...) on the
  server's clock, per request (docs/otlp.md says what each server reports);
* :mod:`tracetool.otlp.sink` groups spans by trace and request and writes the
  rows with the trace writer;
* :mod:`tracetool.otlp.receiver` is ``tracetool receive``: an OTLP/gRPC and
  OTLP/HTTP receiver feeding the sink;
* :mod:`tracetool.otlp.join` lets ``tracetool merge`` join a probe's trace
  and a received one on the W3C trace id when the server kept its own
  request ids.

Only the core (schema, writer) is imported here; ``grpc`` and ``uvicorn`` load
in the receiver alone.
"""
