"""Text a server sends (its model name, its error messages, its /metrics labels) is shown escaped.

A hostile OpenAI-compatible server on a loopback port names its model with the payload,
answers every completion with HTTP 500 and the payload as the error message, and exports a
/metrics page whose label values hold it. ``probe`` against it (scraping /metrics), then
``info``, ``analyze`` and ``report`` on what it recorded, must print none of it raw.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.fuzz.fuzzlib import run_cli
from tests.untrusted.evil import PAYLOAD, check_output
from tracetool.reader import open_trace
from tracetool.untrusted import cut_mark

pytestmark = pytest.mark.usefixtures("terminal")

LABEL = PAYLOAD.replace("\\", "").replace('"', "").replace("\x00", "")  # as a label value can hold it


class _Hostile(BaseHTTPRequestHandler):
    #: What every completion is answered with, as the error's message.
    message = f"boom {PAYLOAD}"

    def log_message(self, *args: object) -> None:  # no access log on the test's stderr
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.endswith("/models"):
            self._send(200, json.dumps({"object": "list", "data": [{"id": f"model {PAYLOAD}"}]}).encode())
        elif self.path == "/metrics":
            page = (f'vllm:num_requests_waiting{{model_name="{LABEL}"}} 1\n'
                    f'vllm:num_requests_running{{model_name="{LABEL}"}} 2\n')
            self._send(200, page.encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._send(500, json.dumps({"error": {"message": self.message}}).encode())


class _Verbose(_Hostile):
    """Answers with a 5,000-character error message (its end never to be shown or kept)."""

    message = f"boom {PAYLOAD}" + "y" * 5_000 + " END-OF-MESSAGE"


@pytest.fixture
def hostile() -> Iterator[str]:
    yield from _serve(_Hostile)


@pytest.fixture
def verbose() -> Iterator[str]:
    yield from _serve(_Verbose)


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        t.join(10)


def test_probe_shows_a_servers_words_escaped(hostile: str, tmp_path: Path) -> None:
    out = tmp_path / "client"
    r = run_cli("probe", hostile, "-n", "3", "--concurrency", "1", "--max-tokens", "4", "-o", out,
                "--metrics-url", "auto", "--metrics-interval", "0.05")
    check_output(r.out + r.err, where="probe")
    assert "boom" in r.out + r.err and "failed x3" in r.out + r.err
    for args in (("info", out), ("analyze", out), ("report", out), ("report", out, "--format", "junit")):
        r = run_cli(*args)
        check_output(r.out + r.err, where=" ".join(map(str, args[:1] + args[2:])), shows_payload=False)


def test_a_servers_long_error_is_cut_with_a_mark(verbose: str, tmp_path: Path) -> None:
    """The probe's line and the error the trace keeps are cut, and say so: a reader must not take
    the first 200 characters of a message for all of it."""
    out = tmp_path / "client"
    r = run_cli("probe", verbose, "-n", "2", "--concurrency", "1", "--max-tokens", "4", "-o", out)
    check_output(r.out + r.err, where="probe")
    lines = [ln for ln in (r.out + r.err).splitlines() if "boom" in ln]
    assert lines and all("END-OF-MESSAGE" not in ln and "…[+" in ln for ln in lines), lines
    errors = open_trace(out).table("requests").column("error").to_pylist()
    assert len(errors) == 2 and all(e and "END-OF-MESSAGE" not in e and cut_mark(len(_Verbose.message) - 200) in e
                                    for e in errors), errors
