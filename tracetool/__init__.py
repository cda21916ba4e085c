"""tracetool: per-token latency traces and latency attribution for LLM inference.

The core package holds the trace format (``tracetool.schema``), trace I/O
(``tracetool.writer``, ``tracetool.reader``), errors and the CLI. It imports
nothing heavy at package import: collectors import it from inside inference
servers.
"""

from __future__ import annotations

__version__ = "0.1.0"
