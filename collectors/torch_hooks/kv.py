"""``kv_len`` of a forward call from CPU metadata only: never a device value, never a GPU sync.

Sources, in order: the cache object (transformers 5.x ``cache=``, 4.x
``past_key_values=``: a ``DynamicCache`` length is a tensor shape, legacy
tuples likewise; static caches are read only on the CPU because their length
lives in a device tensor, and 4.x ``StaticCache.get_seq_length`` even runs a
reduction on the device), then a 2-D ``attention_mask``'s width, then a CPU
``cache_position``/``input_pos``/``position_ids``. None means "only the
device knows"; the caller then counts tokens itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _tensor_like(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "device")


def _legacy_len(cache: Any) -> int | None:
    """Legacy caches: a tuple per layer of (key, value) tensors [b, heads, seq, dim]
    (Bloom keeps keys as [b*h, dim, seq], so the value's seq axis is read), or one fused tensor."""
    if not cache:
        return 0
    e = cache[0]
    if e is None:
        return 0
    if _tensor_like(e):
        return int(e.shape[-2])
    if not e:
        return 0
    return int(e[1].shape[-2] if len(e) > 1 else e[0].shape[-2])


def _seq_len_value(n: Any) -> int | None:
    # 5.x static layers return a (possibly CUDA) tensor: read it only when it lives on the CPU
    if isinstance(n, int):
        return n
    if _tensor_like(n):
        return int(n) if n.device.type == "cpu" else None
    return None


def _public_len(layer: Any) -> int | None:
    n = layer.get_seq_length()
    return n if type(n) is int else _seq_len_value(n)


def _layer_strategy(layer_type: type) -> Callable[[Any], int | None]:
    names = {c.__name__ for c in layer_type.__mro__}
    if layer_type.__name__ == "DynamicLayer":
        SHAPE_LAYERS.add(layer_type)
        return _dynamic_layer_len
    if "DynamicLayer" in names or "QuantizedLayer" in names or "BaseQuantizedLayer" in names:
        # shape reads or Python ints in every transformers version: their public get_seq_length()
        # (a sliding window's or a quantized layer's keys hold less than the sequence)
        return _public_len
    if "StaticLayer" in names or "StaticSlidingWindowLayer" in names:
        # 4.5x computes on the device; 5.x returns a device tensor: CPU only
        def static(layer: Any) -> int | None:
            keys = getattr(layer, "keys", None)
            if not getattr(layer, "is_initialized", False) or keys is None:
                return 0
            if keys.device.type != "cpu":
                return None
            return _seq_len_value(layer.get_seq_length())
        return static
    return lambda layer: None


def _dynamic_layer_len(layer: Any) -> int | None:
    """A ``DynamicLayer`` itself (not a subclass): the documented layout of a layer's ``keys``,
    ``[batch, heads, seq_len, head_dim]``, whose ``seq_len`` grows by one per token, so the
    length is that axis: what its ``get_seq_length()`` returns, read without the method (whose
    ``numel()`` call into torch cost 2-3 µs a step with the caches cold between forward passes).
    Before the first update (``keys`` None, or 5.x's empty placeholder) it asks the method.

    The timing function reads the first layer of a cache whose ``layers`` is a list (what
    :func:`_layered_len` reads) this way itself when its type is in :data:`SHAPE_LAYERS`, saving
    a Python frame per step."""
    keys = layer.keys
    if keys is None:
        return 0
    shape = keys.shape
    return shape[2] if len(shape) == 4 else _public_len(layer)


_LAYER_STRATEGIES: dict[type, Callable[[Any], int | None]] = {}
#: Layer types read by :func:`_dynamic_layer_len` (transformers' ``DynamicLayer``), as they are seen.
SHAPE_LAYERS: set[type] = set()


def _layered_len(cache: Any) -> int | None:
    """A cache that is a list of layers (transformers >= 4.56): its first layer's length."""
    layers = cache.layers
    if not layers:
        return 0
    layer = layers[0]
    f = _LAYER_STRATEGIES.get(type(layer))
    if f is None:
        f = _LAYER_STRATEGIES[type(layer)] = _layer_strategy(type(layer))
    return f(layer)


def _dynamic4_len(cache: Any) -> int | None:
    return _seq_len_value(cache.get_seq_length())


def _unknown_len(cache: Any) -> int | None:
    return None


def _cache_strategy(cache: Any) -> Callable[[Any], int | None]:
    if isinstance(cache, (tuple, list)):
        return _legacy_len
    if isinstance(getattr(cache, "layers", None), list):  # transformers >= 4.56 / 5.x Cache
        return _layered_len
    names = {c.__name__ for c in type(cache).__mro__}
    if "DynamicCache" in names:  # 4.4x: get_seq_length reads key_cache[0].shape
        return _dynamic4_len
    return _unknown_len  # e.g. a 4.x StaticCache: its get_seq_length runs on the device


#: The reader of each cache type seen so far (``reader(cache) -> int | None``), added by
#: :func:`cache_seq_len` the first time it sees the type.
CACHE_READERS: dict[type, Callable[[Any], int | None]] = {}


def cache_seq_len(cache: Any) -> int | None:
    """Tokens already in ``cache`` read from CPU metadata, or None when only the device knows."""
    if cache is None:
        return 0
    f = CACHE_READERS.get(type(cache))
    if f is None:
        f = CACHE_READERS[type(cache)] = _cache_strategy(cache)
    return f(cache)


def _position_past(kwargs: dict[str, Any], q_len: int, batch: int) -> int | None:
    """Tokens before this call from a CPU position tensor (last position + 1 - q_len)."""
    for key in ("cache_position", "input_pos"):
        pos = kwargs.get(key)
        if pos is not None and _tensor_like(pos) and pos.device.type == "cpu" and pos.numel():
            return int(pos.reshape(-1)[-1]) + 1 - q_len
    pos = kwargs.get("position_ids")
    if pos is not None and batch == 1 and _tensor_like(pos) and pos.device.type == "cpu" and pos.numel():
        return int(pos.reshape(-1)[-1]) + 1 - q_len
    return None


def input_shape(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """(batch, q_len) of a forward call, from ``input_ids``/``inputs_embeds`` shapes."""
    x = args[0] if args else kwargs.get("input_ids")
    if x is None:
        x = kwargs.get("inputs_embeds")
        if x is None:
            x = kwargs.get("decoder_input_ids")
        if x is None:
            return None
        return int(x.shape[0]), int(x.shape[1])
    shape = x.shape
    if len(shape) == 1:
        return 1, int(shape[0])
    return int(shape[0]), int(shape[1])


def _find_cache(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    if "cache" in kwargs:
        return True, kwargs["cache"]
    if "past_key_values" in kwargs:
        return True, kwargs["past_key_values"]
    for a in args[1:]:  # positional use of a cache object (rare)
        if a is not None and (isinstance(a, tuple) or hasattr(a, "get_seq_length")):
            return True, a
    return False, None


def past_len(args: tuple[Any, ...], kwargs: dict[str, Any], q_len: int, batch: int) -> int | None:
    """Tokens already attended before this call, from CPU metadata only; None when unknown."""
    cache = kwargs.get("cache")
    if cache is None:
        cache = kwargs.get("past_key_values")
    given = cache is not None  # the common case, a cache object passed by name, in two lookups
    if not given:
        given, cache = _find_cache(args, kwargs)
    if cache is not None:
        n = cache_seq_len(cache)
        if n is not None:
            return n
    elif kwargs.get("use_cache") is False:
        return 0
    mask = kwargs.get("attention_mask")
    if mask is not None and _tensor_like(mask) and len(mask.shape) == 2:
        return int(mask.shape[-1]) - q_len
    n = _position_past(kwargs, q_len, batch)
    if n is not None:
        return n
    if given and cache is None:
        return 0
    return None
