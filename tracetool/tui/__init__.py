"""``tracetool tui``: a Textual viewer of where a trace's latency went, and which story is wrong.

The app (``tracetool.tui.app``) imports textual; ``model``, ``story`` and
``queries`` do not, so they are tested and benchmarked headless. Importing
this package itself loads nothing heavy.
"""
