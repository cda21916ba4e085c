"""Collectors: record per-token traces from inside inference processes.

Importing this package is cheap and safe in any server: it loads the trace
core (pyarrow, numpy) and nothing else. torch, transformers, NVML and py-spy
are imported by the modules that need them, when they are used.
"""

from __future__ import annotations

from typing import Any

from collectors.recorder import Recorder, RequestHandle, current_request, now_ns

__all__ = ["Recorder", "RequestHandle", "current_request", "instrument", "now_ns", "uninstrument"]


def __getattr__(name: str) -> Any:
    # torch-dependent helpers load on first use, never at package import
    if name in ("instrument", "uninstrument"):
        from collectors import torch_hooks

        return getattr(torch_hooks, name)
    raise AttributeError(name)
