"""py-spy sampler: category rules, chrometrace reconstruction, and real py-spy on real processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from collectors import Recorder
from collectors.pyspy import PySpyError, PySpySampler, short_path, stack_rows, stretches
from collectors.pyspy_rules import load_rules
from collectors.system import start_system_collectors
from tests.waiting import wait_until
from tracetool import notices
from tracetool.errors import BadInput, UsageError
from tracetool.reader import open_trace

SP = "/usr/lib/python3.11/site-packages/"
LIB = "/usr/lib/python3.11/"


@pytest.fixture(autouse=True)
def _fresh_notices() -> None:
    notices.reset()


# -- rules ---------------------------------------------------------------------------------

def classify(*frames_root_first: tuple[str, str], extra: tuple[Path, ...] = ()) -> str:
    return load_rules(extra).classify(list(frames_root_first)[::-1])


@pytest.mark.parametrize(("frames", "category"), [
    # a regex inside a pure-Python tokenizer is the tokenizer's time
    ([("main", "/srv/app.py"), ("tokenize_prompt", "/srv/app.py"), ("findall", LIB + "re/__init__.py")],
     "tokenize"),
    ([("handle", "/srv/app.py"), ("PreTrainedTokenizerBase.__call__", SP + "transformers/tokenization_utils_base.py"),
      ("_encode_plus", SP + "transformers/tokenization_utils_fast.py")], "tokenize"),
    ([("handle", "/srv/app.py"), ("Encoding.encode_ordinary", SP + "tiktoken/core.py")], "tokenize"),
    # decode lives in tokenizer modules but is detokenize
    ([("stream", "/srv/app.py"), ("PreTrainedTokenizerBase.decode", SP + "transformers/tokenization_utils_base.py")],
     "detokenize"),
    ([("generate", "/srv/app.py"), ("Module._call_impl", SP + "torch/nn/modules/module.py"),
      ("LlamaAttention.forward", SP + "transformers/models/llama/modeling_llama.py")], "model-forward"),
    # json inside a forward: the innermost claimed frame wins
    ([("generate", "/srv/app.py"), ("MyModel.forward", "/srv/model.py"), ("dumps", LIB + "json/__init__.py")],
     "serialization"),
    ([("generate", "/srv/app.py"), ("GenerationMixin._sample", SP + "transformers/generation/utils.py")], "sampling"),
    ([("generate", "/srv/app.py"), ("TopPLogitsWarper.__call__", SP + "transformers/generation/logits_process.py")],
     "sampling"),
    ([("run", LIB + "asyncio/runners.py"), ("BaseEventLoop._run_once", LIB + "asyncio/base_events.py"),
      ("EpollSelector.select", LIB + "selectors.py")], "idle"),
    ([("Thread._bootstrap", LIB + "threading.py"), ("worker", "/srv/app.py"), ("Queue.get", LIB + "queue.py"),
      ("Condition.wait", LIB + "threading.py")], "idle"),
    ([("Handle._run", LIB + "asyncio/events.py"), ("H11Protocol.data_received",
                                                    SP + "uvicorn/protocols/http/h11_impl.py"),
      ("Connection.next_event", SP + "h11/_connection.py")], "network-io"),
    # application code under uvicorn's run_asgi is not network-io: the boundary stops the walk
    ([("RequestResponseCycle.run_asgi", SP + "uvicorn/protocols/http/h11_impl.py"),
      ("handler", "/srv/app.py"), ("compute", "/srv/app.py")], "other"),
    ([("Thread._bootstrap", LIB + "threading.py"), ("Thread.run", LIB + "threading.py"),
      ("sleeper", "/srv/app.py")], "other"),
    # wait() in threading.py is only idle as the innermost frame
    ([("Condition.wait", LIB + "threading.py"), ("callback", "/srv/app.py")], "other"),
    # a script whose path matches a rule does not claim what runs under its module body
    ([("<module>", "/srv/slow_tokenizer.py"), ("_find_and_load", "<frozen importlib._bootstrap>"),
      ("<module>", SP + "transformers/models/__init__.py")], "other"),
    ([("<module>", "/srv/slow_tokenizer.py"), ("compute", "/srv/app.py")], "other"),
    ([("<module>", "/srv/slow_tokenizer.py"), ("Tokenizer.encode", SP + "tokenizers/__init__.py")], "tokenize"),
])
def test_default_rules(frames: list[tuple[str, str]], category: str) -> None:
    assert classify(*frames) == category


def test_user_rules_come_first_and_extend(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(textwrap.dedent("""
        [[rule]]
        category = "tokenize"
        modules = ["myapp/text/"]

        [[rule]]
        category = "network-io"
        modules = ["json/"]
        functions = ["dumps"]

        [[boundary]]
        functions = ["Engine.step"]
    """))
    assert classify(("handle", "/srv/app.py"), ("split", "/srv/myapp/text/words.py")) == "other"
    assert classify(("handle", "/srv/app.py"), ("split", "/srv/myapp/text/words.py"), extra=(mine,)) == "tokenize"
    assert classify(("h", "/a.py"), ("dumps", LIB + "json/__init__.py"), extra=(mine,)) == "network-io"
    assert classify(("h", "/a.py"), ("loads", LIB + "json/__init__.py"), extra=(mine,)) == "serialization"
    inner = (("Engine.step", "/srv/engine.py"), ("helper", "/srv/engine.py"))
    assert classify(("tokenize_all", "/srv/app.py"), *inner) == "tokenize"
    assert classify(("tokenize_all", "/srv/app.py"), *inner, extra=(mine,)) == "other"


@pytest.mark.parametrize(("body", "message"), [
    ("[[rule]\ncategory = 'x'", "not valid TOML"),
    ("[[rule]]\ncategory = 'gpu'\nmodules = ['a/']", "category must be one of"),
    ("[[rule]]\ncategory = 'idle'", "needs modules, functions or both"),
    ("[[rule]]\ncategory = 'idle'\nmodule = ['a/']", "unknown key(s) ['module']"),
    ("[[rule]]\ncategory = 'idle'\nmodules = 'a/'", "modules must be a list"),
    ("[[rule]]\ncategory = 'idle'\nmodules = ['a/']\nleaf = 'yes'", "leaf must be true or false"),
    ("rules = []", "unknown top-level key"),
])
def test_bad_rules_files_are_bad_input_naming_the_file(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(BadInput) as err:
        load_rules([f])
    assert str(f) in str(err.value) and message in str(err.value) and "\n" not in str(err.value)


def test_missing_rules_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="cannot read py-spy rules"):
        load_rules([tmp_path / "nope.toml"])


# -- chrometrace -> stacks -------------------------------------------------------------------

def ev(ph: str, ts: int, name: str, filename: str = "", tid: int = 7) -> dict[str, Any]:
    return {"ph": ph, "ts": ts, "name": name, "tid": tid, "pid": 1, "cat": "py-spy",
            "args": {"filename": filename, "line": None}}


def test_stretches_rebuild_stacks_between_change_points() -> None:
    events = [  # py-spy 0.4.3 --threads: a pseudo root frame names the thread
        ev("B", 1000, "thread (4242): MainThread"), ev("B", 1000, "<module>", "/srv/app.py"),
        ev("B", 1000, "tokenize_bpe", "/srv/bpe_tokenizer.py"),
        ev("E", 31000, "tokenize_bpe", "/srv/bpe_tokenizer.py"),
        ev("B", 31000, "sample_next", "/srv/app.py"),
        ev("E", 41000, "sample_next", "/srv/app.py"), ev("E", 41000, "<module>", "/srv/app.py"),
        ev("E", 41000, "thread (4242): MainThread"),
    ]
    parts = stretches(events)
    assert [(p.thread, p.start_us, p.end_us, [f for f, _ in p.frames]) for p in parts] == [
        ("MainThread (4242)", 1000, 31000, ["<module>", "tokenize_bpe"]),
        ("MainThread (4242)", 31000, 41000, ["<module>", "sample_next"]),
    ]


def test_thread_names_from_metadata_events() -> None:
    events = [{"ph": "M", "name": "thread_name", "tid": 0, "args": {"name": "99: worker"}},
              ev("B", 0, "run", "/a.py", tid=0), ev("E", 500, "run", "/a.py", tid=0)]
    assert stretches(events)[0].thread == "worker (99)"


def test_an_unnamed_thread_with_the_process_id_is_the_main_thread() -> None:
    events = [ev("B", 0, "thread (42)"), ev("B", 0, "f", "/a.py"), ev("E", 9, "f", "/a.py"), ev("E", 9, "thread (42)")]
    assert stretches(events, pid=42)[0].thread == "MainThread (42)"
    assert stretches(events, pid=7)[0].thread == "thread 42"


def test_stack_rows_bins_weights_anchor_and_categories() -> None:
    events = [
        ev("B", 0, "thread (1): MainThread"), ev("B", 0, "main", "/srv/app.py"),
        ev("B", 0, "tokenize_bpe", "/srv/bpe_tokenizer.py"),
        ev("E", 250_000, "tokenize_bpe", "/srv/bpe_tokenizer.py"),         # 250 ms of tokenizing
        ev("B", 250_000, "Module._call_impl", SP + "torch/nn/modules/module.py"),
        ev("E", 255_000, "Module._call_impl", SP + "torch/nn/modules/module.py"),  # one 5 ms sample
        ev("E", 255_000, "main", "/srv/app.py"), ev("E", 255_000, "thread (1): MainThread"),
    ]
    cols = stack_rows(stretches(events), anchor_ns=10**18, rate_hz=100, samples=26, rules=load_rules())
    got = list(zip(cols["ts_ns"], cols["category"], cols["weight"], strict=True))
    assert got == [(10**18, "tokenize", 10), (10**18 + 100_000_000, "tokenize", 10),
                   (10**18 + 200_000_000, "tokenize", 5), (10**18 + 250_000_000, "model-forward", 1)]
    assert sum(cols["weight"]) == 26                        # py-spy's own count, within rounding
    assert cols["stack"][0] == "main (/srv/app.py);tokenize_bpe (/srv/bpe_tokenizer.py)"
    assert cols["stack"][-1] == "main (/srv/app.py);Module._call_impl (torch/nn/modules/module.py)"
    assert set(cols["thread"]) == {"MainThread (1)"}


def test_short_path() -> None:
    assert short_path(SP + "torch/nn/modules/module.py") == "torch/nn/modules/module.py"
    assert short_path("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py") == "threading.py"
    assert short_path("/srv/app.py") == "/srv/app.py"


# -- real py-spy -----------------------------------------------------------------------------

TOKENIZER = '''
"""A deliberately slow pure-Python BPE tokenizer (the pathological case of docs/domain.md §3)."""
import re

PRETOKEN = re.compile(r"\\w+|[^\\w\\s]+|\\s+")
MERGES = {pair: i for i, pair in enumerate([("t", "h"), ("th", "e"), ("i", "n"), ("in", "g"), ("e", "r"),
                                             ("o", "n"), ("a", "n"), ("an", "d"), ("r", "e"), ("e", "s")])}


def tokenize_bpe(text):
    ids = []
    for word in PRETOKEN.findall(text):
        parts = list(word)
        while len(parts) > 1:
            ranked = [(MERGES.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            rank, i = min(ranked)
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        ids.extend(hash(p) & 0xFFFF for p in parts)
    return ids
'''

SERVER = '''
import sys, time
from bpe_tokenizer import tokenize_bpe

TEXT = "the quick brown fox jumps over the lazy dog and keeps running; " * 40
run_s = float(sys.argv[1])
print("ready", time.time_ns(), flush=True)
t0 = time.monotonic()
n = 0
while time.monotonic() - t0 < run_s:
    tokenize_bpe(TEXT)
    n += 1
    if n % 10 == 0:
        print("progress", n, time.time_ns(), flush=True)
print("done", time.time_ns(), n, flush=True)
'''


def read_until(proc: subprocess.Popen[str], word: str, count: int = 1) -> list[str]:
    """Read the server's lines until ``word`` was seen ``count`` times; returns that last line."""
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        if line.startswith(word):
            seen += 1
            if seen >= count:
                return line.split()
    raise AssertionError(f"server ended before {count} x {word!r}")


