"""The optional C extensions (``collectors.torch_hooks._cstep``, ``tracetool._cpack``): built by
``pip install`` where a C compiler is, skipped where none is; the Python paths do the same work."""

from __future__ import annotations

import importlib
import os
from typing import Any

#: Set (to anything) to run the Python paths even where the C extensions were built.
PURE_PYTHON_ENV = "TRACETOOL_PURE_PYTHON"


def load_optional(module: str) -> Any:
    """The extension module ``module``, or None when it was not built or ``TRACETOOL_PURE_PYTHON``
    is set."""
    if os.environ.get(PURE_PYTHON_ENV):
        return None
    try:
        return importlib.import_module(module)
    except ImportError:  # no compiler at install time
        return None
