"""What ``tracetool probe`` sends: prompts from a dataset, a replayed trace, or synthetic lengths.

Every source gives a list of :class:`Job`: one conversation of one or more
turns, optionally with the time its first turn is due (a replay). The formats,
each with a tiny example, are in docs/workloads.md:

* ``--dataset FILE``: ShareGPT JSON (a list of ``{"conversations": [{"from",
  "value"}, ...]}``), JSONL (``{"prompt": ...}`` or ``{"messages": [...]}`` per
  line, optional ``max_tokens``), or plain text, one prompt per line;
* ``--replay FILE``: JSONL with a ``timestamp`` in milliseconds per line, either
  vLLM's timed trace (``{"timestamp", "queries": [{"prompt_length",
  "response_length"}, ...]}``, each query a turn) or Mooncake's
  (``{"timestamp", "input_length", "output_length", "hash_ids"}``: requests
  that share a hash id share that block of their prompt, as prefix caches see);
* synthetic: ``--input-len N[:STD]`` / ``--output-len N[:STD]`` tokens, exact
  with ``--tokenizer``, else approximate (one common word per token) and
  labelled so; ``--prefix-len N`` puts one shared N-token prefix before every
  prompt; ``--turns K`` makes each a conversation of K turns carrying history.

A file that cannot be read, or a line that breaks its format, is bad input with
one line naming the file and the line; nothing is sent.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracetool.errors import BadInput, UsageError
from tracetool.serving.tokens import APPROXIMATE, Tokenizer

WORDS = tuple(["time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
               "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week",
               "company", "system", "program", "question", "work", "government", "number", "night", "point", "home",
               "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book",
               "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend",
               "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city", "community", "name",
               "president", "team", "minute", "idea", "kid", "body", "information", "back", "parent", "face", "others",
               "level", "office", "door", "health", "person", "art", "war", "history", "party", "result", "change",
               "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force", "education",
               "river", "light", "music", "market", "paper", "garden", "window", "table", "stone", "bridge", "signal",
               "summer", "winter", "letter", "picture", "village", "engine", "answer"])

#: Tokens per Mooncake hash block (the trace's block size).
MOONCAKE_BLOCK = 512


@dataclass
class Turn:
    """One request of a conversation: a user message (``text``), or a whole chat as the dataset
    gave it (``messages``, sent as is); ``max_tokens`` None means ``--max-tokens``."""

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    #: where it came from, for messages: "FILE:LINE" or "synthetic"
    source: str = "synthetic"


@dataclass
class Job:
    """A conversation: its turns go one after another, each carrying the history before it."""

    turns: list[Turn]
    #: seconds after the start at which the first turn is due (a replay); None = by the schedule
    at: float | None = None


@dataclass
class WorkloadSpec:
    """The options that pick and shape a workload (``tracetool probe --help``)."""

    n: int | None = None
    prompt_tokens: int = 64
    prompt_file: Path | None = None
    dataset: Path | None = None
    replay: Path | None = None
    time_scale: float = 1.0
    input_len: tuple[int, float] | None = None
    output_len: tuple[int, float] | None = None
    prefix_len: int = 0
    turns: int = 1
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def parse_len(text: str, option: str) -> tuple[int, float]:
    """``N`` or ``N:STD`` -> (mean, std) in tokens; a usage error otherwise."""
    mean, _, std = str(text).partition(":")
    try:
        m, s = int(mean), float(std) if std else 0.0
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected N or N:STD (tokens)") from None
    if m < 1 or s < 0:
        raise UsageError(f"{option} {text!r}: N must be >= 1 and STD >= 0")
    return m, s


def length_basis(tok: Tokenizer | None) -> str:
    return tok.label if tok is not None else APPROXIMATE


def build_jobs(spec: WorkloadSpec, tok: Tokenizer | None) -> list[Job]:
    """The jobs of a run, in order. Reads and checks every file before anything is sent."""
    rng = random.Random(spec.seed)
    if spec.replay is not None:
        jobs = read_replay(spec.replay, rng, tok)
        if spec.n is not None:
            jobs = jobs[:spec.n]
        for j in jobs:
            j.at = (j.at or 0.0) * spec.time_scale
    elif spec.dataset is not None or spec.prompt_file is not None:
        path = spec.dataset if spec.dataset is not None else spec.prompt_file
        assert path is not None
        found = read_dataset(path) if spec.dataset is not None else read_text(path)
        n = spec.n if spec.n is not None else len(found)
        jobs = [Job([_copy(t) for t in found[i % len(found)].turns]) for i in range(n)]
    else:
        n = spec.n if spec.n is not None else 16
        jobs = [Job([Turn(text=synthetic_text(_draw(spec.input_len, spec.prompt_tokens, rng), rng, tok))])
                for _ in range(n)]
    if spec.output_len is not None:
        for j in jobs:
            for t in j.turns:
                t.max_tokens = _draw(spec.output_len, 1, rng)
    if spec.prefix_len:
        prefix = synthetic_text(spec.prefix_len, random.Random(spec.seed + 7), tok)
        for j in jobs:
            t0 = j.turns[0]
            if t0.text is not None:
                t0.text = prefix + " " + t0.text
    if spec.turns > 1:
        for j in jobs:
            while len(j.turns) < spec.turns:
                n_words = _draw(spec.input_len, spec.prompt_tokens, rng)
                j.turns.append(Turn(text=synthetic_text(n_words, rng, tok),
                                    max_tokens=j.turns[-1].max_tokens))
            del j.turns[spec.turns:]
    elif spec.replay is None:
        for j in jobs:
            del j.turns[1:]
    return jobs


def prompt_text(t: Turn) -> str:
    """The text of a turn: its user text, or its messages' contents one per line."""
    if t.text is not None:
        return t.text
    return "\n".join(str(m.get("content") or "") for m in t.messages or [])


