"""The Recorder under its documented collectors path.

The write API itself is part of the trace core (:mod:`tracetool.recorder`): collectors, the
serving path and the probe all record through it. Kept here so that
``from collectors.recorder import Recorder`` (and ``from collectors import Recorder``) go on
working.
"""

from __future__ import annotations

from tracetool.recorder import NULL, Recorder, RequestHandle, current_request, new_request_id, now_ns

__all__ = ["NULL", "Recorder", "RequestHandle", "current_request", "new_request_id", "now_ns"]
