"""The TUI's widgets, one per module; each draws what it is given and computes nothing."""
