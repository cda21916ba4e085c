"""``tracetool attach``: watch live servers in the TUI, or record their stream headless.

A thin layer over :mod:`tracetool.live`: it parses addresses and options,
checks what can be checked before anything is drawn (addresses, presets, the
TLS root file, a token the server refuses: exit 2 or 3, one line), then runs
the viewer on a :class:`~tracetool.live.source.LiveSource`; with ``--record``,
:func:`~tracetool.live.headless.record_live`; with ``--json --duration`` alone,
:func:`~tracetool.live.headless.watch_live` and one analysis of the fleet's
windows in ``analyze --json``'s dataset shape (:func:`analyzers.fleet.analyze_keyed`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tracetool.cli.common import emit_json, json_option, roofline_options, warn
from tracetool.cli.metrics_options import metrics_options
from tracetool.errors import EXIT_INTERRUPTED, BadInput, UsageError
from tracetool.live.config import LIVE_FLUSH_S
from tracetool.live.priority import OBSERVER_NICE, observer_priority
from tracetool.live.protocol import TOKEN_ENV, Address, parse_address

if TYPE_CHECKING:
    from analyzers.options import AnalysisOptions
    from tracetool.live.client import ClientOptions
    from tracetool.live.config import LiveConfig
    from tracetool.live.window import WindowSpec

F = TypeVar("F", bound=Callable[..., Any])


def live_options(fn: F) -> F:
    """``--live HOST:PORT`` and its ``--live-token``/``--live-tls-*``/``--live-flush-s`` flags
    (``serve``, ``record``)."""
    fn = click.option("--live-flush-s", type=click.FloatRange(0.02, 10.0), default=None,
                      help="With --live: the writer flushes at least this often, the floor of the "
                           "viewers' lag. Each flush costs the host the same whatever its size: "
                           "halving this doubles what watching costs (docs/live.md). "
                           f"[default: {LIVE_FLUSH_S:g}]")(fn)
    fn = click.option("--live-tls-key", type=click.Path(path_type=Path, dir_okay=False), default=None,
                      help="With --live: PEM private key of --live-tls-cert.")(fn)
    fn = click.option("--live-tls-cert", type=click.Path(path_type=Path, dir_okay=False), default=None,
                      help="With --live: PEM certificate (chain); viewers then connect with TLS.")(fn)
    fn = click.option("--live-token", envvar=TOKEN_ENV, show_envvar=True, default=None,
                      help="With --live: a shared token viewers must give (tracetool attach --token).")(fn)
    fn = click.option("--live", "live", metavar="HOST:PORT", default=None,
                      help="Stream the trace as it is written to `tracetool attach` viewers on this "
                           "address (HOST defaults to 127.0.0.1; port 0 picks one). Off by default. "
                           "See docs/live.md.")(fn)
    return fn


def live_config(live: str | None, token: str | None, tls_cert: Path | None,
                tls_key: Path | None, flush_s: float | None = None) -> LiveConfig | None:
    """The endpoint's config from the flags, checked (exit 2) before anything starts; None when off."""
    if live is None:
        if tls_cert is not None or tls_key is not None:
            raise UsageError("--live-tls-cert/--live-tls-key need --live HOST:PORT")
        if flush_s is not None:
            raise UsageError("--live-flush-s needs --live HOST:PORT")
        return None
    from tracetool.live.config import LiveConfig

    cfg = LiveConfig(address=live, token=token or None, tls_cert=tls_cert, tls_key=tls_key,
                     flush_interval_s=LIVE_FLUSH_S if flush_s is None else flush_s)
    cfg.check()
    return cfg


@click.command()
@click.argument("addresses", nargs=-1, required=True, metavar="ADDR [ADDR...]")
@click.option("--token", envvar=TOKEN_ENV, default=None, show_envvar=True,
              help="The servers' shared token (given to them with --live-token).")
@click.option("--tls", is_flag=True, help="Connect with TLS, trusting the system's roots.")
@click.option("--tls-root", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="PEM file of the CA (or self-signed certificate) to trust; implies --tls.")
@click.option("--window-s", type=click.FloatRange(0), default=30.0, show_default=True,
              help="Analyse the last N seconds of each server's clock (0: no time limit).")
@click.option("--window-requests", type=click.IntRange(1), default=None,
              help="Analyse only the N most recently started requests (within --window-s).")
@click.option("--refresh-s", type=click.FloatRange(0.05), default=0.2, show_default=True,
              help="Seconds between views (0.2: 5 Hz; two analyses run at once, a slower one skips views).")
@click.option("--no-history", is_flag=True,
              help="Do not ask for the servers' recent history: start from what arrives now.")