@pytest.fixture
def tokenizer_server(tmp_path: Path):
    """Start the toy tokenizer server; yields (process, wall ns when it started working)."""
    (tmp_path / "bpe_tokenizer.py").write_text(TOKENIZER)
    (tmp_path / "server.py").write_text(SERVER)
    procs: list[subprocess.Popen[str]] = []

    def start(run_s: float) -> tuple[subprocess.Popen[str], int]:
        p = subprocess.Popen([sys.executable, str(tmp_path / "server.py"), str(run_s)], cwd=tmp_path,
                             stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
        procs.append(p)
        line = read_until(p, "ready")                 # wait for it to be working: no sleep
        return p, int(line[1])

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def busy_share(trace: Any, category: str) -> float:
    t = trace.table("stacks").to_pylist()
    busy = [r for r in t if r["category"] != "idle"]
    return sum(r["weight"] for r in busy if r["category"] == category) / max(1, sum(r["weight"] for r in busy))


@pytest.mark.slow
def test_real_pyspy_classifies_a_pure_python_tokenizer(tmp_path: Path, tokenizer_server: Any,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    proc, ready_ns = tokenizer_server(2.5)
    rec = Recorder(tmp_path / "t").start()
    sampler = PySpySampler(rec, proc.pid, hz=100, segment_s=0.5).start()
    done_ns = int(read_until(proc, "done")[1])
    assert sampler.wait(timeout=60)                       # ends by itself when the server exits
    rec.close()
    trace = open_trace(tmp_path / "t", strict=True)
    stacks = trace.table("stacks").to_pylist()
    assert busy_share(trace, "tokenize") >= 0.8, {r["category"] for r in stacks}
    assert sampler.segments >= 2                           # py-spy was restarted between segments
    total = sum(r["weight"] for r in stacks)
    span_s = (done_ns - min(r["ts_ns"] for r in stacks)) / 1e9
    assert 0.5 * span_s * 100 <= total <= 1.5 * span_s * 100    # ~100 Hz on one thread, gaps aside
    ts = [r["ts_ns"] for r in stacks]
    assert ready_ns - 100_000_000 <= min(ts) and max(ts) <= done_ns + 100_000_000   # server clock
    assert {r["thread"] for r in stacks} == {f"MainThread ({proc.pid})"}
    assert any("bpe_tokenizer.py" in r["stack"] and "tokenize_bpe" in r["stack"] for r in stacks)
    assert any(f"process {proc.pid} exited" in n for n in trace.meta["notes"])
    assert sampler.pyspy_cpu_ns > 0


@pytest.mark.slow
def test_stop_while_running_writes_the_samples(tmp_path: Path, tokenizer_server: Any) -> None:
    proc, _ = tokenizer_server(30)
    rec = Recorder(tmp_path / "t").start()
    handle = start_system_collectors(rec, pyspy_hz=50, pid=proc.pid)
    assert handle.pyspy is not None
    # py-spy attaching can take seconds on a loaded machine: count the server's work from then on
    pyspy = handle.pyspy
    wait_until(lambda: pyspy.sampling, "py-spy to start sampling", interval=0.05)
    sampling_ns = time.time_ns()
    seen = 0
    while seen < 10:                                       # the server did 100 tokenize calls since
        line = read_until(proc, "progress")
        seen += int(line[2]) > sampling_ns
    rec.close()                                            # on_close stops py-spy and writes
    assert handle.pyspy.finished.is_set() and proc.poll() is None
    trace = open_trace(tmp_path / "t", strict=True)
    assert trace.rows("stacks") > 0 and busy_share(trace, "tokenize") >= 0.8
    assert not any("exited" in n for n in trace.meta["notes"])


def test_a_gone_pid_is_one_clear_error(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    rec = Recorder(tmp_path / "t").start()
    with pytest.raises(PySpyError) as err:
        start_system_collectors(rec, pyspy_hz=100, pid=p.pid)
    rec.close()
    assert str(err.value) == f"py-spy: process {p.pid} is gone (no such process)"
    assert err.value.exit_code == 3


def test_a_non_python_process_is_one_clear_error(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        rec = Recorder(tmp_path / "t").start()
        with pytest.raises(PySpyError, match="is not a Python process"):
            PySpySampler(rec, sleeper.pid, attach_grace_s=0).start()
        rec.close()
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to run py-spy as an unprivileged user")
def test_no_ptrace_permission_is_one_clear_error(tmp_path: Path, tokenizer_server: Any) -> None:
    proc, _ = tokenizer_server(30)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    rec = Recorder(tmp_path / "t").start()
    binary = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    with pytest.raises(PySpyError) as err:
        PySpySampler(rec, proc.pid, pyspy_cmd=[*nobody, binary]).start()
    rec.close()
    msg = str(err.value)
    assert "permission denied (ptrace)" in msg and "SYS_PTRACE" in msg and "\n" not in msg


@pytest.mark.parametrize("hz", [0, 0.5, 501, "x"])
def test_pyspy_rates_out_of_range_are_usage_errors(tmp_path: Path, hz: Any) -> None:
    rec = Recorder(tmp_path / "t").start()
    with pytest.raises(UsageError, match="--pyspy"):
        start_system_collectors(rec, pyspy_hz=hz, pid=os.getpid())
    rec.close()


def test_missing_pyspy_binary_is_one_clear_error(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "t").start()
    sampler = PySpySampler(rec, os.getpid(), pyspy_cmd=[str(tmp_path / "no-such-py-spy")])
    with pytest.raises(PySpyError, match="cannot run py-spy"):
        sampler.start()
    rec.close()


def test_record_flag_entry_points(tmp_path: Path) -> None:
    """``start_pyspy(recorder, hz, pid)`` / ``start_nvml``: the SAMPLERS signature of ``tracetool record``."""
    from collectors.system import start_nvml, start_pyspy

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    rec = Recorder(tmp_path / "t").start()
    with pytest.raises(PySpyError, match="is gone"):
        start_pyspy(rec, 100.0, gone.pid)
    bad = tmp_path / "bad.toml"
    bad.write_text("[[rule]]\ncategory = 'gpu'\nmodules = ['x/']")
    with pytest.raises(BadInput, match=r"bad\.toml"):
        start_system_collectors(rec, pyspy_hz=100, pid=os.getpid(), pyspy_rules=[bad])
    handle = start_nvml(rec, 10.0, 1234)
    assert handle.nvml is not None and handle.pyspy is None
    rec.close()
    assert handle.nvml is not None and not handle.nvml.running
