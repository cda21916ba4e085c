"""Running ``tracetool serve``: load the model, start the recorder and engine, serve with uvicorn.

The readiness line ``tracetool: serving http://HOST:PORT/v1 ...`` goes to stderr
once uvicorn accepts connections (``--port 0`` picks a free port; the line
says which). SIGINT or SIGTERM stop accepting, let running requests finish
for up to ``graceful_s`` seconds, end the rest, and close the trace, which
then reads ``"closed": true``; the exit code is 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracetool.errors import BadInput, UsageError
from tracetool.serving.openai_api import Limits
from tracetool.untrusted import echo


@dataclass
class ServeConfig:
    """Options of ``tracetool serve`` (see its ``--help``)."""

    out: Path
    model_path: Path | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    served_name: str | None = None
    max_batch: int = 8
    max_waiting: int = 256
    limits: Limits = field(default_factory=Limits)
    device: str = "cpu"
    seed: int = 0
    graceful_s: float = 5.0
    switch_interval_s: float = 0.0005
    #: torch CPU threads (None: torch's choice)
    threads: int | None = None
    force: bool = False
    #: ``--<name>[=HZ]`` samplers of :data:`collectors.launcher.SAMPLERS` (NVML, py-spy), name -> Hz.
    samplers: Mapping[str, float] = field(default_factory=dict)
    #: ``--live HOST:PORT``: a :class:`tracetool.live.config.LiveConfig` (None: off).
    live: Any = None
    #: False (``--no-record``): the collectors are installed but switched off
    #: (``Recorder(enabled=False)``): the baseline the recorder's cost is measured against.
    record: bool = True
    #: ``--metrics-url``: (URL, interval s) of a server's Prometheus metrics to scrape into the trace
    metrics: tuple[str, float] | None = None


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        family, _, proto, _, addr = infos[0]
        # proto must say TCP: asyncio turns Nagle off only on sockets that do, and with Nagle
        # on, a response written in pieces waits ~40 ms for the client's delayed ACK
        sock = socket.socket(family, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port} ({e.strerror or e}); pick another --port "
                         "(0 picks a free one)") from e
    return sock


def load(cfg: ServeConfig) -> tuple[Any, Any, str]:
    """(model, tokenizer, served name): ``--model PATH`` or the demo model. Resolves ``device="auto"``."""
    from collectors.demo import DEMO_NAME, load_demo_model, load_model

    if cfg.model_path is not None and not Path(cfg.model_path).is_dir():
        raise BadInput(f"{cfg.model_path}: not a local model directory (tracetool serve never downloads; "
                       "give a Hugging Face model directory holding config.json)")
    if cfg.model_path is not None and not (Path(cfg.model_path) / "config.json").is_file():
        raise BadInput(f"{cfg.model_path}: not a model directory (no config.json)")
    import torch  # only now: the checks above answer without it

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    if cfg.device == "auto":
        cfg.device = "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.model_path is not None:
        model, tok = load_model(cfg.model_path, device=cfg.device)
        return model, tok, cfg.served_name or Path(cfg.model_path).resolve().name
    model, tok = load_demo_model(seed=cfg.seed, device=cfg.device)
    return model, tok, cfg.served_name or DEMO_NAME


def _uvicorn_server(app: Any, cfg: ServeConfig, url: str, on_ready: Callable[[str], None]) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, minus re-raising the stop signal after shutdown (we exit 0 ourselves)."""

        stop_signal: int | None = None

        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            import threading

            if threading.current_thread() is not threading.main_thread():
                yield
                return

            def handler(sig: int, frame: Any) -> None:
                self.stop_signal = self.stop_signal or sig
                self.handle_exit(sig, frame)

            old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                on_ready(url)

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=max(1, round(cfg.graceful_s)), timeout_keep_alive=30)
    return Server(config)


def run_server(cfg: ServeConfig, on_ready: Callable[[str], None] | None = None) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit code. The trace is closed on the way out."""
    from collectors.demo import hardware_meta, model_meta
    from collectors.launcher import start_samplers
    from tracetool.recorder import Recorder
    from tracetool.serving.engine import Engine
    from tracetool.serving.server import ServerState, build_app
    from tracetool.writer.output import prepare_output

    out = Path(cfg.out)
    prepare_output(out, cfg.force, create=False)
    # The engine thread holds the GIL between torch ops; the default 5 ms switch interval
    # would let it delay the event loop (request arrival, each SSE write) by that much,
    # time the middleware cannot see and the client would count as network.
    sys.setswitchinterval(cfg.switch_interval_s)
    sock = bind(cfg.host, cfg.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/v1"
    model, tok, served = load(cfg)
    meta = {"model": model_meta(model), "hardware": hardware_meta(cfg.device),
            "producer": {"name": "tracetool serve"},
            "serve": {"url": url, "served_model": served, "max_batch": cfg.max_batch}}
    live = None
    if cfg.live is not None:
        from tracetool.live.sidecar import live_spec

        live = live_spec(cfg.live)
    rec = Recorder(out, meta=meta, flush_interval_s=0.5, live=live, enabled=cfg.record).start()
    if not cfg.record:
        rec.note("recording off (--no-record): the collectors were installed but switched off")
    rec.writer.sink("requests")
    rec.writer.sink("steps")
    engine = Engine(model, tok, rec, max_batch=cfg.max_batch, max_waiting=cfg.max_waiting)
    engine.warm_up()
    engine.start()
    # --nvml[=HZ] / --pyspy[=HZ]: every sampler of collectors.launcher.SAMPLERS runs here,
    # in-process, writing into the server's own trace
    stops = start_samplers(rec, cfg.samplers, os.getpid())
    if cfg.metrics is not None:
        from collectors.prometheus import attach_scraper

        attach_scraper(rec, cfg.metrics[0], clock="server", interval_s=cfg.metrics[1])
    context = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
    state = ServerState(engine, rec, served, context, cfg.limits)

    def ready(u: str) -> None:
        echo(f"tracetool: serving {u} (model {served}; trace {out}); Ctrl-C stops and closes the trace", err=True)
        if on_ready is not None:
            on_ready(u)

    server = _uvicorn_server(build_app(state), cfg, url, ready)
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        engine.close()
        for stop in stops:
            rec.guard(stop, where="sampler stop")
        rec.close()
        sock.close()
        done = engine.tokens_generated
        echo(f"tracetool: server stopped; trace {out} closed ({done} tokens generated)", err=True)
    return 0