@click.option("--record", "record_dir", type=click.Path(path_type=Path), default=None,
              help="Headless: save the live stream as a v1 trace in this directory (no TUI).")
@click.option("--duration", type=click.FloatRange(0, min_open=True), default=None,
              help="With --record: seconds to record. With --json (no --record): seconds to watch before "
                   "the one analysis of every server's window.")
@click.option("--force", is_flag=True, help="With --record: replace the trace in a non-empty directory.")
@roofline_options
@click.option("--theme", type=click.Choice(["dark", "light"]), default="dark", show_default=True,
              help="Colour theme (T toggles it in the app).")
@click.option("--nice", type=click.IntRange(0, 19), default=OBSERVER_NICE, show_default=True,
              help="Lower this viewer's CPU priority by N, so a server on the same host keeps the CPU "
                   "it needs (0: keep the priority).")
@click.option("--connect-timeout", type=click.FloatRange(0, min_open=True), default=5.0, show_default=True,
              help="Seconds the first contact with each server may take.")
@metrics_options(auto=False)
@json_option
def attach(addresses: tuple[str, ...], token: str | None, tls: bool, tls_root: Path | None, window_s: float,
           window_requests: int | None, refresh_s: float, no_history: bool, record_dir: Path | None,
           duration: float | None, force: bool, analysis: AnalysisOptions, theme: str, nice: int,
           connect_timeout: float, as_json: bool, metrics_url: str | None = None,
           metrics_interval: float = 1.0) -> int:
    """Watch running servers live, or record their stream (ADDR is the HOST:PORT given to --live).

    \b
        tracetool serve --live 127.0.0.1:9100 -o trace &
        tracetool attach 127.0.0.1:9100
        tracetool attach 10.0.0.5:9100 10.0.0.6:9100 --window-s 60
        tracetool attach 127.0.0.1:9100 --record live-trace --duration 30
        tracetool attach 10.0.0.5:9100 10.0.0.6:9100 --json --duration 30

    The TUI of `tracetool tui` on a sliding window of each server's trace
    (last --window-s seconds, or the last --window-requests requests; w
    cycles the window), re-analysed every --refresh-s: every server alone
    and all together (t switches). The header shows per server whether it
    is connected, the tokens received and their rate, and rows the stream
    dropped; a server that goes away shows as disconnected and is
    reconnected with backoff. With --record (and --duration) there is no
    TUI: the stream is saved as a v1 trace (one per server in
    DIR/server=HOST:PORT when several, a dataset `analyze` groups per
    server) and a summary goes to stderr (--json: on stdout). With --json
    --duration S and no --record, the servers are watched for S seconds
    and one document is printed: analyze --json's on a dataset, over every
    server's window, with one group per server (dataset.bad_traces: the
    servers that gave nothing, and why). Exit 3 when a server refuses the
    token or TLS fails, or nothing could be recorded or analysed; 2 for bad
    options; 130 after Ctrl-C (a recording is still saved, what was watched
    still analysed). With --record and --metrics-url URL (one ADDR), the
    server's Prometheus metrics are scraped into the recorded trace too (on
    this host's clock).
    """
    from tracetool.live.client import ClientOptions
    from tracetool.live.window import WindowSpec

    addrs = [parse_address(a, option="ADDR") for a in addresses]
    if record_dir is not None and duration is None:
        raise UsageError("--record DIR and --duration SECONDS go together")
    if record_dir is None and duration is not None and not as_json:
        raise UsageError("--duration goes with --record DIR (save the stream) or --json (analyse the servers' "
                         "windows once after S seconds)")
    if record_dir is None and as_json and duration is None:
        raise UsageError("--json without --record needs --duration SECONDS (how long to watch before the one "
                         "analysis; the TUI prints nothing)")
    root = None
    if tls_root is not None:
        try:
            root = tls_root.read_bytes()
        except OSError as e:
            raise BadInput(f"{tls_root}: cannot read the TLS root ({e.strerror or e})") from e
    options = ClientOptions(token=token or None, tls=tls, tls_root=root, history=not no_history,
                            connect_timeout_s=connect_timeout)
    metrics = None
    if metrics_url is not None:
        from collectors.prometheus import metrics_url as checked

        if record_dir is None or len(addrs) != 1:
            raise UsageError("--metrics-url goes with --record and one ADDR (the samples go into its trace); to "
                             "watch an engine's metrics live, give --metrics-url to the recording process "
                             "(tracetool serve/record --live ... --metrics-url URL): its stream carries them")
        metrics = (checked(metrics_url), metrics_interval)
    with observer_priority(nice):  # before any thread starts: they inherit it (live/priority.py)
        if record_dir is not None and duration is not None:
            return _record(addrs, record_dir, duration, options, force, as_json, metrics)
        spec = WindowSpec(seconds=window_s or None, requests=window_requests)
        if duration is not None:
            return _fleet_json(addrs, duration, options, spec, analysis, connect_timeout)
        return _watch(addrs, options, spec, refresh_s, analysis, theme, connect_timeout)