def _copy(t: Turn) -> Turn:
    return Turn(t.text, t.messages, t.max_tokens, t.source)


def _draw(spec: tuple[int, float] | None, default: int, rng: random.Random) -> int:
    if spec is None:
        return default
    mean, std = spec
    return max(1, round(rng.gauss(mean, std))) if std else mean


def synthetic_text(n_tokens: int, rng: random.Random, tok: Tokenizer | None) -> str:
    """Seeded common words: ``n_tokens`` tokens by ``tok``, else ``n_tokens`` words (about one token
    each, with its leading space, in BPE tokenizers: approximate)."""
    words = " ".join(rng.choice(WORDS) for _ in range(max(1, n_tokens)))
    if tok is None:
        return words
    ids = tok.encode(words)
    while len(ids) < n_tokens:  # a tokenizer that merges words: add more until there are enough
        words += " " + " ".join(rng.choice(WORDS) for _ in range(n_tokens))
        ids = tok.encode(words)
    return tok.decode(ids[:n_tokens])


# -- datasets ---------------------------------------------------------------------------------
def read_text(path: Path) -> list[Job]:
    """Plain text, one prompt per line (blank lines skipped)."""
    lines = _read(path).splitlines()
    jobs = [Job([Turn(text=ln.strip(), source=f"{path}:{i}")]) for i, ln in enumerate(lines, 1) if ln.strip()]
    if not jobs:
        raise BadInput(f"{path}: no prompts (one per line)")
    return jobs


def read_dataset(path: Path) -> list[Job]:
    """ShareGPT JSON, JSONL (prompt or messages) or plain text, told apart by the content."""
    text = _read(path)
    head = text.lstrip()[:1]
    if head == "[":
        return _sharegpt(path, text)
    if head == "{":
        return _jsonl(path, text)
    return read_text(path)


def _sharegpt(path: Path, text: str) -> list[Job]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise BadInput(f"{path}:1: JSON nested too deeply") from None
    jobs = []
    for i, item in enumerate(data):
        conv = item.get("conversations") if isinstance(item, dict) else None
        where = f"{path}: entry {i + 1}"
        if not isinstance(conv, list):
            raise BadInput(f"{where}: no 'conversations' list (ShareGPT: [{{\"conversations\": "
                           "[{\"from\": \"human\", \"value\": ...}]}])")
        turns = []
        for m in conv:
            if not isinstance(m, dict) or not isinstance(m.get("value"), str) or "from" not in m:
                raise BadInput(f"{where}: a turn without 'from' and a string 'value'")
            if m["from"] in ("human", "user") and m["value"].strip():
                turns.append(Turn(text=m["value"], source=f"{path}#{i + 1}"))
        if turns:  # ShareGPT has conversations that open with the assistant, or are empty: skipped
            jobs.append(Job(turns))
    if not jobs:
        raise BadInput(f"{path}: no conversation with a human turn")
    return jobs


