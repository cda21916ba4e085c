"""The Recorder under its documented collectors path, taking a live address as a string.

The write API itself is part of the trace core (:mod:`tracetool.recorder`): collectors, the
serving path and the probe all record through it. The core knows nothing of the live
endpoint (:mod:`tracetool.live`, a layer above it) beyond what ``live=`` must be able to do;
this spelling also takes the forms users write, an address ``"127.0.0.1:PORT"`` or a mapping
of :class:`~tracetool.live.config.LiveConfig` fields, so
``from collectors import Recorder; Recorder("trace", live="127.0.0.1:9100")`` works.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracetool import recorder as _core
from tracetool.recorder import (
    NULL,
    LiveSpec,
    RequestHandle,
    current_request,
    new_request_id,
    now_ns,
)


class Recorder(_core.Recorder):
    __doc__ = _core.Recorder.__doc__

    def __init__(self, out: str | Path | None = None, *,
                 live: str | Mapping[str, Any] | LiveSpec | None = None, **options: Any) -> None:
        if live is not None and not hasattr(live, "start_live"):  # a str, a mapping or a LiveConfig here
            from tracetool.live.sidecar import live_spec

            live = live_spec(live)
        super().__init__(out, live=live, **options)


__all__ = ["NULL", "Recorder", "RequestHandle", "current_request", "new_request_id", "now_ns"]
