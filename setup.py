"""Build hook for the optional C extensions; everything else is in pyproject.toml.

* ``collectors.torch_hooks._cstep`` is the per-step timing function of
  ``collectors.torch_hooks.instrument()`` written in C (see its source for why).
* ``tracetool._cpack`` turns a table's pending rows into one Arrow record batch
  for the trace writer (what a live recording's ten flushes a second cost).

Both are optional: where no C compiler is found the build skips them and the
same work runs in Python, a few µs slower per step and ~100 µs slower per small
flush (``TRACETOOL_PURE_PYTHON=1`` chooses the Python paths on purpose).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("collectors.torch_hooks._cstep", ["collectors/torch_hooks/_cstep.c"], optional=True),
])
