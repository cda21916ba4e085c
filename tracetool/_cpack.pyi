"""Type stub of the C batch packer (tracetool/_cpack.c)."""

from typing import Any

def pack(rows: Any, ncols: int, kinds: bytes, strings: dict[int, str], address: int, /) -> int:
    """Write a struct ArrowArray of the rows' columns at ``address``; returns the row count."""

def release(address: int, /) -> None:
    """Release an ArrowArray that was not imported."""
