"""``analyze()``: run the SQL modules over one or more traces and collect the results.

The :class:`Analysis` it returns is what the CLI, the TUI and the CI report
read: the ``--json`` contract (:meth:`Analysis.to_json`, docs/analysis-json.md)
and the analyzers' tables as Arrow (:meth:`Analysis.table`). With several
traces the top level is all of them together and :attr:`Analysis.traces` holds
one :class:`Analysis` per trace (for a single trace, the analysis itself).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from analyzers.connection import Session, TraceArg, complete, connect, is_small, labels_for, load_traces
from analyzers.engine import engine_json, fill_components
from analyzers.options import AnalysisOptions
from analyzers.params import ClaimSpec, RooflineInputs, Thresholds
from analyzers.tail import tail_json
from tracetool.errors import BadInput, UsageError, one_line
from tracetool.reader import Trace
from tracetool.schema import COMPONENTS
from tracetool.slo import SLO

FORMAT = "tracetool-analysis"
#: Analyses of several traces (all together, then each alone) that run at once.
MAX_PARALLEL = 4
VERSION = 1

#: Summary tables copied out of DuckDB into every Analysis (small: at most one row per request).
TABLES = ("attribution_requests", "attribution_components", "latency_percentiles", "decode_fit",
          "decode_throughput", "roofline_summary", "host_overhead", "steps_batch", "steps_prefill",
          "steps_accounting", "tokens_gap_stats",
          "gpu_decode", "stacks_categories", "network_evidence", "summary_numbers", "findings", "claims",
          "engine_summary", "engine_stats", "engine_headline", "tail_groups", "tail_components", "tail_features",
          "tail_summary")


@dataclass(eq=False)  # identity: it holds a connection, and its traces hold itself (one trace)
class Analysis:
    """The result of :func:`analyze` over one trace or several together.

    Attributes:
        label: the trace's label, or ``"all"`` for a combined analysis of several traces.
        paths: the trace directories analysed.
        tables: the analyzers' summary tables (names in :data:`TABLES`) as Arrow.
        roofline_inputs: per trace, the model and hardware numbers the roofline used.
        thresholds: the thresholds verdicts and findings used.
        traces: per-trace analyses (just ``[self]`` for one trace).
        warnings: reader warnings (cut streams, unclosed recordings), then meta.json model keys not used.
        con: the DuckDB connection holding every analyzer object (see analyzers.connect). The
            trace tables are registered on this connection only, so ``con.cursor()`` does not see
            them; from several threads, use :meth:`query`, which serialises access.
    """

    label: str
    paths: list[str]
    tables: dict[str, pa.Table]
    roofline_inputs: list[RooflineInputs]
    thresholds: Thresholds
    con: duckdb.DuckDBPyConnection
    traces: list[Analysis] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: A first look's completion (:meth:`complete`), None for a whole analysis.
    _finish: Callable[[], Analysis] | None = field(default=None, repr=False)
    _whole: Analysis | None = field(default=None, repr=False)

    @property
    def first_look(self) -> bool:
        """Whether this is a first look (``analyze(first_look=True)``): the request-level figures of the
        whole analysis (where the time went, TTFT, TPOT, e2e), every figure read from token gaps null
        (ITL, host time, the step accounting), and findings and claim verdicts made without them."""
        return self._finish is not None

    def interrupt(self) -> None:
        """Stop what runs on this analysis's connection, from any thread (a viewer quitting while a first look
        is completed): :meth:`complete` then raises BadInput. Nothing running: nothing happens."""
        self.con.interrupt()

    def complete(self) -> Analysis:
        """The whole analysis of a first look, made on its connection by running what the first look left
        out (the first look keeps its tables); ``self`` for a whole analysis. Once: a second call returns
        the same object.

        Raises:
            BadInput: the traces' values break an analyzer the first look did not run."""
        if self._finish is None:
            return self
        if self._whole is None:
            whole = self._finish()
            whole.traces = [whole] if self.traces == [self] else list(self.traces)
            self._whole = whole
        return self._whole

    def query(self, sql: str, params: Sequence[Any] = ()) -> pa.Table:
        """Run SQL over the trace tables and analyzer objects; safe to call from any thread."""
        with self._lock:
            return self.con.sql(sql, params=list(params) or None).to_arrow_table()

    def release(self) -> None:
        """Close the DuckDB connection, keeping the summary tables (and so the JSON): a dataset's
        per-trace analyses, thousands of them, hold no database each. :meth:`query` fails after."""
        with self._lock:
            self.con.close()

    def table(self, name: str) -> pa.Table:
        """One of the summary tables (see :data:`TABLES`)."""
        return self.tables[name]

    def rows(self, name: str) -> list[dict[str, Any]]:
        return self.tables[name].to_pylist()

    def one(self, name: str) -> dict[str, Any]:
        rows = self.rows(name)
        return rows[0] if rows else {}

    @property
    def requests(self) -> pa.Table:
        """Per-request attribution (``attribution_requests``)."""
        return self.tables["attribution_requests"]

    def token_gaps(self, request_id: str | None = None, trace: str | None = None) -> pa.Table:
        """Per-token ITL rows (``tokens_gaps``) of one request, of one trace, or of all (large).

        A request is selected by its integer ``request_key``, the sort's partition, so
        only that request's tokens are ordered (fast on big traces).
        """
        sql, params = "SELECT * FROM tokens_gaps", []
        if request_id is not None:
            keys = self.query("SELECT request_key FROM tokens_requests WHERE request_id = ?"
                              + (" AND trace = ?" if trace is not None else ""),
                              [request_id] + ([trace] if trace is not None else []))
            found = [k for k in keys.column("request_key").to_pylist() if k is not None]
            if not found:
                return self.query(sql + " WHERE false")
            sql += f" WHERE request_key IN ({', '.join('?' * len(found))})"
            params = found
        elif trace is not None:
            sql, params = sql + " WHERE trace = ?", [trace]
        return self.query(sql + " ORDER BY trace, request_id, index", params)

    def slo(self, spec: SLO) -> dict[str, Any]:
        """Goodput and attainment of ``spec`` over this analysis' requests (tracetool.slo; the ``slo``
        object of docs/analysis-json.md): per request TTFT, TPOT, mean ITL and e2e, failed ones
        counted as missing it; goodput per second of the decode block's wall time."""
        rows = [{"ok": r["ok"], "ttft_ms": r["ttft_ms"], "tpot_ms": r["tpot_ms"], "itl_ms": r["itl_mean_ms"],
                 "e2e_ms": r["e2e_ms"]} for r in self.rows("attribution_requests")]
        return spec.evaluate(rows, self.one("decode_throughput").get("wall_s"))

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document of ``tracetool analyze`` (docs/analysis-json.md)."""
        doc = {"format": FORMAT, "version": VERSION, **self._body()}
        doc["traces"] = [{"trace": t.label, "path": t.paths[0], **t._body()} for t in self.traces]
        return doc

    # -- building the JSON body ---------------------------------------------------------
    def _body(self) -> dict[str, Any]:
        s = self.one("summary_numbers")
        lat = {r["metric"]: r for r in self.rows("latency_percentiles")}
        comps = {r["component"]: r for r in self.rows("attribution_components")}
        tp = self.one("decode_throughput")
        fit = next((r for r in self.rows("decode_fit") if r["level"] == "all"), None)
        roof = self.one("roofline_summary")
        host = self.one("host_overhead")
        acc = self.one("steps_accounting")
        gaps = self.one("tokens_gap_stats")
        body: dict[str, Any] = {
            "requests": s.get("requests", 0),
            "failed_requests": s.get("failed_requests", 0),
            "e2e_ms": _pcts(lat.get("e2e")),
            "ttft_ms": _pcts(lat.get("ttft")),
            "itl_ms": _pcts(lat.get("itl")),
            "tpot_ms": _pcts(lat.get("tpot")),
            "components": {c: {"ms": _num(comps[c]["ms"]), "share": _num(comps[c]["share"]),
                               "measured": bool(comps[c]["measured"]), "requests": comps[c]["requests"]}
                           for c in COMPONENTS if c in comps},
            "bottleneck": s.get("bottleneck"),
            "network_evidence": _clean(self.one("network_evidence")) or None,
            "headline": s.get("headline"),
            "decode": {
                "per_request_tok_s": _num(tp.get("per_request_tok_s")),
                "aggregate_tok_s": _num(tp.get("aggregate_tok_s")),
                "output_tokens": tp.get("output_tokens"),
                "decode_s_mean": _num(tp.get("decode_s_mean")),
                "mean_concurrency": _num(tp.get("mean_concurrency")),
                "wall_s": _num(tp.get("wall_s")),
                # per request-step from the step accounting; else tokens per streamed chunk
                "tokens_per_step": _num(acc.get("tokens_per_step")) if acc.get("emissions")
                else (gaps["gap_tokens"] / gaps["gaps"] if gaps.get("gaps") else None),
                "fit": _fit(fit),
                "roofline": _roofline(roof),
                "roofline_note": roof.get("note"),
            },
            "host": None if not host.get("tokens") and not host.get("steps") else {
                "tokens": host.get("tokens"), "itl_mean_ms": _num(host.get("itl_mean_ms")),
                "step_mean_ms": _num(host.get("step_mean_ms")), "host_mean_ms": _num(host.get("host_mean_ms")),
                "host_share": _num(host.get("host_share")), "steps": host.get("steps"),
                "step_gap_mean_ms": _num(host.get("step_gap_mean_ms")),
                "waited_mean_ms": _num(host.get("waited_mean_ms")), "basis": host.get("basis")},
            "step_accounting": _clean(acc) if acc.get("emissions") else None,
            "steps": _clean(self.one("steps_prefill")) if self.one("steps_prefill").get("steps") else None,
            "gpu": [_clean(r) for r in self.rows("gpu_decode")] or None,
            "cpu": [_clean(r) for r in self.rows("stacks_categories")] or None,
            "findings": [{"id": r["id"], "severity": r["severity"], "title": r["title"], "detail": r["detail"]}
                         for r in self.rows("findings")],
            "claims": [{"claim": r["claim"], "scope": r["scope"], "component": r["component"], "verdict": r["verdict"],
                        "share": _num(r["share"]), "basis": r["basis"], "detail": r["detail"]}
                       for r in self.rows("claims")],
            "thresholds": self.thresholds.as_dict(),
            "warnings": list(self.warnings),
        }
        # the engine's own metrics (module engine): its object, and server components no span measured
        body["engine"] = engine_json(self.rows("engine_summary"), self.rows("engine_stats"))
        fill_components(body["components"], body["engine"], body["e2e_ms"]["mean"])
        # the tail against typical requests (module tail)
        body["tail"] = tail_json(self.rows("tail_groups"), self.rows("tail_components"), self.rows("tail_features"),
                                 self.rows("tail_summary"), self.thresholds.tail_min_requests)
        told = self.one("engine_headline")
        if body["bottleneck"] is None and told.get("headline"):
            # no per-request server component, but the engine's histograms: say what they say
            body["headline"] = told["headline"]
        return body


def analyze(traces: TraceArg | Iterable[TraceArg], options: AnalysisOptions | None = None, *,
            per_trace: bool = True, session: Session | None = None, labels: Sequence[str] | None = None,
            first_look: bool = False, **option_fields: Any) -> Analysis:
    """Analyse one trace, several, or a directory of traces.

    Args:
        traces: trace directories (or a directory of traces), or opened :class:`Trace` objects.
        options: the roofline presets, claims, thresholds and memory limit
            (:class:`~analyzers.options.AnalysisOptions`); its fields may also be given as
            keywords (``analyze(trace, model="llama-3.1-8b")``), which override ``options``'s.
            Under ``memory_limit`` analyses that run side by side share it, and run one after
            the other when a share would be under :data:`MIN_ANALYSIS_MEMORY`. The engine is
            DuckDB's here (``analyze_dataset`` opens Spark's).
        per_trace: with several traces, also analyse each alone (:attr:`Analysis.traces`);
            False gives only the combined analysis (``traces`` empty), a live viewer's
            cheaper tick when it shows the combined view.
        session: keep the DuckDB connection between calls on successive snapshots of the same
            traces and swap only the data (:class:`analyzers.connection.Session`; a live view's
            ticks). Used when there is one analysis to run (one trace, or ``per_trace=False``).
        labels: one label per trace (default: directory names, suffixed where they repeat); a
            dataset labels its traces by their path under the dataset's root.
        first_look: a first look (:attr:`Analysis.first_look`): leave out the one pass that orders each
            request's tokens, most of a big trace's analysis (10M tokens: about a third of the time), and
            complete it later with :meth:`Analysis.complete`. One analysis only (one trace, or
            ``per_trace=False``), without a ``session``.

    Raises:
        BadInput: a trace is unreadable, has neither spans nor tokens, or has no requests.
        UsageError: an unknown preset, dtype or claim; an engine other than DuckDB.
    """
    opts = AnalysisOptions.of(options, **option_fields)
    if opts.engine != "duckdb":
        raise UsageError(f"analyze() runs on DuckDB; --engine {opts.engine} analyses a dataset "
                         "(analyzers.analyze_dataset)")
    opened = load_traces(traces)
    specs = opts.claim_specs()
    th = opts.thresholds
    roof = [opts.roofline(t.meta) for t in opened]
    memory_limit, spill = opts.memory_limit, opts.spill
    labels = list(labels) if labels is not None else labels_for(opened)
    if len(labels) != len(opened) or len(set(labels)) != len(labels):
        raise ValueError("labels: one distinct label per trace")
    for t in opened:
        check_usable(t)
    if first_look and (session is not None or (per_trace and len(opened) > 1)):
        raise ValueError("first_look: one analysis (one trace, or per_trace=False), without a session")
    if len(opened) == 1:
        combined = _run(opened, labels, roof, th, specs, labels[0], session, memory_limit, spill, first_look)
        combined.traces = [combined]
        return combined
    if not per_trace:
        return _run(opened, labels, roof, th, specs, "all", session, memory_limit, spill, first_look)
    # all together and each alone: separate DuckDB connections, which release the GIL while they
    # plan and run, so they go side by side (three small traces: 0.79 s one after the other,
    # 0.47 s in three threads on two cores)
    jobs: list[tuple[list[Trace], list[str], list[RooflineInputs], str]] = [(opened, labels, roof, "all")]
    jobs += [([t], [lab], [r], lab) for t, lab, r in zip(opened, labels, roof, strict=True)]
    first: list[Analysis] = []
    if memory_limit is not None and not is_small(opened):
        # under a memory limit the analysis of everything, the largest, gets all of it, alone;
        # the traces' own analyses then share it
        first, jobs = [_run(opened, labels, roof, th, specs, "all", None, memory_limit, spill)], jobs[1:]
    workers = min(len(jobs), MAX_PARALLEL, parallel_within(memory_limit))
    share = None if memory_limit is None else memory_limit // workers
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tracetool-analyze") as ex:
        done = first + list(ex.map(lambda j: _run(j[0], j[1], j[2], th, specs, j[3], None, share, spill), jobs))
    combined = done[0]
    combined.traces = done[1:]
    return combined


#: Under a memory limit, analyses go side by side only while each gets at least this much.
MIN_ANALYSIS_MEMORY = 256 * 2**20


def parallel_within(memory_limit: int | None) -> int:
    """How many analyses may run at once within ``memory_limit`` (at least one)."""
    return MAX_PARALLEL if memory_limit is None else max(1, memory_limit // MIN_ANALYSIS_MEMORY)


def _run(traces: list[Trace], labels: list[str], roof: list[RooflineInputs], th: Thresholds,
         specs: list[ClaimSpec], label: str, session: Session | None = None,
         memory_limit: int | None = None, spill: bool | None = None, first_look: bool = False) -> Analysis:
    lock = session.lock if session is not None else threading.Lock()
    with lock:  # a session's connection serves one user at a time
        con = _connect(traces, labels, roof, th, specs, session, memory_limit, spill, first_look)
        analysis = _collect(con, traces, roof, th, label, lock)
    if first_look:
        def finish() -> Analysis:
            with lock, _said(traces):
                complete(con, traces, memory_limit, spill)
                return _collect(con, traces, roof, th, label, lock)

        analysis._finish = finish
    return analysis


def _connect(traces: list[Trace], labels: list[str], roof: list[RooflineInputs], th: Thresholds,
             specs: list[ClaimSpec], session: Session | None,
             memory_limit: int | None = None, spill: bool | None = None,
             first_look: bool = False) -> duckdb.DuckDBPyConnection:
    with _said(traces):
        if session is not None:
            return session.connect(traces, roofline=roof, thresholds=th, claims=specs, labels=labels)
        return connect(traces, roofline=roof, thresholds=th, claims=specs, labels=labels,
                       memory_limit=memory_limit, spill=spill, first_look=first_look)


@contextmanager
def _said(traces: list[Trace]) -> Iterator[None]:
    """A trace whose values break an analyzer: say which, in one line, no traceback (BadInput)."""
    try:
        yield
    except duckdb.Error as e:
        raise BadInput(f"{named(t.path for t in traces)}: cannot analyse ({one_line(e)})") from e


def _collect(con: duckdb.DuckDBPyConnection, traces: list[Trace], roof: list[RooflineInputs], th: Thresholds,
             label: str, lock: threading.Lock) -> Analysis:
    n = con.sql("SELECT count(*) FROM attribution_requests").fetchall()[0][0]
    if n == 0:
        raise BadInput(f"{named(t.path for t in traces)}: no requests to analyse "
                       "(no span or token carries a request_id)")
    # a trace whose every request failed is analysed (its failures are the finding), not refused
    measurable = con.sql("SELECT e2e_requests + (SELECT gaps FROM tokens_gap_stats) "
                         "+ (SELECT count(*) FROM tokens_requests) + failed_requests "
                         "FROM summary_numbers").fetchall()[0][0]
    if not measurable:
        raise BadInput(f"{named(t.path for t in traces)}: nothing to measure: no request has a "
                       "client.request, server.request or server-clock span, and there are no tokens")
    tables = {name: con.sql(f"SELECT * FROM {name}").to_arrow_table() for name in TABLES}
    return Analysis(label=label, paths=[str(t.path) for t in traces], tables=tables, roofline_inputs=roof,
                    thresholds=th, con=con, warnings=input_warnings(traces, roof), _lock=lock)


#: An error about several traces names this many of their paths, then how many more.
NAMED_PATHS = 3


def named(paths: Iterable[object]) -> str:
    """The traces an error is about, for its one line: every path when there are at most
    :data:`NAMED_PATHS`, else their count and the first few (``2,000 traces (a, b, c, ...)``)."""
    ps = [str(p) for p in paths]
    if len(ps) <= NAMED_PATHS:
        return ", ".join(ps)
    return f"{len(ps):,} traces ({', '.join(ps[:NAMED_PATHS])}, ...)"


def input_warnings(traces: Sequence[Trace], roof: Sequence[RooflineInputs]) -> list[str]:
    """The analysis's ``warnings``: each reader's (cut streams, unclosed recordings), then what of a
    trace's meta.json model block the roofline could not use."""
    return [*(w for t in traces for w in t.warnings),
            *(f"{t.path}: {r.warning}" for t, r in zip(traces, roof, strict=True) if r.warning)]


