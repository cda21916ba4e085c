"""Type stub of the C step slot (collectors/torch_hooks/_cstep.c)."""

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

NCOLS: int

class StepRows:
    """Step rows waiting for the writer, 7 native int64 each."""

    max_rows: int
    def __init__(self, max_rows: int) -> None: ...
    def __len__(self) -> int: ...
    def take(self) -> bytes: ...
    def push(self, row: Any, /) -> bool: ...

class StepIds:
    """The process's step ids: an endless iterator counted in C (only ``step_ids`` exists)."""

    def __iter__(self) -> StepIds: ...
    def __next__(self) -> int: ...

#: the process's step ids
step_ids: StepIds
#: capture() blocks open in any thread: a writable one-item ('q') view of the C counter
capturing: memoryview

class StepSlot:
    """The timing slot installed as a module's ``_compiled_call_impl``."""

    last: Any
    active: bool
    enabled: bool
    def __init__(self, module: Any, recorder: Any,
                 general: Callable[[Any, int, tuple[Any, ...], dict[str, Any]], Any],
                 classify: Callable[[Any], tuple[int, type | None]], trace_globals: dict[str, Any],
                 hook_dicts: tuple[dict[Any, Any], ...], step_ids: Any, capture_var: ContextVar[Any],
                 sink: Any, reduce_to: Callable[[], None], out: StepRows, enabled: bool) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
