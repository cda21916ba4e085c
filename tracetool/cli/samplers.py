"""``--<name>[=HZ]`` flags for the samplers of :data:`collectors.launcher.SAMPLERS`.

``record`` and ``serve`` offer the same flags (``--nvml[=HZ]``, ``--pyspy[=HZ]``);
rates are checked before anything starts, so a bad one is a usage error (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def sampler_options(fn: F) -> F:
    """One ``--<name>[=HZ]`` option per registered sampler (value ``sampler_<name>``)."""
    from collectors.launcher import SAMPLERS

    for name, spec in sorted(SAMPLERS.items(), reverse=True):
        fn = click.option(f"--{name}", f"sampler_{name}", type=float, is_flag=False,
                          flag_value=spec.default_hz, default=None, metavar="[=HZ]",
                          help=f"{spec.help} Optional rate in Hz (default {spec.default_hz:g}).")(fn)
    return fn


def chosen_samplers(options: Mapping[str, float | None]) -> dict[str, float]:
    """The samplers asked for, name -> Hz, each rate checked (UsageError otherwise)."""
    from collectors.launcher import SAMPLERS

    chosen = {k.removeprefix("sampler_"): v for k, v in options.items()
              if k.startswith("sampler_") and v is not None}
    for name, hz in chosen.items():
        SAMPLERS[name].check(name, hz)
    return chosen
