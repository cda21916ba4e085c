"""``python -m tracetool``: the same as the ``tracetool`` console script."""

from __future__ import annotations

import sys

from tracetool.cli import main

if __name__ == "__main__":
    sys.exit(main())