def _jsonl(path: Path, text: str) -> list[Job]:
    jobs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        obj = _json_line(path, lineno, line)
        mt = obj.get("max_tokens", obj.get("output_len"))
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
            raise BadInput(f"{path}:{lineno}: max_tokens must be a positive integer")
        src = f"{path}:{lineno}"
        if isinstance(obj.get("prompt"), str) and obj["prompt"]:
            jobs.append(Job([Turn(text=obj["prompt"], max_tokens=mt, source=src)]))
        elif isinstance(obj.get("messages"), list) and obj["messages"]:
            msgs = obj["messages"]
            if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in msgs):
                raise BadInput(f"{path}:{lineno}: every message needs a 'role' and a 'content'")
            jobs.append(Job([Turn(messages=msgs, max_tokens=mt, source=src)]))
        else:
            raise BadInput(f"{path}:{lineno}: expected a non-empty 'prompt' string or 'messages' list")
    if not jobs:
        raise BadInput(f"{path}: no prompts")
    return jobs


# -- replays ----------------------------------------------------------------------------------
def read_replay(path: Path, rng: random.Random, tok: Tokenizer | None) -> list[Job]:
    """vLLM timed-trace or Mooncake JSONL, told apart per line; ``at`` in seconds from the first."""
    jobs: list[Job] = []
    blocks: dict[int, str] = {}
    for lineno, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip():
            continue
        obj = _json_line(path, lineno, line)
        ts = obj.get("timestamp")
        try:  # milliseconds (Mooncake writes integers, some tools strings)
            if isinstance(ts, bool) or not isinstance(ts, (int, float, str)):
                raise ValueError
            at = float(ts) / 1000.0
        except ValueError:
            raise BadInput(f"{path}:{lineno}: no numeric 'timestamp' (milliseconds)") from None
        if "queries" in obj:
            qs = obj["queries"]
            if not isinstance(qs, list) or not qs:
                raise BadInput(f"{path}:{lineno}: 'queries' must be a non-empty list")
            turns = [Turn(text=synthetic_text(_count(path, lineno, q, "prompt_length"), rng, tok),
                          max_tokens=_count(path, lineno, q, "response_length"), source=f"{path}:{lineno}")
                     for q in qs]
        elif "input_length" in obj:
            n_in = _count(path, lineno, obj, "input_length")
            hashes = obj.get("hash_ids") or []
            if not isinstance(hashes, list):
                raise BadInput(f"{path}:{lineno}: 'hash_ids' must be a list")
            text = " ".join(blocks.setdefault(h, synthetic_text(MOONCAKE_BLOCK, random.Random(f"block-{h}"), tok))
                            for h in hashes)
            text = _cut(text, n_in, tok) if text else synthetic_text(n_in, rng, tok)
            turns = [Turn(text=text, max_tokens=_count(path, lineno, obj, "output_length"),
                          source=f"{path}:{lineno}")]
        else:
            raise BadInput(f"{path}:{lineno}: neither a vLLM timed trace line ('queries') nor a Mooncake "
                           "line ('input_length', 'output_length', 'hash_ids')")
        jobs.append(Job(turns, at=at))
    if not jobs:
        raise BadInput(f"{path}: no requests to replay")
    t0 = min(j.at or 0.0 for j in jobs)
    for j in jobs:
        j.at = (j.at or 0.0) - t0
    jobs.sort(key=lambda j: j.at or 0.0)
    return jobs


def _cut(text: str, n_tokens: int, tok: Tokenizer | None) -> str:
    """The first ``n_tokens`` tokens of ``text`` (words without a tokenizer)."""
    if tok is None:
        return " ".join(text.split()[:n_tokens])
    return tok.decode(tok.encode(text)[:n_tokens])


def _count(path: Path, lineno: int, obj: Any, key: str) -> int:
    v = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise BadInput(f"{path}:{lineno}: '{key}' must be a positive integer")
    return v


def _json_line(path: Path, lineno: int, line: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        raise BadInput(f"{path}:{lineno}: not a JSON object") from None
    if not isinstance(obj, dict):
        raise BadInput(f"{path}:{lineno}: not a JSON object")
    return obj


def _read(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: cannot read ({' '.join(str(e).split())})") from e
