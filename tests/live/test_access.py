"""Who may watch: the shared token (refusals logged and counted), TLS, and what a wrong setup says."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from live_helpers import connect, produce, wait_until

from collectors.recorder import Recorder
from tracetool.errors import BadInput
from tracetool.live.client import CONNECTED, DISCONNECTED, REFUSED, ClientOptions
from tracetool.live.config import LiveConfig
from tracetool.live.protocol import TOKEN_ENV
from tracetool.live.source import LiveSource

FAST = {"backoff_s": 0.1, "backoff_max_s": 0.5}


def test_wrong_token_is_refused_logged_and_counted(live_recorder: Callable[..., Recorder],
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    rec = live_recorder(live=LiveConfig("127.0.0.1:0", token="s3cret"))
    wrong, _ = connect(rec.live.address, ClientOptions(token="guess", **FAST))
    try:
        wait_until(lambda: wrong.state == REFUSED, "the refusal")
        assert wrong.reason == "wrong token"
        assert wrong.status().startswith("refused: wrong token")
    finally:
        wrong.stop()
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "refused a viewer" in ln]
    assert lines and "wrong token" in lines[0] and "127.0.0.1" in lines[0]
    assert "Traceback" not in err
    assert rec.live.refused >= 1 and rec.live.stats()["refused"] == rec.live.refused

    none, _ = connect(rec.live.address, ClientOptions(**FAST))
    right, got = connect(rec.live.address, ClientOptions(token="s3cret", **FAST))
    try:
        wait_until(lambda: none.state == REFUSED and right.state == CONNECTED, "one refused, one admitted")
        assert "no token" in none.reason
        produce(rec, 1, 5)
        got.wait(lambda g: g.rows("tokens") == 5, "tokens for the right token")
    finally:
        none.stop()
        right.stop()


def test_token_from_the_environment(live_recorder: Callable[..., Recorder],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    rec = live_recorder()
    assert rec.live.stats()["token_required"]
    src = LiveSource([rec.live.address], options=ClientOptions(token="nope", **FAST))
    try:
        with pytest.raises(BadInput, match="refused: wrong token"):
            src.wait_first(10)
    finally:
        src.close()


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made here with the openssl CLI."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (needed to make a test certificate)")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "cert.pem"), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


def test_tls_works_and_plain_text_fails_cleanly(live_recorder: Callable[..., Recorder], cert: tuple[Path, Path],
                                                capfd: pytest.CaptureFixture[str]) -> None:
    crt, key = cert
    rec = live_recorder(live=LiveConfig("127.0.0.1:0", tls_cert=crt, tls_key=key))
    assert rec.live.url.startswith("grpc+tls://")
    ok, got = connect(rec.live.address, ClientOptions(tls_root=crt.read_bytes(), **FAST))
    plain, _ = connect(rec.live.address, ClientOptions(**FAST))
    untrusted, _ = connect(rec.live.address, ClientOptions(tls=True, **FAST))
    try:
        produce(rec, 2, 10)
        got.wait(lambda g: g.rows("tokens") == 20, "tokens over TLS")
        wait_until(lambda: plain.state == DISCONNECTED and untrusted.state == DISCONNECTED, "both failures")
        assert "TLS server" in plain.reason
        assert "not trusted" in untrusted.reason
    finally:
        for c in (ok, plain, untrusted):
            c.stop()
    src = LiveSource([rec.live.address], options=ClientOptions(**FAST))
    try:
        with pytest.raises(BadInput, match="TLS"):
            src.wait_first(10)
    finally:
        src.close()
    err = capfd.readouterr().err
    assert "Handshake failed" not in err, "gRPC's INFO lines stay off stderr"


def test_tls_client_to_a_plain_server_fails_cleanly(live_recorder: Callable[..., Recorder],
                                                    cert: tuple[Path, Path]) -> None:
    rec = live_recorder()
    c, _ = connect(rec.live.address, ClientOptions(tls_root=cert[0].read_bytes(), **FAST))
    try:
        wait_until(lambda: c.state == DISCONNECTED, "the failure")
        assert "does not speak TLS" in c.reason
    finally:
        c.stop()


def test_bad_live_settings_are_usage_errors(tmp_path: Path) -> None:
    from tracetool.errors import UsageError

    with pytest.raises(UsageError, match="go together"):
        Recorder(tmp_path / "a", live=LiveConfig("127.0.0.1:0", tls_cert=tmp_path / "c.pem")).start()
    with pytest.raises(UsageError, match="not HOST:PORT"):
        Recorder(tmp_path / "b", live="localhost").start()
    taken = Recorder(tmp_path / "c", live="127.0.0.1:0").start()
    try:
        with pytest.raises(UsageError, match="cannot listen"):
            Recorder(tmp_path / "d", live=f"127.0.0.1:{taken.live.address.port}").start()
    finally:
        taken.close()
