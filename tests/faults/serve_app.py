"""``tracetool serve``'s app (engine, recorder, middleware) on a real uvicorn in a thread, in-process.

The fault and exposure tests need to reach inside a running server (patch a
hook point, read its Recorder) while driving it over real HTTP.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from pathlib import Path
from typing import Any

from collectors import Recorder
from tests.waiting import wait_until


class App:
    """``tracetool serve``'s app (engine, recorder, middleware) on a real uvicorn in a thread."""

    def __init__(self, tiny: tuple[Any, Any], out: Path) -> None:
        import uvicorn

        from tracetool.serving.engine import Engine
        from tracetool.serving.openai_api import Limits
        from tracetool.serving.server import ServerState, build_app

        model, tok = copy.deepcopy(tiny[0]), tiny[1]
        self.rec = Recorder(out).start()
        self.engine = Engine(model, tok, self.rec, max_batch=4).start()
        state = ServerState(self.engine, self.rec, "m", 2048, Limits())
        config = uvicorn.Config(build_app(state), host="127.0.0.1", port=0, log_level="critical", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), "uvicorn listening", interval=0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.engine.close()
        self.rec.close()
