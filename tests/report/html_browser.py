"""A real headless browser for the HTML page's tests: Debian's ``chromium``, driven by the DevTools
protocol over ``--remote-debugging-pipe`` (JSON messages ending in NUL on fds 3 and 4), so no
websocket client, no driver and no browser download is needed.

    with Browser() as b:
        seen = b.open(Path("page.html"))        # requests, console errors, the page's sections
        png = b.screenshot(dark=False)          # the whole page as PNG bytes

:func:`find_chromium` says why there is none (the tests skip with that line).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
         "--disable-extensions", "--mute-audio", "--hide-scrollbars", "--remote-debugging-pipe"]
TIMEOUT_S = 60.0

#: What the page holds, read in the browser: each section, whether it is drawn, its reason, its
#: figures, every number marked with its key, and how wide it lays out against the window.
READ_PAGE = """(() => {
  const sections = [...document.querySelectorAll('main > section')].map(s => ({
    id: s.id, absent: s.dataset.absent === 'true',
    reason: (s.querySelector('.reason') || {}).textContent || null,
    svgs: s.querySelectorAll('svg').length,
    svgWidths: [...s.querySelectorAll('svg')].map(v => v.getBoundingClientRect().width),
    tablesFit: [...s.querySelectorAll('.tw')].every(w => w.scrollWidth <= w.clientWidth)}));
  const numbers = [...document.querySelectorAll('[data-key]')].map(e => ({
    key: e.dataset.key, scale: e.dataset.scale ? Number(e.dataset.scale) : 1, text: e.textContent}));
  return {title: document.title, kind: document.body.dataset.kind, sections, numbers,
          scripts: document.scripts.length, height: document.documentElement.scrollHeight,
          scrollWidth: document.documentElement.scrollWidth, viewportWidth: window.innerWidth,
          fg: getComputedStyle(document.body).color};
})()"""


def find_chromium() -> tuple[str | None, str]:
    """(path, "") or (None, why there is no browser to run)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p, ""
    return None, "no chromium on PATH (the README's test command installs Debian's chromium package)"


@dataclass
class Seen:
    """What loading a page did: every request the browser made, every console error, the page."""

    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    page: dict[str, Any] = field(default_factory=dict)


class Browser:
    """One headless chromium with one tab, for one test."""

    def __init__(self, width: int = 1280, height: int = 900) -> None:
        exe, why = find_chromium()
        if exe is None:
            raise RuntimeError(why)
        self.width, self.height = width, height
        self._profile = tempfile.TemporaryDirectory(prefix="tt-chromium-")
        self._log = open(Path(self._profile.name) / "chromium.log", "wb")  # noqa: SIM115 (closed in close())
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()

        def fds() -> None:  # in the child: the protocol's fds 3 (commands in) and 4 (responses out)
            a, b = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(res_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self._profile.name}", f"--window-size={width},{height}", "about:blank"],
            # chromium's own log goes to a file (a pipe nobody reads could fill and stall it)
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log, preexec_fn=fds,
            pass_fds=(3, 4), close_fds=True)
        os.close(cmd_r)
        os.close(res_w)
        self._out = os.fdopen(cmd_w, "wb", buffering=0)
        self._in = os.fdopen(res_r, "rb", buffering=0)
        self._next = 0
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Network", "Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", session=self.session)

    # -- protocol ---------------------------------------------------------------------------
    def _read(self) -> None:
        buf = b""
        while True:
            chunk = self._in.read(65536)
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        q = self._replies.get(msg["id"])
                    if q is not None:
                        q.put(msg)
                else:
                    self.events.put(msg)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        with self._lock:
            self._next += 1
            mid = self._next
            q: queue.Queue[dict[str, Any]] = queue.Queue()
            self._replies[mid] = q
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self._out.write(json.dumps(msg).encode() + b"\0")
        try:
            reply = q.get(timeout=TIMEOUT_S)
        except queue.Empty:
            raise TimeoutError(f"chromium gave no answer to {method} in {TIMEOUT_S:.0f} s") from None
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply.get("result") or {})

    def _until(self, method: str, seen: Seen) -> None:
        """Take events until ``method`` arrives, noting requests and errors on the way."""
        while True:
            try:
                ev = self.events.get(timeout=TIMEOUT_S)
            except queue.Empty:
                raise TimeoutError(f"no {method} from chromium in {TIMEOUT_S:.0f} s") from None
            self._note(ev, seen)
            if ev.get("method") == method:
                return

    @staticmethod
    def _note(ev: dict[str, Any], seen: Seen) -> None:
        m, p = ev.get("method"), ev.get("params") or {}
        if m == "Network.requestWillBeSent":
            seen.requests.append(p["request"]["url"])
        elif m == "Runtime.exceptionThrown":
            seen.errors.append(str(p.get("exceptionDetails", {}).get("text")))
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
            seen.errors.append(" ".join(str(a.get("value")) for a in p.get("args", [])))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
            seen.errors.append(str(p["entry"].get("text")))

    # -- what the tests use -----------------------------------------------------------------
    def open(self, path: Path, dark: bool = False) -> Seen:
        """Load ``path``; return what it requested, the errors it logged, and what it holds."""
        seen = Seen()
        self.call("Emulation.setEmulatedMedia", {"features": [
            {"name": "prefers-color-scheme", "value": "dark" if dark else "light"}]}, session=self.session)
        self.call("Page.navigate", {"url": path.resolve().as_uri()}, session=self.session)
        self._until("Page.loadEventFired", seen)
        # a marker evaluated after load: every event logged before it has been delivered
        self.call("Runtime.evaluate", {"expression": "console.debug('tracetool-settled')"}, session=self.session)
        while True:
            ev = self.events.get(timeout=TIMEOUT_S)
            self._note(ev, seen)
            if ev.get("method") == "Runtime.consoleAPICalled" and any(
                    a.get("value") == "tracetool-settled" for a in ev["params"].get("args", [])):
                break
        r = self.call("Runtime.evaluate", {"expression": READ_PAGE, "returnByValue": True}, session=self.session)
        seen.page = r["result"]["value"]
        return seen

    def screenshot(self, height: int | None = None) -> bytes:
        """The page as PNG, ``height`` CSS pixels tall (default: the whole page)."""
        h = height or int(self.call("Runtime.evaluate", {"expression": "document.documentElement.scrollHeight",
                                                         "returnByValue": True}, session=self.session)
                          ["result"]["value"])
        self.call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": h, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=self.session)
        r = self.call("Page.captureScreenshot", {"format": "png"}, session=self.session)
        return base64.b64decode(r["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for f in (self._out, self._in):
            try:
                f.close()
            except OSError:
                pass
        self._log.close()
        self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

