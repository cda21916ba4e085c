"""Fixtures for the serving tests: a real `tracetool serve` child, fake servers, trace helpers.

Servers listen on free loopback ports; readiness is awaited by reading the
server's own "serving URL" line and polling GET /v1/models, never by sleeping;
every child process is stopped (SIGTERM, then SIGKILL) in teardown.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.waiting import wait_until
from tracetool.reader import Trace
from tracetool.serving.demo import server_process

MODEL = "tracetool-demo-llama"


def wait_ready(base_url: str, timeout_s: float = 60.0) -> None:
    """Poll GET /v1/models until it answers 200."""
    last: list[Exception] = []

    def ready() -> bool:
        try:
            return httpx.get(f"{base_url}/models", timeout=5).status_code == 200
        except httpx.HTTPError as e:
            last[:] = [e]
            return False

    try:
        wait_until(ready, f"{base_url} to answer GET /models", timeout=timeout_s, interval=0.05)
    except AssertionError as e:
        raise TimeoutError(f"{e} (last error: {last[0] if last else None})") from None


@dataclass
class Server:
    url: str  # base URL ending in /v1
    proc: Any
    trace: Path

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real `tracetool serve` (demo model, 4 batch slots) shared by the serving tests."""
    trace = tmp_path_factory.mktemp("server") / "trace"
    with server_process(trace, "--threads", "1", "--max-batch", "4") as (url, proc):
        wait_ready(url)
        yield Server(url, proc, trace)


def span_durations(trace: Trace) -> dict[str, dict[str, int]]:
    """request id -> span name -> summed duration (ns)."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    t = trace.table("spans")
    for rid, name, s, e in zip(t.column("request_id").to_pylist(), t.column("name").to_pylist(),
                               t.column("start_ns").to_pylist(), t.column("end_ns").to_pylist(), strict=True):
        out[rid][name] += e - s
    return out


def network_ms(trace: Trace) -> dict[str, float]:
    """Per request with both spans: client.request − server.request, in ms (the attribution rule)."""
    return {rid: (d["client.request"] - d["server.request"]) / 1e6 for rid, d in span_durations(trace).items()
            if "client.request" in d and "server.request" in d}


@pytest.fixture(scope="session")
def word_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local Hugging Face tokenizer (a directory with tokenizer.json): one token per word of the
    probe's vocabulary, trained here with the tokenizers library (nothing downloaded). Exact counts
    are then easy to compute by hand: the number of words."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from tracetool.serving.workloads import WORDS

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)] * 2, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    d = tmp_path_factory.mktemp("tokenizer")
    tok.save(str(d / "tokenizer.json"))
    return d
