"""Structure-aware mutators shared by the fuzz tests: JSON documents, TOML tables, raw bytes.

A mutation keeps most of a valid seed and breaks one or a few things, so the
fuzzer reaches the checks deep inside a reader instead of stopping at its
first line ("not JSON").
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import strategies as st

#: Scalars that break readers: wrong types, extremes, non-finite numbers, odd text.
NASTY_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**30, 0.0, -0.0, 1e308, -1e-308, 1e-320]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10),
    st.sampled_from(["", "inf", "NaN", "-1", "1e999", "\x00", "ü", "a" * 300]),
)
JSON_VALUES = st.recursive(NASTY_SCALARS, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)), max_leaves=10)


def _paths(doc: Any, prefix: tuple[Any, ...] = (), limit: int = 400) -> list[tuple[Any, ...]]:
    """Every path to a node of ``doc`` (breadth first, capped)."""
    out: list[tuple[Any, ...]] = [prefix]
    queue = [(prefix, doc)]
    while queue and len(out) < limit:
        path, node = queue.pop(0)
        kids = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in kids:
            out.append((*path, k))
            queue.append(((*path, k), v))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


@st.composite
def mutated_json(draw: Any, seed: Any, max_ops: int = 4) -> Any:
    """``seed`` (a parsed JSON document) with 1..max_ops mutations at random nodes."""
    doc = json.loads(json.dumps(seed))
    for _ in range(draw(st.integers(1, max_ops))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        if not path:
            if draw(st.integers(0, 9)) == 0:
                doc = draw(JSON_VALUES)
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        op = draw(st.sampled_from(["replace", "replace", "delete", "dup", "empty", "scale"]))
        if op == "replace":
            parent[key] = draw(JSON_VALUES)
        elif op == "delete":
            if isinstance(parent, dict):
                del parent[key]
            else:
                parent.pop(key)
        elif op == "dup" and isinstance(parent, list):
            parent.insert(key, json.loads(json.dumps(parent[key])))
        elif op == "empty":
            node = parent[key]
            parent[key] = type(node)() if isinstance(node, (list, dict, str)) else None
        elif op == "scale":
            node = parent[key]
            if isinstance(node, (int, float)) and not isinstance(node, bool):
                factor = draw(st.sampled_from([-1, 0, 1e9, 1e-9, 1e300, math.inf, math.nan]))
                parent[key] = node * factor
    return doc


def dumps(doc: Any) -> str:
    """JSON text as Python writes it (NaN and Infinity included: some tools do write them)."""
    return json.dumps(doc, allow_nan=True)


def toml_value(v: Any) -> str:
    """A TOML literal for a JSON-ish value (what a user could write)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    return '""'


BYTE_OPS = st.one_of(
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 7)),
    st.tuples(st.just("set"), st.floats(0, 1), st.integers(0, 255)),
    st.tuples(st.just("cut"), st.floats(0, 1), st.just(0)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.floats(0, 1), st.integers(1, 64)),
    st.tuples(st.just("dup"), st.floats(0, 1), st.integers(1, 256)),
)


def mutate_bytes(data: bytes, ops: list[tuple[str, float, Any]]) -> bytes:
    """Apply byte-level mutations (bit flips, overwrites, cuts, insertions, deletions, duplications)."""
    b = bytearray(data)
    for op, where, arg in ops:
        if not b:
            break
        i = min(int(where * len(b)), len(b) - 1)
        if op == "flip":
            b[i] ^= 1 << arg
        elif op == "set":
            b[i] = arg
        elif op == "int32":
            b[i:i + 4] = int(arg).to_bytes(4, "little", signed=arg < 0)
        elif op == "cut":
            del b[i:]
        elif op == "insert":
            b[i:i] = arg
        elif op == "delete":
            del b[i:i + arg]
        elif op == "dup":
            b[i:i] = b[i:i + arg]
    return bytes(b)