def _watch(addrs: list[Address], options: ClientOptions, spec: WindowSpec, refresh_s: float,
           analysis: AnalysisOptions, theme: str, connect_timeout: float) -> int:
    from tracetool.live.source import LiveSource
    from tracetool.tui import launch

    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise UsageError("tracetool attach needs an interactive terminal (stdin and stderr must be a TTY); "
                         "use --record DIR --duration S to save the stream instead")
    source = LiveSource(addrs, options=options, window=spec, refresh_s=refresh_s)
    try:
        source.wait_first(connect_timeout)  # a refused token or failed TLS: exit 3 before drawing
    except BaseException:
        source.close()
        raise
    return launch(source, analysis, theme=theme)


def _fleet_json(addrs: list[Address], duration: float, options: ClientOptions, spec: WindowSpec,
                analysis: AnalysisOptions, connect_timeout: float) -> int:
    """Watch for ``duration`` seconds, then print one analysis of every server's window: the document
    of ``analyze --json`` on a dataset keyed ``server`` (what ``--record DIR`` saves)."""
    from analyzers.fleet import analyze_keyed
    from tracetool.dataset import Member, hive_keys
    from tracetool.live.headless import server_folder, watch_live

    warn(f"watching {', '.join(str(a) for a in addrs)} for {duration:g} s (window: {spec.describe()})")
    result = watch_live(addrs, duration, options=options, window=spec, connect_timeout_s=connect_timeout)
    good, bad = [], []
    for s in result.servers:  # labelled and keyed as DIR/server=HOST:PORT of --record: the same groups
        label = server_folder(s.address)
        member = Member(Path(str(s.address)), label, hive_keys([label]))
        if s.trace is not None:
            good.append((member, s.trace))
        else:
            bad.append((member, s.why_empty))
    if not good:
        why = "; ".join(f"{m.path}: {r}" for m, r in bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        if result.interrupted:
            warn(f"interrupted before any server gave a request to analyse ({why})")
            return EXIT_INTERRUPTED
        raise BadInput(f"nothing to analyse: {why}")
    doc = analyze_keyed(good, analysis, bad=bad).to_json()
    for w in doc["warnings"]:
        warn(w)
    emit_json(doc)
    return _ended(result.interrupted, result.servers)


def _ended(interrupted: bool, servers: Sequence[Any]) -> int:
    """The exit of a headless attach: 130 if interrupted, bad input if a server refused the token, else 0."""
    if interrupted:
        return EXIT_INTERRUPTED
    refused = [s for s in servers if s.refused]
    if refused:
        raise BadInput(f"{refused[0].address}: refused: {refused[0].refused} (give the server's token with "
                       f"--token or ${TOKEN_ENV})")
    return 0


def _record(addrs: list[Address], out: Path, duration: float, options: ClientOptions, force: bool,
            as_json: bool, metrics: tuple[str, float] | None = None) -> int:
    from tracetool.live.headless import SERVER_KEY, record_live

    warn(f"recording {', '.join(str(a) for a in addrs)} for {duration:g} s into {out}")
    beside = None
    if metrics is not None:
        from collectors.prometheus import scrape_into_writer

        url, interval = metrics

        def beside(writer: Any) -> Callable[[], None]:  # the viewer's own clock: "scraper"
            return scrape_into_writer(writer, url, clock="scraper", interval_s=interval)

    result = record_live(addrs, out, duration, options=options, force=force, progress=warn, beside=beside)
    several = len(addrs) > 1
    if several:
        warn(f"{out}: a dataset keyed by server: `tracetool analyze {out}` analyses it per server")
    if as_json:
        emit_json({"version": 1, "out": str(result.out), "seconds": round(result.elapsed_s, 3),
                   "interrupted": result.interrupted,
                   "servers": [{"address": str(s.address), "directory": str(s.directory),
                                "keys": {SERVER_KEY: str(s.address)} if several else {},
                                "connected": s.connected, "refused": s.refused, "reason": s.reason or None,
                                "rows": s.rows, "dropped_rows": s.dropped, "reconnects": s.reconnects,
                                "batches_missed": s.gaps} for s in result.servers]})
    if code := _ended(result.interrupted, result.servers):
        return code
    missing = [s for s in result.servers if not s.connected]
    if missing:
        raise BadInput(f"{missing[0].address}: nothing recorded ({missing[0].reason or 'not reachable'})")
    return 0
