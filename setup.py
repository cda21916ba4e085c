"""Build hook for the optional C step slot; everything else is in pyproject.toml.

``collectors.torch_hooks._cstep`` is the per-step timing function of
``collectors.torch_hooks.instrument()`` written in C (see its source for why).
It is optional: where no C compiler is found the build skips it and the same
work runs in Python, a few µs slower per step (``TRACETOOL_PURE_PYTHON=1``
chooses the Python path on purpose).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("collectors.torch_hooks._cstep", ["collectors/torch_hooks/_cstep.c"],
                             optional=True)])
