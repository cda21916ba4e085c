"""The probe's defaults are declared once, in ProbeConfig (and WorkloadSpec, which it extends): each
option of ``tracetool probe`` reads its default from there, and this holds them equal."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

import click

from tracetool.cli.serve_cmd import probe
from tracetool.serving.probe_types import ProbeConfig

#: Options whose field has another name, and flags that say the field's opposite.
FIELD = {"output": "out", "timeout": "timeout_s", "metrics_interval": "metrics_interval_s"}
NEGATED = {"no_usage": "include_usage", "quiet": "progress"}
#: Fields no option sets: the URL is an argument, extra is for callers of the library.
NO_OPTION = {"url", "extra"}


def _config_default(name: str) -> Any:
    f = next(f for f in fields(ProbeConfig) if f.name == name)
    return f.default_factory() if f.default is MISSING else f.default  # type: ignore[operator]


def _options() -> dict[str, click.Option]:
    """The options that configure the run (not the output's shape, not a hidden old spelling)."""
    return {p.name: p for p in probe.params if isinstance(p, click.Option) and p.name and not p.hidden
            and p.name not in ("as_json", "force", "slo")}


def test_each_probe_option_defaults_to_its_config_field() -> None:
    ctx = click.Context(probe)
    covered = set()
    for name, opt in _options().items():
        default = opt.get_default(ctx)  # (a flag's default is click's UNSET until asked)
        if name in NEGATED:
            field = NEGATED[name]
            assert default is (not _config_default(field)), name
        else:
            field = FIELD.get(name, name if name in {f.name for f in fields(ProbeConfig)} else f"{name}_s")
            want = _config_default(field)
            # --concurrency takes a list (C[,C...]): its default is the field's number as text
            assert (str(want) if name == "concurrency" else want) == default, name
        covered.add(field)
    assert {f.name for f in fields(ProbeConfig)} - covered == NO_OPTION


def test_the_scrapers_own_default_is_the_probes() -> None:
    from collectors.prometheus import DEFAULT_INTERVAL_S

    assert _config_default("metrics_interval_s") == DEFAULT_INTERVAL_S
