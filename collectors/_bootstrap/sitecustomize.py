"""Loaded at start-up by every Python that ``tracetool record`` runs (this folder leads PYTHONPATH).

It starts recording when the parent asked for it (``TRACETOOL_RECORD_DIR``),
then runs the ``sitecustomize`` this one shadows, if any. It never stops the
program: a failure is one line on stderr.
"""

import os
import sys


def _record() -> None:
    if not os.environ.get("TRACETOOL_RECORD_DIR"):
        return
    try:
        from collectors.launcher import start_in_child

        start_in_child()
    except Exception as e:  # e.g. a Python without tracetool: the parent writes an empty trace
        os.environ.pop("TRACETOOL_RECORD_DIR", None)
        print(f"tracetool: not recording this process ({type(e).__name__}: {e})", file=sys.stderr)


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        print(f"tracetool: the program's sitecustomize failed ({type(e).__name__}: {e})", file=sys.stderr)


_record()
_chain()
