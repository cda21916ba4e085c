"""Text an attacker controls, and traces that carry it everywhere a trace holds text.

The payloads are the sequences that act on terminals and on the pages CI renders: OSC 0 (window
title, BEL-terminated), OSC 8 (hyperlink, ST-terminated), OSC 52 (clipboard write), DCS, 7-bit
CSI, the 8-bit C1 controls (U+009B CSI, U+009D OSC, U+0090 DCS, U+009C ST, U+0085 NEL), bidi
overrides and isolates, NUL, Textual markup (``[@click=...]`` would be an action), and Markdown
and HTML (an image, a link, an entity that decodes to a bidi override).

:func:`check_output` is the property every output path must keep: nothing unsafe reaches the
terminal raw, and the text is still recognisable (its escaped form is there).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

OSC_TITLE = "\x1b]0;pwned\x07"
OSC_LINK = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"
OSC_CLIPBOARD = "\x1b]52;c;cHduZWQ=\x07"
DCS = "\x1bP+q544e\x1b\\"
CSI = "\x1b[2J\x1b[31m"
C1 = "\x9b31m\x9d0;c1title\x9c\x90dcs\x9c\x85"
BIDI = "\u202eevil\u202c\u2066iso\u2069\u200f"
NUL = "\x00"
MARKUP = "[bold]b[/bold][@click=app.quit]q[/]"
MARKDOWN = "<img src=x onerror=alert(1)>[link](https://evil.example/)`|&#x202e;"

#: One string holding every sequence: what an id, a name or a note is made of in these tests.
PAYLOAD = "".join((MARKUP, OSC_TITLE, OSC_LINK, OSC_CLIPBOARD, DCS, CSI, C1, BIDI, NUL, MARKDOWN))
#: What must still be readable where the payload is shown (the words between the controls).
WORDS = ("pwned", "evil.example", "c1title", "evil", "iso")

#: Any character a terminal may act on, or that cannot be encoded: what must never be written raw
#: (independent of the code under test: C0 but newline, DEL, C1, bidi controls, LS/PS, surrogates).
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                 "\ud800-\udfff]")
#: The SGR/cursor sequences a terminal UI writes itself (stripped from a TUI's output before checking).
OWN_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def check_output(text: str, *, where: str, own_csi: bool = False, shows_payload: bool = True) -> None:
    """No raw control, C1, bidi or surrogate character in ``text`` (but newlines; with ``own_csi``,
    the program's own CSI sequences are allowed), and (``shows_payload``) the payload's escaped
    form is there."""
    body = OWN_CSI.sub("", text) if own_csi else text
    raw = RAW.search(body)
    assert raw is None, \
        f"{where}: raw {raw.group()!r} at {raw.start()}: {body[max(0, raw.start() - 60):raw.start() + 60]!r}"
    assert not shows_payload or "\\x1b]0;pwned" in body or "\\u001b]0;pwned" in body, \
        f"{where}: the escaped payload is not shown"


def poison_meta(meta: dict[str, Any], *, big_note_chars: int = 0) -> dict[str, Any]:
    """``meta`` with the payload in its notes, model and hardware names, and a long note."""
    out = dict(meta)
    notes = [*list(out.get("notes") or []), f"note {PAYLOAD} end", "surrogate \ud800 end"]
    if big_note_chars:
        notes.append("big " + "x" * big_note_chars + " tail-of-the-big-note")
    out["notes"] = notes
    out["model"] = {**(out.get("model") or {}), "name": f"model {PAYLOAD}"}
    out["hardware"] = {**(out.get("hardware") or {}), "gpu": f"gpu {PAYLOAD}"}
    return out


def poison_trace(src: Path, dst: Path, *, big_note_chars: int = 0) -> Path:
    """Copy trace ``src`` to ``dst`` with the payload in every request id (consistently across
    tables, so joins still hold), in the stacks' thread and frame names, in an error message,
    in an extra span's name, and in meta.json (:func:`poison_meta`)."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    ids: dict[str, str] = {}

    def rid(v: str | None) -> str | None:
        if v is None or v == "":
            return v
        return ids.setdefault(v, f"{v}{PAYLOAD}")

    for f in sorted(src.iterdir()):
        if f.name == "meta.json":
            meta = json.loads(f.read_text())
            (dst / "meta.json").write_text(json.dumps(poison_meta(meta, big_note_chars=big_note_chars)))
            continue
        table = _read(f)
        name = f.name.split(".")[0]
        cols = {}
        for c in table.schema.names:
            col = table.column(c)
            if c == "request_id":
                col = pa.array([rid(v) for v in col.to_pylist()], pa.string())
            elif (name, c) in (("stacks", "thread"), ("stacks", "stack"), ("requests", "error")):
                col = pa.array([None if v is None else f"{v}{PAYLOAD}" for v in col.to_pylist()], pa.string())
            cols[c] = col
        table = pa.table(cols)
        if name == "requests" and table.num_rows and "error" not in table.schema.names:
            errors = [f"server said {PAYLOAD}"] + [None] * (table.num_rows - 1)
            table = table.append_column("error", pa.array(errors, pa.string()))
        if name == "spans" and table.num_rows:
            first = table.slice(0, 1).to_pylist()[0]
            extra = dict(first, name=f"otlp:{PAYLOAD}")
            table = pa.concat_tables([table, pa.Table.from_pylist([extra], table.schema)])
        with pa.OSFile(str(dst / f"{name}.arrows"), "wb") as out, ipc.new_stream(out, table.schema) as w:
            w.write_table(table)
    return dst


def _read(path: Path) -> pa.Table:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path)
    with pa.memory_map(str(path)) as m:
        try:
            return ipc.open_file(m).read_all()
        except pa.ArrowInvalid:
            m.seek(0)
            return ipc.open_stream(m).read_all()
