"""Type stub of the C batch packer (tracetool/_cpack.c)."""

from typing import Any

def pack(rows: Any, ncols: int, kinds: bytes, strings: dict[int, str], address: int, /) -> int:
    """Write a struct ArrowArray of the rows' columns at ``address``; returns the row count."""

def pack_tuples(rows: list[tuple[Any, ...]], kinds: bytes, address: int, /) -> int:
    """The same for row tuples of Python values (kinds also ``d``: float64; ``s``: a str itself)."""

def release(address: int, /) -> None:
    """Release an ArrowArray that was not imported."""
