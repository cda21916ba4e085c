"""The analysis options: one object from the command line (or the TUI) down to the SQL.

``tracetool analyze``, ``tui``, ``attach``, ``report`` and the Python API take the same
options — the roofline's model and hardware, the claims to judge, the thresholds, the memory
DuckDB may hold and the engine that runs the modules. They are resolved into one
:class:`AnalysisOptions` where they enter (a click decorator, a keyword call of
:func:`analyzers.analyze`) and travel as that object; what a trace needs from them (its
roofline inputs, the parsed claims) is derived here, in one place.

Importing this module loads neither DuckDB nor pyarrow: the CLI builds the object while it
parses its options, and the TUI's headless model holds one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from analyzers.params import ClaimSpec, RooflineInputs, Thresholds, parse_claim, roofline_inputs
from tracetool.errors import UsageError

#: The engines that can run the modules (``--engine``).
ENGINES = ("duckdb", "spark")


@dataclass(frozen=True)
class AnalysisOptions:
    """What an analysis is asked for, besides the traces.

    Attributes:
        model, gpu: presets (``llama-3.1-8b``, ``h100-sxm``, or a config.json path) for the
            roofline; they override meta.json's ``model``/``hardware`` blocks.
        gpus: GPUs the model is sharded over (tensor parallel), overriding meta.json.
        weight_dtype, kv_dtype: dtypes for the preset's bytes (``bf16``, ``fp8``...).
        claims: stories to judge (component names, aliases such as ``network-rtt``, phrases, or
            parsed :class:`ClaimSpec`).
        thresholds: verdict and finding thresholds.
        memory_limit: bytes DuckDB may hold before it spills (None: DuckDB's default).
        spill: the exact ITL percentiles from a table DuckDB can spill (True) or from memory
            (False); None: spilled past a share of ``memory_limit``
            (:func:`analyzers.connection.spill_quantiles`). The numbers are the same either way.
        engine: ``duckdb`` or ``spark`` (:mod:`analyzers.backend` opens it).
        spark_master: the Spark master URL for ``engine="spark"`` (None: ``local[*]``).
    """

    model: str | None = None
    gpu: str | None = None
    gpus: int | None = None
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    claims: tuple[str | ClaimSpec, ...] = ()
    thresholds: Thresholds = field(default_factory=Thresholds)
    memory_limit: int | None = None
    spill: bool | None = None
    engine: str = "duckdb"
    spark_master: str | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise UsageError(f"--engine {self.engine}: unknown ({' or '.join(ENGINES)})")

    @classmethod
    def of(cls, options: AnalysisOptions | None = None, **changes: Any) -> AnalysisOptions:
        """``options`` (default: the defaults) with ``changes``: the keyword form of the API
        (``analyze(trace, model=...)``) resolved into the object once. ``claims`` may be any
        sequence and ``thresholds`` None (the defaults).

        Raises:
            TypeError: a name that is not an option.
        """
        unknown = set(changes) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown analysis option(s): {', '.join(sorted(unknown))}")
        if "claims" in changes:
            changes["claims"] = tuple(changes["claims"] or ())
        if "thresholds" in changes and changes["thresholds"] is None:
            changes["thresholds"] = Thresholds()
        return replace(options or cls(), **changes)

    def roofline(self, meta: dict[str, Any]) -> RooflineInputs:
        """The roofline inputs of a trace with this ``meta.json``, the presets applied."""
        return roofline_inputs(meta, model=self.model, gpu=self.gpu, gpus=self.gpus,
                               weight_dtype=self.weight_dtype, kv_dtype=self.kv_dtype)

    def claim_specs(self) -> list[ClaimSpec]:
        """The claims, parsed.

        Raises:
            UsageError: a claim no component, alias or phrase matches.
        """
        return [c if isinstance(c, ClaimSpec) else parse_claim(c) for c in self.claims]


__all__ = ["ENGINES", "AnalysisOptions"]
