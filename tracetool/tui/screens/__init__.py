"""The TUI's screens: one per view of a trace, plus the dialogs (help, hypothesis, one request)."""
