"""What every text output (the CLI, the TUI, the reports) shows for a value the trace does not
measure: a null is unknown, never zero and never blank, and it reads the same everywhere."""

from __future__ import annotations

#: A value that is not measured (a null in the analysis). An en dash, not a hyphen, so it is
#: never read as a minus sign.
NOT_MEASURED = "–"

__all__ = ["NOT_MEASURED"]
