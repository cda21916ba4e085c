"""``tracetool serve``'s app (engine, recorder, middleware) on a real uvicorn in a thread, in-process.

The fault and exposure tests need to reach inside a running server (patch a
hook point, read its Recorder) while driving it over real HTTP.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from collectors import Recorder
from tests.serving.openai_doubles import UvicornThread


class App:
    """``tracetool serve``'s app (engine, recorder, middleware) on a real uvicorn in a thread."""

    def __init__(self, tiny: tuple[Any, Any], out: Path) -> None:
        from tracetool.serving.engine import Engine
        from tracetool.serving.openai_api import Limits
        from tracetool.serving.server import ServerState, build_app

        model, tok = copy.deepcopy(tiny[0]), tiny[1]
        self.rec = Recorder(out).start()
        self.engine = Engine(model, tok, self.rec, max_batch=4).start()
        state = ServerState(self.engine, self.rec, "m", 2048, Limits())
        self.http = UvicornThread(build_app(state)).__enter__()
        self.url = self.http.url

    def close(self) -> None:
        self.http.__exit__(None, None, None)  # its requests end first, then what they write to
        self.engine.close()
        self.rec.close()
