"""One-line notices on stderr, each said once per process.

Collectors run inside other people's processes: they must tell the user when
something degrades (a source is missing, the disk filled up) without flooding
stderr or raising. Every notice also goes to the ``tracetool`` logger, escaped as on stderr:
a handler may write it to a terminal, and a notice quotes servers, devices and files.
"""

from __future__ import annotations

import logging
import threading

from tracetool.untrusted import echo, shown

log = logging.getLogger("tracetool")
_said: set[str] = set()
_lock = threading.Lock()


def say_once(key: str, message: str) -> bool:
    """Print ``tracetool: <message>`` on stderr the first time ``key`` is seen.

    Returns True when the line was printed. Never raises.
    """
    with _lock:
        if key in _said:
            return False
        _said.add(key)
    try:
        log.info("%s", shown(message))
        echo(f"tracetool: {message}", err=True)  # messages quote servers, devices, files
    except Exception:  # a closed stderr must not break the host
        pass
    return True


def reset() -> None:
    """Forget what was said (tests)."""
    with _lock:
        _said.clear()