def check_usable(t: Trace) -> None:
    """Raise :class:`BadInput` (one line) when a trace holds no request to analyse."""
    if not t.has("spans") and not t.has("tokens"):
        recorded = ", ".join(t.table_names()) or "none"
        raise BadInput(f"{t.path}: nothing to analyse: the trace has neither a spans nor a tokens table "
                       f"(tables: {recorded})")
    if t.rows("spans") == 0 and t.rows("tokens") == 0:
        raise BadInput(f"{t.path}: no requests to analyse: spans and tokens are empty")


def _num(x: Any) -> float | None:
    if x is None:
        return None
    f = float(x)
    return None if math.isnan(f) or math.isinf(f) else f


def _pcts(row: dict[str, Any] | None) -> dict[str, Any]:
    row = row or {}
    return {"n": row.get("n", 0), "mean": _num(row.get("mean_ms")), "p50": _num(row.get("p50_ms")),
            "p90": _num(row.get("p90_ms")), "p95": _num(row.get("p95_ms")), "p99": _num(row.get("p99_ms")),
            "clock": row.get("clock")}


def _fit(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if not row or row.get("per_1k_kv_ms") is None:
        return None
    return {"base_ms": _num(row["base_ms"]), "per_1k_kv_ms": _num(row["per_1k_kv_ms"]), "r2": _num(row["r2"]),
            "n": row["n"], "basis": row["basis"], "kv_len_min": row["kv_len_min"], "kv_len_max": row["kv_len_max"],
            "per_seq_ms": _num(row.get("per_seq_ms"))}


def _roofline(row: dict[str, Any]) -> dict[str, Any] | None:
    if not row.get("available"):
        return None
    keys = ("ideal_step_ms", "bandwidth_efficiency", "measured_step_ms", "ideal_base_ms", "ideal_per_1k_kv_ms",
            "compute_step_ms", "compute_to_memory", "kv_len_mean", "batch_mean", "weight_bytes",
            "kv_bytes_per_token", "mem_bw_bytes_per_s", "peak_flops", "achieved_bw_bytes_per_s")
    out: dict[str, Any] = {k: _num(row.get(k)) for k in keys}
    out.update({"basis": row.get("basis"), "tokens": row.get("tokens"), "model": row.get("model"),
                "gpu": row.get("gpu"), "gpu_count": row.get("gpu_count"), "source": row.get("source")})
    return out


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (_num(v) if isinstance(v, float) else v) for k, v in row.items()}


__all__ = ["FORMAT", "TABLES", "VERSION", "Analysis", "analyze", "labels_for", "named"]
