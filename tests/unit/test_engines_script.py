"""scripts/engines.py's skip-with-reason path: what the engines tier skips with where an engine is not there.

An engine that could not be installed leaves ``engines/NAME-VERSION.failed`` holding the one-line
reason; the tier's fixtures (tests/engines/conftest.py) skip with ``Engine.why_missing``, which
reads it. ``TRACETOOL_SKIP_ENGINES=1`` installs nothing, and the tier then skips saying how to
install. Everything here runs in a temporary cache directory with stand-in installers: nothing is
downloaded, built or started.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import scripts.engines as engines_script
import tests.engines.conftest as tier
from scripts.engines import LLAMA_SERVER, SKIP_ENV, VLLM, Engine, InstallError, install

Say = Callable[[str], None]


def _engine(installer: Callable[[Path, Say], None]) -> Engine:
    return Engine("fake", "fake-engine-1.0", installer, "bin/fake")


def _fails(reason: str) -> Callable[[Path, Say], None]:
    def installer(home: Path, say: Say) -> None:
        (home / "bin").mkdir()  # half-built: the failure must not leave it looking installed
        raise InstallError(reason)

    return installer


def _works(home: Path, say: Say) -> None:
    (home / "bin").mkdir()
    (home / "bin" / "fake").write_text("#!/bin/sh\n")


def _mark_failed(cache: Path, engine: Engine, reason: str) -> None:
    marker = engine.home(cache).with_name(engine.dirname + ".failed")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(reason + "\n")


def test_a_failed_install_leaves_its_reason_and_why_missing_gives_it(tmp_path: Path) -> None:
    reason = "cmake exited 1: No CMAKE_CXX_COMPILER could be found (log: x.log)"
    engine = _engine(_fails(reason))
    line = install(engine, tmp_path, say=lambda _: None)
    assert line == f"fake-engine-1.0: not installed, its tests will skip: {reason}"
    assert (tmp_path / "engines" / "fake-engine-1.0.failed").read_text() == reason + "\n"
    assert not engine.home(tmp_path).exists(), "the half-built directory is removed"
    assert engine.entry_point(tmp_path) is None
    assert engine.why_missing(tmp_path) == f"fake-engine-1.0 could not be installed: {reason}"


def test_an_unforeseen_error_is_a_reason_too(tmp_path: Path) -> None:
    def boom(home: Path, say: Say) -> None:
        raise RuntimeError("disk full")

    engine = _engine(boom)
    assert install(engine, tmp_path, say=lambda _: None).endswith("its tests will skip: RuntimeError: disk full")
    assert engine.why_missing(tmp_path) == "fake-engine-1.0 could not be installed: RuntimeError: disk full"


def test_a_failed_step_gives_its_last_error_line_as_the_reason(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    code = "print('compiling'); print('fatal error: no compiler found'); print('done'); raise SystemExit(3)"
    with pytest.raises(InstallError) as err:
        engines_script._run([sys.executable, "-c", code], log)
    message = str(err.value)
    assert "exited 3: fatal error: no compiler found" in message and f"(log: {log})" in message
    assert "\n" not in message


def test_the_next_install_tries_again_and_clears_the_reason(tmp_path: Path) -> None:
    _mark_failed(tmp_path, _engine(_works), "pip install exited 1: no network")
    engine = _engine(_works)
    line = install(engine, tmp_path, say=lambda _: None)
    assert line.startswith(f"fake-engine-1.0: installed in {engine.home(tmp_path)}"), line
    assert not (tmp_path / "engines" / "fake-engine-1.0.failed").exists()
    assert engine.entry_point(tmp_path) == engine.home(tmp_path) / "bin" / "fake"
    assert engine.why_missing(tmp_path) is None
    # cached: the installer is not run again
    assert install(_engine(_fails("must not run")), tmp_path, say=lambda _: None) == \
        f"fake-engine-1.0: cached in {engine.home(tmp_path)}"


def test_a_directory_without_its_installed_mark_is_not_installed(tmp_path: Path) -> None:
    engine = _engine(_works)
    home = engine.home(tmp_path)
    home.mkdir(parents=True)
    _works(home, lambda _: None)  # its files are all there, but the try was killed before .installed
    assert engine.entry_point(tmp_path) is None
    assert engine.why_missing(tmp_path) == "fake-engine-1.0 is not installed (python scripts/engines.py install fake)"


@pytest.mark.parametrize("engine", [LLAMA_SERVER, VLLM], ids=lambda e: e.key)
def test_the_tier_skips_with_the_failed_marker_reason(engine: Engine, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    reason = f"{engine.key} step exited 1: no network (log: {tmp_path}/x.log)"
    _mark_failed(tmp_path, engine, reason)
    monkeypatch.setattr(tier, "PERSISTENT_CACHE", tmp_path)
    with pytest.raises(pytest.skip.Exception) as skipped:
        _start_fixture(engine, tmp_path)
    assert str(skipped.value.msg) == f"{engine.dirname} could not be installed: {reason}"


def test_skip_engines_installs_nothing_and_the_tier_skips_saying_how_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRACETOOL_CACHE", str(tmp_path))
    monkeypatch.setenv(SKIP_ENV, "1")

    def no_install(*args: object, **kw: object) -> str:
        raise AssertionError("install ran under TRACETOOL_SKIP_ENGINES=1")

    monkeypatch.setattr(engines_script, "install", no_install)
    assert engines_script.main(["install"]) == 0
    assert capsys.readouterr().out == f"engines: {SKIP_ENV} is set, nothing installed (the engines tier will skip)\n"
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setattr(tier, "PERSISTENT_CACHE", tmp_path)
    with pytest.raises(pytest.skip.Exception) as skipped:
        _start_fixture(LLAMA_SERVER, tmp_path)
    assert str(skipped.value.msg) == (f"{LLAMA_SERVER.dirname} is not installed "
                                      "(python scripts/engines.py install llama-server)")


def test_skip_engines_zero_or_empty_still_installs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRACETOOL_CACHE", str(tmp_path))
    asked: list[str] = []

    def stand_in(engine: Engine, **kw: object) -> str:
        asked.append(engine.key)
        return f"{engine.dirname}: stand-in"

    monkeypatch.setattr(engines_script, "install", stand_in)
    for value in ("0", ""):
        monkeypatch.setenv(SKIP_ENV, value)
        assert engines_script.main(["install", "llama-server"]) == 0
    assert asked == ["llama-server", "llama-server"]
    assert capsys.readouterr().out == f"{LLAMA_SERVER.dirname}: stand-in\n" * 2


def test_status_says_each_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRACETOOL_CACHE", str(tmp_path))
    _mark_failed(tmp_path, VLLM, "pip install exited 1: no matching distribution")
    assert engines_script.main(["status"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{VLLM.dirname} could not be installed: pip install exited 1: no matching distribution",
        f"{LLAMA_SERVER.dirname} is not installed (python scripts/engines.py install llama-server)",
    ]


def _start_fixture(engine: Engine, tmp_path: Path) -> None:
    """Run the tier's session fixture for ``engine`` up to its first step (where it skips or starts).

    Only the function under pytest's fixture wrapper is called: nothing is started when the
    engine is missing, as the fixture skips before it builds a model or a command.
    """
    if engine is VLLM:  # (request, tmp_path_factory): neither is used before the skip
        gen = tier.vllm_server.__wrapped__(None, tmp_path)
    else:  # (tmp_path_factory)
        gen = tier.llama_cpp_server.__wrapped__(tmp_path)
    next(gen)
    gen.close()
    raise AssertionError(f"{engine.key}'s fixture started instead of skipping")
