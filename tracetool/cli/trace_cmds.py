"""``validate``, ``info`` and ``convert``: commands on trace files themselves."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import click
import pyarrow as pa

from tracetool.cli.common import emit_json, fmt_int, json_option, warn
from tracetool.errors import EXIT_BAD_INPUT, BadInput, UsageError
from tracetool.glyphs import NOT_MEASURED
from tracetool.meta import model_block, write_meta
from tracetool.reader import open_trace
from tracetool.schema import TABLES
from tracetool.summary import summarize
from tracetool.untrusted import NAME_LIMIT, echo, shown
from tracetool.writer.output import check_output, prepare_output

#: Names listed on one line of ``info`` (span names, tables) before the rest are only counted.
LISTED = 40


@click.command()
@click.argument("trace", type=click.Path(path_type=Path))
@json_option
def validate(trace: Path, as_json: bool) -> int:
    """Check TRACE against the trace format v1 and say what was checked.

    Checks meta.json (format, version, model/hardware fields), every table file
    (readable Arrow IPC stream/file or Parquet, complete), required columns,
    column types (any integer width, dictionary/large strings accepted),
    nulls in required columns, end_ns >= start_ns, and known clocks.
    Exit 0 when valid, 3 with one line naming file, table and column when not.
    """
    t = open_trace(trace, strict=True)
    model = t.meta.get("model")
    unused = model_block(model)[1] if isinstance(model, dict) else None
    warnings = [*t.warnings, *([f"{t.path}: {unused}"] if unused else [])]  # as analyze says them
    checks = []
    for name, table in t.tables.items():
        spec = TABLES.get(name)
        if spec is None:
            what = "unknown table, kept as is"
        else:
            parts = [f"required {'/'.join(c.name for c in spec.required)}", "types"]
            parts += [f"{e} >= {s}" for s, e in spec.intervals]
            if name in ("spans", "server_metrics"):
                parts.append("clocks")
            if name == "tokens":
                parts.append("index >= 0")
            extra = [c for c in table.schema.names if spec.column(c) is None]
            if extra:
                parts.append(f"extra columns kept: {_listed(shown(c, NAME_LIMIT) for c in extra)}")
            what = ", ".join(parts)
        checks.append({"table": name, "files": [p.name for p in t.files[name]], "rows": table.num_rows,
                       "checked": what})
    missing = [n for n in TABLES if n not in t.tables]
    if as_json:
        emit_json({"valid": True, "path": str(t.path), "version": t.meta["version"],
                   "closed": t.meta.get("closed"), "tables": checks, "not_recorded": missing,
                   "warnings": warnings})
    else:
        echo(f"ok  meta.json   format tracetool, version {t.meta['version']}"
                   f"{'' if t.meta.get('closed', True) else ', recording not closed'}")
        for c in checks:
            nfiles = len(c["files"])
            echo(f"ok  {shown(c['table'], NAME_LIMIT):<13} {nfiles} file{'s' if nfiles != 1 else ''}, "
                       f"{fmt_int(c['rows'])} rows: {c['checked']}")
        for name in missing:
            echo(f"--  {name:<13} not recorded")
        total = sum(c["rows"] for c in checks)
        echo(f"valid: {t.path} ({len(checks)} tables, {fmt_int(total)} rows)")
    for w in warnings:
        warn(w)
    return 0


@click.command()
@click.argument("trace", type=click.Path(path_type=Path))
@json_option
def info(trace: Path, as_json: bool) -> int:
    """Summarise TRACE: requests, tokens, time span, tables, model and hardware."""
    t = open_trace(trace)
    s = summarize(t)
    if as_json:
        emit_json(s)
    else:
        span = s["server_time_span_s"]
        rows = [
            ("trace", shown(s["path"]) + ("" if s["closed"] is not False else "  (recording not closed)")),
            ("requests", f"{fmt_int(s['requests'])} ({fmt_int(s['requests_with_tokens'])} with tokens)"),
            ("tokens", fmt_int(s["tokens"])),
            ("time span", NOT_MEASURED if span is None else f"{span:.3f} s ({s['time_span_clock']} clock)"),
            ("clocks", ", ".join(s["clocks"]) or NOT_MEASURED),
            ("spans", _listed(f"{shown(k, NAME_LIMIT)} {v:,}" for k, v in sorted(s["span_names"].items()))),
            ("tables", _listed(f"{shown(k, NAME_LIMIT)} ({v['rows']:,})" for k, v in s["tables"].items())),
            ("model", _kv(s["model"])),
            ("hardware", _kv(s["hardware"])),
        ]
        if s["dropped_rows"]:
            rows.append(("dropped", _listed(f"{shown(k, NAME_LIMIT)} {v:,}" for k, v in s["dropped_rows"].items())))
        rows += [("note", shown(n)) for n in s["notes"]]
        for k, v in rows:
            echo(f"{k:<10} {v}")
    for w in t.warnings:
        warn(w)
    return 0


def _kv(d: dict | None) -> str:
    if not d:
        return NOT_MEASURED
    return _listed(f"{shown(k, NAME_LIMIT)}={shown(v, NAME_LIMIT)}" for k, v in d.items())


def _listed(items: Iterable[str]) -> str:
    """Items joined on one line, the first :data:`LISTED` of them, then how many more."""
    items = list(items)
    if not items:
        return NOT_MEASURED
    more = len(items) - LISTED
    return ", ".join(items[:LISTED]) + (f", … and {more:,} more" if more > 0 else "")


@click.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--to", "fmt", type=click.Choice(["parquet", "arrow", "arrows"]), default="parquet",
              show_default=True, help="File kind to write: Parquet, Arrow IPC file or Arrow IPC stream.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Output trace directory (must not exist, or be empty).")
@click.option("--force", is_flag=True, help="Replace table files in a non-empty output directory.")
@click.option("--dataset", "as_dataset", is_flag=True,
              help="TRACE is a dataset (a tree of traces): write it as partitioned Parquet under OUT, each trace "
                   "in its key=value folders, rows sorted, zstd, row groups sized for scans (docs/fleet.md).")
def convert(trace: Path, fmt: str, output: Path, force: bool, as_dataset: bool) -> int:
    """Rewrite TRACE with one file per table (segments compacted) in another file kind.

    Also recovers an interrupted recording: complete batches of a cut stream
    are kept, the cut tail is dropped (and said on stderr). With --dataset,
    TRACE may be a directory tree of traces; unreadable traces are named on
    stderr and the command exits 3 after converting the others.
    """
    if as_dataset:
        return _convert_dataset(trace, fmt, output, force)
    t = open_trace(trace)
    check_output(output, force)
    if output.resolve() == t.path.resolve():
        raise UsageError("output must be a different directory from the input")
    try:
        prepare_output(output, force=True)  # checked before the input was read
        for name, table in t.tables.items():
            _write_table(table.combine_chunks(), output / f"{name}.{fmt}", fmt)
        meta = dict(t.meta)
        meta["notes"] = [*list(meta.get("notes") or []), f"converted to {fmt} from {t.path}"]
        meta.setdefault("closed", True)
        write_meta(output, meta)
        for extra in ("README.md",):
            if (t.path / extra).is_file():
                shutil.copy(t.path / extra, output / extra)
    except OSError as e:
        raise BadInput(f"{output}: cannot write ({e.strerror or e})") from e
    for w in t.warnings:
        warn(w)
    echo(f"wrote {output} ({len(t.tables)} tables, {fmt})")
    return 0


def _convert_dataset(trace: Path, fmt: str, output: Path, force: bool) -> int:
    from tracetool.dataset_write import write_dataset

    if fmt != "parquet":
        raise UsageError("--dataset writes Parquet only (leave --to out or say --to parquet)")
    done = write_dataset([trace], output, force=force)
    for m, why in done.bad:
        warn(f"{m.path}: not converted: {why}")
    echo(f"wrote {output} ({len(done.written)} traces, {fmt_int(done.rows)} rows, parquet zstd)")
    return EXIT_BAD_INPUT if done.bad else 0


def _write_table(table: pa.Table, path: Path, fmt: str) -> None:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif fmt == "arrow":
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    else:
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            w.write_table(table)
