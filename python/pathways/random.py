"""`pathways.random` (`pw.random`): counter-based random numbers with explicit keys, as `jax.random`.

A key is data: a uint32 array of shape (2,), exactly the raw key of
`jax.random.PRNGKey`. Every function is a pure function of its key, built on
the Threefry-2x32 hash of a counter, so the same key gives the same bits and
the same floats as JAX's default generator (threefry2x32 with
`jax_threefry_partitionable`, JAX's default since 0.5) for `PRNGKey`, `key`,
`split`, `fold_in`, `bits`, `uniform` (bitwise), `bernoulli`, `randint` and
`permutation` (exactly), and `normal`, `gumbel` and `categorical` (to a few
ulp; the argmax of `categorical` exactly but for near-ties).

Inside a function traced by `pw.pmap` or `pw.jit` (in `@pw.program`s too)
the functions record ops of the compiled function, so a dropout mask is drawn
on the device, per call; outside any trace they compute with numpy and return
numpy arrays, as `pathways.numpy`'s creation functions do. Either way the
result depends only on the key and the arguments: not on whether it was
drawn eagerly or traced, nor on the number of devices (a key given to 8
devices, with `in_axes=None` or as copies, gives each device the values it
gives eagerly). That
holds to the bit for every function, because all of them are built from ops
that the devices and numpy compute exactly alike: integer ops, float `+ - *
/`, `sqrt`, comparisons and bitcasts; the logarithms of `normal` and `gumbel`
are computed from those too (float64 inside, for float32 results), not with
the devices' or numpy's own `log`, whose last bits differ.

Typed keys (`jax.random.key`'s key arrays with a dtype of their own) are
absent: `key(seed)` returns the same raw uint32[2] key as `PRNGKey(seed)`,
and no function takes a batch of keys (split a key, or `pw.pmap` over keys).

  >>> key = pw.random.PRNGKey(0)
  >>> key, sub = pw.random.split(key)
  >>> x = pw.random.normal(sub, (3,))            # numpy, equal to JAX's to a few ulp
  >>> step = pw.pmap(lambda k, x: pw.nn.dropout(k, 0.1, x), devices=tpus)
  >>> y = step(pw.random.split(key, len(tpus)), xs)  # one key per device
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as _np

import pathways.numpy as _pnp
from pathways import lax as _lax
from pathways._trace_state import _state
from pathways._tracer import Tracer, bind
from pathways.numpy._common import _trace_of
from pathways.numpy._creation import _shape

__all__ = [
    "PRNGKey",
    "key",
    "split",
    "fold_in",
    "bits",
    "uniform",
    "normal",
    "bernoulli",
    "gumbel",
    "categorical",
    "randint",
    "permutation",
]

_U32 = _np.dtype(_np.uint32)
_F32 = _np.dtype(_np.float32)
_F64 = _np.dtype(_np.float64)
_FLOATS = (_F32, _F64)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_UINT32_MAX = 2**32 - 1


# --- Where the computation happens ------------------------------------------------
#
# Each function works on "arrays": numpy arrays outside any trace, traced values
# inside one. The code below is written once against what works on both: the
# operators, pathways.numpy's functions and pw.lax.bitcast_convert_type.


def _trace(name: str, args: tuple) -> Any:
    """The function trace the computation records into, or None to compute with numpy.

    The trace of a traced argument, else the current function trace: inside a
    pmap'd function concrete keys become constants and values are drawn on
    the devices, as `pathways.numpy`'s creation functions make traced values.

    Raises:
      TracerError: For a traced program value, or a traced value whose trace ended.
    """
    trace = _trace_of(name, args, "pw.random")
    return _state.function if trace is None else trace


def _on(trace: Any, x: Any) -> Any:
    """`x` where the computation happens: a traced value of `trace`, or a numpy array."""
    if trace is None:
        return _np.asarray(x)
    return x if isinstance(x, Tracer) else trace.constant(_np.asarray(x), None)


def _const(trace: Any, value: Any, dtype: Any) -> Any:
    """A constant of `dtype`; a traced constant inside a trace (numpy scalars would do
    too, but a traced value keeps its dtype against a Python scalar's weak type)."""
    return _on(trace, _np.asarray(value, dtype))


def _out(trace: Any, x: Any) -> Any:
    """A result: traced, or a numpy array (numpy gives scalars for 0-d results)."""
    return x if trace is not None else _np.asarray(x)


def _quiet() -> Any:
    """numpy's integer arithmetic wraps silently on arrays but warns on scalars (and the
    branches a `where` discards may hold inf and NaN); the eager paths expect both."""
    return _np.errstate(over="ignore", invalid="ignore", divide="ignore")


# --- Arguments --------------------------------------------------------------------


def _check_key(name: str, key: Any, trace: Any) -> Any:
    """`key` as a uint32[2] array where the computation happens.

    Raises:
      TypeError: Unless `key` is an array of dtype uint32.
      ValueError: Unless its shape is (2,).
    """
    if isinstance(key, Tracer):
        dtype, shape = key.dtype, key.shape
    else:
        try:
            arr = _np.asarray(key)
        except Exception:  # noqa: BLE001 (any object numpy cannot take)
            arr = None
        if arr is None or arr.dtype.kind not in "biuf":
            raise TypeError(
                f"{name}: key must be a PRNG key (a uint32 array of shape (2,), from "
                f"pw.random.PRNGKey or split), got {type(key).__name__}"
            )
        dtype, shape, key = arr.dtype, arr.shape, arr
    if dtype != _U32:
        raise TypeError(
            f"{name}: key must be a PRNG key, a uint32 array of shape (2,) (from "
            f"pw.random.PRNGKey or split), got dtype {dtype}"
        )
    if tuple(shape) != (2,):
        raise ValueError(
            f"{name}: key must be a single PRNG key of shape (2,), got shape {tuple(shape)}; "
            "split a key, or pw.pmap over a batch of keys"
        )
    return _on(trace, key)


def _float_dtype(name: str, dtype: Any) -> _np.dtype:
    try:
        dt = _np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{name}: dtype must be a dtype, got {dtype!r}") from None
    if dt not in _FLOATS:
        raise ValueError(f"{name}: dtype must be float32 or float64, got {dt}")
    return dt


def _broadcast_shape(name: str, shape: tuple, *param_shapes: tuple) -> None:
    """ValueError unless the parameters' shapes broadcast to `shape` (as jax.random's)."""
    try:
        got = _np.broadcast_shapes(shape, *param_shapes)
    except ValueError:
        got = None
    if got != shape:
        raise ValueError(
            f"{name}: parameter shapes {', '.join(map(str, param_shapes))} must broadcast to "
            f"the shape argument {shape}"
        )


def _shape_of(x: Any) -> tuple:
    return tuple(x.shape) if isinstance(x, Tracer) else _np.shape(x)


# --- Threefry-2x32 ------------------------------------------------------------------

# Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3"
# (SC 2011): 20 rounds, a key injection after every 4.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = 0x1BD11BDA


def _threefry2x32(k0: Any, k1: Any, x0: Any, x1: Any) -> tuple:
    """The Threefry-2x32 hash of the counters (x0, x1) under the key (k0, k1), elementwise.

    uint32 arrays that broadcast together; uint32 arithmetic wraps.
    """
    ks = (k0, k1, k0 ^ k1 ^ _KEY_PARITY)
    x0 = x0 + ks[0]
    x1 = x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = (x1 << r) | (x1 >> (32 - r))
            x1 = x0 ^ x1
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + (i + 1)
    return x0, x1


# Above this many counters a traced iota is built from two short constants.
_IOTA_CONSTANT_MAX = 4096
_IOTA_ROW = 1024


def _iota(trace: Any, shape: tuple) -> Any:
    """uint32 row-major flat indices of `shape`: the counters' low words (the high words,
    zero, are a scalar). Inside a trace without an array constant of the full size."""
    size = math.prod(shape)
    if trace is None or size <= _IOTA_CONSTANT_MAX:
        return _on(trace, _np.arange(size, dtype=_U32).reshape(shape))
    rows = -(-size // _IOTA_ROW)
    starts = _const(trace, _np.arange(rows, dtype=_U32)[:, None] * _np.uint32(_IOTA_ROW), _U32)
    flat = _pnp.reshape(starts + _const(trace, _np.arange(_IOTA_ROW, dtype=_U32), _U32), (-1,))
    return _pnp.reshape(flat[:size], shape)


def _hash_counters(name: str, trace: Any, key: Any, shape: tuple) -> tuple:
    """The two hash words of each counter 0, 1, ... (row-major over `shape`), as JAX's
    partitionable threefry: a 64-bit counter split into high and low 32-bit words."""
    if math.prod(shape) > _UINT32_MAX:
        raise ValueError(
            f"{name}: shape {shape} has more than 2**32 - 1 elements, beyond the 32-bit "
            "counters of one call; split the key and draw in parts"
        )
    zero = _const(trace, 0, _U32)
    return _threefry2x32(key[0], key[1], zero, _iota(trace, shape))


def _random_bits32(name: str, trace: Any, key: Any, shape: tuple) -> Any:
    y0, y1 = _hash_counters(name, trace, key, shape)
    return y0 ^ y1


def _split(trace: Any, key: Any, shape: tuple = (2,)) -> Any:
    y0, y1 = _hash_counters("split", trace, key, shape)
    return _pnp.stack([y0, y1], axis=len(shape))


# --- Keys ---------------------------------------------------------------------------


def PRNGKey(seed: Any) -> Any:  # noqa: N802 (JAX's name)
    """A key from an integer seed, like `jax.random.PRNGKey` (threefry2x32, x64 disabled).

    The key is `[0, seed mod 2**32]` as uint32, JAX's key for the seed when
    its 64-bit mode is off (a seed is then taken as its low 32 bits).

    Args:
      seed: A Python int (within int64, as JAX takes it), a numpy integer
        scalar, or a 0-d int32/uint32 value (traced too: `PRNGKey(seed)` of
        a traced seed gives a traced key).

    Returns:
      A uint32 array of shape (2,): numpy outside a trace, a traced value
      inside one.

    Raises:
      TypeError: For a seed that is not an integer, or not a scalar.
      ValueError: For a Python int beyond int64.
    """
    trace = _trace("PRNGKey", (seed,))
    if isinstance(seed, Tracer):
        if seed.dtype.kind not in "iub":
            raise TypeError(f"PRNGKey: seed must be an integer, got a traced {seed.aval}")
        if seed.shape:
            raise TypeError(f"PRNGKey: seed must be a scalar, got a traced {seed.aval}")
        low = seed.astype(_U32)  # int32's bits, as JAX's bitwise_and with 0xFFFFFFFF
        return _pnp.stack([_const(trace, 0, _U32), low])
    if isinstance(seed, (bool, _np.bool_)) or (
            isinstance(seed, int) or (isinstance(seed, (_np.ndarray, _np.generic))
                                      and _np.asarray(seed).dtype.kind in "iub")):
        arr = _np.asarray(seed)
        if arr.shape:
            raise TypeError(f"PRNGKey: seed must be a scalar, got an array of shape {arr.shape}")
        value = int(arr)
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"PRNGKey: seed must be within int64, as JAX takes it, got {value}")
        return _on(trace, _np.array([0, value % 2**32], _U32))
    raise TypeError(f"PRNGKey: seed must be an integer, got {type(seed).__name__} ({seed!r})")


def key(seed: Any) -> Any:
    """A key from an integer seed: the raw uint32[2] key of `PRNGKey(seed)`.

    JAX's `jax.random.key` makes a typed key array; pathways has no typed
    keys, so this is `PRNGKey` under JAX's newer name. Arguments and errors as
    `PRNGKey`.
    """
    return PRNGKey(seed)


def split(key: Any, num: Any = 2) -> Any:  # noqa: A002 (JAX's parameter name)
    """Splits a key into `num` new keys, like `jax.random.split`.

    Key `i` (row-major over `num`'s shape) is `fold_in(key, i)`: the
    Threefry hash of the counter `i` (JAX's partitionable split).

    Args:
      key: A key (uint32 array of shape (2,)).
      num: The number of keys, or a tuple of ints: their shape.

    Returns:
      uint32 keys of shape `(num, 2)` (or `(*num, 2)`).

    Raises:
      TypeError: For a key that is not a uint32 array, or a non-integer `num`.
      ValueError: For a key of another shape, or a negative `num`.
    """
    trace = _trace("split", (key,))
    k = _check_key("split", key, trace)
    try:
        shape = tuple(operator.index(n) for n in num) if isinstance(num, (tuple, list)) else (
            operator.index(num),)
    except TypeError:
        raise TypeError(f"split: num must be an int or a tuple of ints, got {num!r}") from None
    if any(n < 0 for n in shape):
        raise ValueError(f"split: num must be non-negative, got {num!r}")
    with _quiet():
        return _out(trace, _split(trace, k, shape))


def fold_in(key: Any, data: Any) -> Any:
    """A new key from `key` and a 32-bit integer, like `jax.random.fold_in`.

    `fold_in(key, i)` is `split(key, n)[i]` for any n > i. Typical use: one
    stream per step (`fold_in(key, step)`) or per device
    (`fold_in(key, pw.axis_index("i"))`).

    Args:
      key: A key.
      data: A Python int in [0, 2**32), or a 0-d integer value (numpy or
        traced; its bits are taken as uint32).

    Returns:
      A uint32 key of shape (2,).

    Raises:
      TypeError: For a bad key, or `data` that is not an integer scalar.
      ValueError: For a key of another shape, or a Python int out of [0, 2**32).
    """
    trace = _trace("fold_in", (key, data))
    k = _check_key("fold_in", key, trace)
    if isinstance(data, (bool, int)) and not isinstance(data, _np.generic):
        if not 0 <= data <= _UINT32_MAX:
            raise ValueError(f"fold_in: data must be in [0, 2**32) (a uint32), got {data}")
        d = _const(trace, data, _U32)
    else:
        dtype = data.dtype if isinstance(data, Tracer) else _np.asarray(data).dtype
        shape = _shape_of(data)
        if dtype.kind not in "iub":
            raise TypeError(f"fold_in: data must be an integer, got dtype {dtype}")
        if shape:
            raise TypeError(f"fold_in: data must be a scalar, got shape {shape}")
        d = _on(trace, data).astype(_U32)
    with _quiet():
        y0, y1 = _threefry2x32(k[0], k[1], _const(trace, 0, _U32), d)
        return _out(trace, _pnp.stack([y0, y1]))


# --- Bits and uniform floats ------------------------------------------------------


def bits(key: Any, shape: Any = (), dtype: Any = None) -> Any:
    """Uniformly random uint32 values, like `jax.random.bits` (without x64: 32 bits).

    Element `i` (row-major) is the xor of the two words of the Threefry hash
    of the counter `i`, as JAX's partitionable generator.

    Args:
      key: A key.
      shape: The result's shape.
      dtype: uint32 (the default); the other unsigned types are not supported.

    Returns:
      A uint32 array of `shape`.

    Raises:
      TypeError: For a bad key or shape.
      ValueError: For a key of another shape, a negative dimension, or a
        dtype other than uint32.
    """
    trace = _trace("bits", (key,))
    k = _check_key("bits", key, trace)
    shape = _shape("bits", shape)
    if dtype is not None and _np.dtype(dtype) != _U32:
        raise ValueError(f"bits: dtype must be uint32 (the only unsigned dtype), got "
                         f"{_np.dtype(dtype)}")
    with _quiet():
        return _out(trace, _random_bits32("bits", trace, k, shape))


def _unit_floats(name: str, trace: Any, key: Any, shape: tuple, dtype: _np.dtype) -> Any:
    """Uniform floats in [0, 1) of `shape`, with JAX's bits.

    float32: the top 23 of the 32 random bits as the mantissa of a float in
    [1, 2), minus 1 (JAX's construction). float64: JAX makes them from 64
    random bits (the two hash words, high first) the same way, keeping the top
    52; without 64-bit integers they are `hi * 2**-32 + (lo >> 12) * 2**-52`,
    the same number (both terms and their sum are exact in float64).
    """
    if dtype == _F32:
        b = _random_bits32(name, trace, key, shape)
        one_bits = _np.uint32(0x3F800000)  # 1.0f
        return _lax.bitcast_convert_type((b >> 9) | one_bits, _F32) - _np.float32(1.0)
    hi, lo = _hash_counters(name, trace, key, shape)
    return hi.astype(_F64) * 2.0**-32 + (lo >> 12).astype(_F64) * 2.0**-52


def _float_param(name: str, param: str, trace: Any, value: Any, dtype: _np.dtype) -> Any:
    """A float parameter (Python number, numpy or traced value) in `dtype`."""
    v = value if isinstance(value, Tracer) else _np.asarray(value)
    if v.dtype.kind not in "biuf":
        raise TypeError(f"{name}: {param} must be a number or an array of numbers, got "
                        f"dtype {v.dtype}")
    return v.astype(dtype) if isinstance(v, Tracer) else _on(trace, v.astype(dtype))


def _uniform(name: str, trace: Any, key: Any, shape: tuple, dtype: _np.dtype, minval: Any,
             maxval: Any) -> Any:
    lo = _float_param(name, "minval", trace, minval, dtype)
    hi = _float_param(name, "maxval", trace, maxval, dtype)
    _broadcast_shape(name, shape, _shape_of(lo), _shape_of(hi))
    floats = _unit_floats(name, trace, key, shape, dtype)
    if dtype == _F32:
        # JAX's multiply-add is fused (rounded once): so is this one, computed in float64,
        # where the product of two floats is exact (and so, but for a float64 rounding that
        # falls exactly on a float32 tie, one in about 2**29, is the sum's float32 rounding).
        scaled = (floats.astype(_F64) * (hi - lo).astype(_F64) + lo.astype(_F64)).astype(_F32)
    else:
        # Two roundings; JAX's fused one may differ in the last bit (not for the default
        # bounds, 0 and 1, where both are exact).
        scaled = floats * (hi - lo) + lo
    # At least minval, as JAX (rounding may take it below).
    return _pnp.maximum(lo, scaled)


def uniform(key: Any, shape: Any = (), dtype: Any = _np.float32, minval: Any = 0.0,
            maxval: Any = 1.0) -> Any:
    """Uniform floats in [minval, maxval), like `jax.random.uniform` (bitwise equal).

    Computed as JAX does: `max(minval, f * (maxval - minval) + minval)` for
    f uniform in [0, 1), the multiply-add rounded once for float32, as
    JAX's fused one. float64 values are those of JAX with x64 enabled (52
    random mantissa bits) for the default bounds; for others the
    multiply-add rounds twice, so the last bit may differ from JAX's fused
    one. Gradients flow to traced `minval` and `maxval`, not to the key.

    Args:
      key: A key.
      shape: The result's shape.
      dtype: float32 (the default, as JAX without x64) or float64.
      minval, maxval: Bounds (numbers, or arrays broadcasting to `shape`).

    Returns:
      An array of `shape` and `dtype`.

    Raises:
      TypeError: For a bad key, shape or bound.
      ValueError: For a key of another shape, a dtype that is not a float, or
        bounds that do not broadcast to `shape`.
    """
    trace = _trace("uniform", (key, minval, maxval))
    k = _check_key("uniform", key, trace)
    shape = _shape("uniform", shape)
    dt = _float_dtype("uniform", dtype)
    with _quiet():
        return _out(trace, _uniform("uniform", trace, k, shape, dt, minval, maxval))


# --- Logarithms from exact operations ---------------------------------------------
#
# numpy's log and the devices' differ in their last bits, so a log computed by
# either would make eager and device draws differ. These use only operations
# both compute exactly (float + - * /, comparisons, conversions, bitcasts), in
# float64: float32 results are within about half an ulp, float64 ones within
# about 2 ulp.

_LN2_HI = 0.693147180369123816490  # ln 2 to 32 bits: e * _LN2_HI is exact for |e| < 2**21
_LN2_LO = 1.90821492927058770002e-10  # ln 2 - _LN2_HI
# Powers 1, 1/3, 1/5, ... of log(m) = 2 atanh(s) = 2 (s + s**3/3 + s**5/5 + ...),
# enough terms for |s| <= 3 - 2 sqrt(2) (m within [1/sqrt 2, sqrt 2]) to 2**-60.
_ATANH_TERMS = tuple(1.0 / (2 * k + 1) for k in range(12))
# Inputs below this are scaled up (by 2**190) until they are not, so that their
# float32 rounding, read for the exponent, is a normal float32.
_SMALL, _SMALL_SCALE, _SMALL_STEPS = 2.0**-72, 2.0**190, 6


def _log64(x: Any) -> Any:
    """log(x) of float64 `x` in (0, 2**100], subnormals included."""
    e = x * 0.0
    for _ in range(_SMALL_STEPS):
        small = x < _SMALL
        x = _pnp.where(small, x * _SMALL_SCALE, x)
        e = _pnp.where(small, e - 190.0, e)
    # The exponent, from the float32 rounding of x (no 64-bit integers to bitcast to):
    # x = m * 2**(b - 127), m in [1 - 2**-25, 2).
    b = _lax.bitcast_convert_type(x.astype(_F32), _U32) >> 23
    inverse = _lax.bitcast_convert_type((_np.uint32(254) - b) << 23, _F32).astype(_F64)
    m = x * inverse  # exact: a power of two
    e = e + (b.astype(_F64) - 127.0)
    big = m > 1.4142135623730951
    m = _pnp.where(big, m * 0.5, m)
    e = _pnp.where(big, e + 1.0, e)
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    series = z * 0.0 + _ATANH_TERMS[-1]
    for c in _ATANH_TERMS[-2::-1]:
        series = series * z + c
    return e * _LN2_HI + (e * _LN2_LO + 2.0 * s * series)


def _log(x: Any) -> Any:
    """log(x) for positive `x` (float32 or float64, below 2**100), in x's dtype."""
    return _log64(x.astype(_F64)).astype(x.dtype)


def _log1p(y: Any) -> Any:
    """log(1 + y) for float `y` in (-1, 2**99], accurate for small `y` too, in y's dtype.

    Kahan's: with u = 1 + y rounded, log(u) * y / (u - 1) (y itself when u is 1).
    """
    y64 = y.astype(_F64)
    u = y64 + 1.0
    r = _pnp.where(u == 1.0, y64, _log64(u) * (y64 / (u - 1.0)))
    return r.astype(y.dtype)


# --- erf_inv, normal ------------------------------------------------------------------

# M. Giles, "Approximating the erfinv function", GPU Computing Gems Jade Edition
# (2011): polynomials in w = -log(1 - x**2) (shifted), the approximation XLA's
# ErfInv (and so jax.lax.erf_inv) evaluates. float32: w < 5 and w >= 5.
_ERFINV32 = (
    (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
     -0.00125372503, -0.00417768164, 0.246640727, 1.50140941),
    (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
     -0.0076224613, 0.00943887047, 1.00167406, 2.83297682),
)
# float64: w < 6.25, w < 16 and w >= 16.
_ERFINV64 = (
    (-3.6444120640178196996e-21, -1.685059138182016589e-19, 1.2858480715256400167e-18,
     1.115787767802518096e-17, -1.333171662854620906e-16, 2.0972767875968561637e-17,
     6.6376381343583238325e-15, -4.0545662729752068639e-14, -8.1519341976054721522e-14,
     2.6335093153082322977e-12, -1.2975133253453532498e-11, -5.4154120542946279317e-11,
     1.051212273321532285e-09, -4.1126339803469836976e-09, -2.9070369957882005086e-08,
     4.2347877827932403518e-07, -1.3654692000834678645e-06, -1.3882523362786468719e-05,
     0.0001867342080340571352, -0.00074070253416626697512, -0.0060336708714301490533,
     0.24015818242558961693, 1.6536545626831027356),
    (2.2137376921775787049e-09, 9.0756561938885390979e-08, -2.7517406297064545428e-07,
     1.8239629214389227755e-08, 1.5027403968909827627e-06, -4.013867526981545969e-06,
     2.9234449089955446044e-06, 1.2475304481671778723e-05, -4.7318229009055733981e-05,
     6.8284851459573175448e-05, 2.4031110387097893999e-05, -0.0003550375203628474796,
     0.00095328937973738049703, -0.0016882755560235047313, 0.0024914420961078508066,
     -0.0037512085075692412107, 0.005370914553590063617, 1.0052589676941592334,
     3.0838856104922207635),
    (-2.7109920616438573243e-11, -2.5556418169965252055e-10, 1.5076572693500548083e-09,
     -3.7894654401267369937e-09, 7.6157012080783393804e-09, -1.4960026627149240478e-08,
     2.9147953450901080826e-08, -6.7711997758452339498e-08, 2.2900482228026654717e-07,
     -9.9298272942317002539e-07, 4.5260625972231537039e-06, -1.9681778105531670567e-05,
     7.5995277030017761139e-05, -0.00021503011930044477347, -0.00013871931833623122026,
     1.0103004648645343977, 4.8499064014085844221),
)


def _horner(w: Any, branches: list) -> Any:
    """The polynomial of the branch that holds at each element: `branches` is a list of
    (condition or None, coefficients, highest degree first), the first holding wins; a
    shorter polynomial's leading coefficients are zero."""
    n = max(len(c) for _, c in branches)
    dtype = w.dtype
    p = w * 0.0
    for i in range(n):
        coef = None
        for cond, cs in reversed(branches):
            c = _np.asarray(cs[i - (n - len(cs))] if i >= n - len(cs) else 0.0, dtype)
            coef = c if coef is None else _pnp.where(cond, c, coef)
        p = p * w + coef
    return p


def _erf_inv(x: Any) -> Any:
    """The inverse error function of float `x` in (-1, 1), as XLA's ErfInv computes it."""
    dtype = x.dtype
    w = -_log1p(-(x * x))
    if dtype == _F32:
        lt5 = w < _np.float32(5.0)
        w = _pnp.where(lt5, w - _np.float32(2.5), _pnp.sqrt(w) - _np.float32(3.0))
        p = _horner(w, [(lt5, _ERFINV32[0]), (None, _ERFINV32[1])])
    else:
        lt625 = w < 6.25
        lt16 = w < 16.0
        w = _pnp.where(lt625, w - 3.125, _pnp.sqrt(w) - _pnp.where(lt16, 3.25, 5.0))
        p = _horner(w, [(lt625, _ERFINV64[0]), (lt16, _ERFINV64[1]), (None, _ERFINV64[2])])
    return p * x


def normal(key: Any, shape: Any = (), dtype: Any = _np.float32) -> Any:
    """Standard normal floats, like `jax.random.normal` (equal to a few ulp).

    As JAX: `sqrt(2) * erf_inv(u)` for u uniform in (-1, 1) (bitwise JAX's
    u), with Giles's erf_inv polynomial, XLA's; its logarithm is computed
    from exact operations (see the module's docstring), so the last bits may
    differ from JAX's, never between eager and device draws.

    Args:
      key: A key.
      shape: The result's shape.
      dtype: float32 (default) or float64 (JAX's values with x64 enabled).

    Returns:
      An array of `shape` and `dtype`.

    Raises:
      TypeError, ValueError: As `uniform`.
    """
    trace = _trace("normal", (key,))
    k = _check_key("normal", key, trace)
    shape = _shape("normal", shape)
    dt = _float_dtype("normal", dtype)
    lo = _np.nextafter(_np.array(-1.0, dt), _np.array(0.0, dt))
    with _quiet():
        u = _uniform("normal", trace, k, shape, dt, lo, _np.array(1.0, dt))
        return _out(trace, _np.asarray(_np.sqrt(2), dt)[()] * _erf_inv(u))


# --- Discrete distributions ---------------------------------------------------------


def bernoulli(key: Any, p: Any = 0.5, shape: Any = None) -> Any:
    """Random bools that are True with probability `p`, like `jax.random.bernoulli` (exactly).

    `uniform(key, shape, dtype of p) < p`, as JAX's default mode ("low").

    Args:
      key: A key.
      p: The probability: a Python float (taken as float32, as JAX), or a
        float32 or float64 array (numpy or traced) broadcasting to `shape`.
      shape: The result's shape; None: `p`'s shape.

    Returns:
      A bool array of `shape`.

    Raises:
      TypeError: For a bad key, or `p` that is not a float.
      ValueError: For a key of another shape, or `p` not broadcasting to `shape`.
    """
    trace = _trace("bernoulli", (key, p))
    k = _check_key("bernoulli", key, trace)
    if isinstance(p, float) and not isinstance(p, _np.generic):
        dtype = _F32
    else:
        dtype = p.dtype if isinstance(p, Tracer) else _np.asarray(p).dtype
        if dtype.kind != "f":
            raise TypeError(f"bernoulli: p must be a float or an array of floats, got dtype {dtype}")
    shape = _shape_of(p) if shape is None else _shape("bernoulli", shape)
    _broadcast_shape("bernoulli", shape, _shape_of(p))
    pv = _float_param("bernoulli", "p", trace, p, dtype)
    with _quiet():
        return _out(trace, _uniform("bernoulli", trace, k, shape, dtype, 0.0, 1.0) < pv)


def gumbel(key: Any, shape: Any = (), dtype: Any = _np.float32) -> Any:
    """Standard Gumbel floats, like `jax.random.gumbel` (mode "low"; equal to a few ulp).

    `-log(-log(u))` for u uniform in [tiny, 1), tiny the smallest normal float.

    Args and errors as `uniform` (without bounds).
    """
    trace = _trace("gumbel", (key,))
    k = _check_key("gumbel", key, trace)
    shape = _shape("gumbel", shape)
    dt = _float_dtype("gumbel", dtype)
    with _quiet():
        return _out(trace, _gumbel(trace, k, shape, dt))


def _gumbel(trace: Any, key: Any, shape: tuple, dtype: _np.dtype) -> Any:
    tiny = _np.finfo(dtype).tiny
    u = _uniform("gumbel", trace, key, shape, dtype, tiny, 1.0)
    return -_log(-_log(u))


def categorical(key: Any, logits: Any, axis: int = -1, shape: Any = None) -> Any:
    """Samples of categorical distributions, like `jax.random.categorical` (with replacement).

    The Gumbel-max trick, as JAX: the argmax along `axis` of
    `logits + gumbel(...)`. The Gumbel noise equals JAX's to a few ulp, so
    samples equal JAX's but for near-ties.

    Args:
      key: A key.
      logits: Unnormalized log-probabilities (float32 or float64; numpy or
        traced); -inf excludes a category.
      axis: The axis of the categories.
      shape: The result's shape: `logits`'s shape without `axis`, with
        leading dimensions for more samples; None: exactly that.

    Returns:
      int32 indices into `axis`, of `shape`.

    Raises:
      TypeError: For a bad key, non-float logits or a non-integer axis.
      ValueError: For an axis out of range, a key of another shape, or a
        `shape` the batch shape does not broadcast to.
    """
    trace = _trace("categorical", (key, logits))
    k = _check_key("categorical", key, trace)
    lg = logits if isinstance(logits, Tracer) else _np.asarray(logits)
    if lg.dtype not in _FLOATS:
        raise TypeError(f"categorical: logits must be float32 or float64, got dtype {lg.dtype}")
    if lg.ndim == 0:
        raise ValueError("categorical: logits must have at least one dimension (the categories)")
    try:
        a = operator.index(axis)
    except TypeError:
        raise TypeError(f"categorical: axis must be an int, got {axis!r}") from None
    if not -lg.ndim <= a < lg.ndim:
        raise ValueError(f"categorical: axis {a} is out of range for logits of shape "
                         f"{_shape_of(lg)}")
    a = a - lg.ndim if a >= 0 else a  # negative: counted from the end of the samples too
    batch = tuple(d for i, d in enumerate(_shape_of(lg)) if i != a + lg.ndim)
    shape = batch if shape is None else _shape("categorical", shape)
    _broadcast_shape("categorical", shape, batch)
    prefix = shape[: len(shape) - len(batch)]
    noise_shape = list(shape[len(shape) - len(batch):])
    noise_shape.insert(a % lg.ndim, _shape_of(lg)[a])
    lg = _on(trace, lg)
    with _quiet():
        noise = _gumbel(trace, k, prefix + tuple(noise_shape), lg.dtype)
        scores = noise + _pnp.reshape(lg, (1,) * len(prefix) + _shape_of(lg))
        out = _pnp.argmax(scores, axis=a)
    return out if trace is not None else _np.asarray(out, _np.int32)


def _check_int_bound(name: str, param: str, value: Any) -> Any:
    """A randint bound as an int32 or uint32 array (numpy or traced)."""
    if isinstance(value, Tracer):
        if value.dtype not in (_np.dtype(_np.int32), _U32):
            raise TypeError(f"{name}: {param} must be an integer, got a traced {value.aval}")
        return value
    if isinstance(value, bool) or (isinstance(value, int) and not isinstance(value, _np.generic)):
        if _INT32_MIN <= value <= _INT32_MAX:
            return _np.asarray(value, _np.int32)
        if 0 <= value <= _UINT32_MAX:
            return _np.asarray(value, _U32)
        raise ValueError(f"{name}: {param} {value} is beyond int32 and uint32")
    arr = _np.asarray(value)
    if arr.dtype.kind not in "iub":
        raise TypeError(f"{name}: {param} must be an integer or an array of integers, got "
                        f"dtype {arr.dtype}")
    if arr.dtype in (_np.dtype(_np.int32), _U32):
        return arr
    if arr.size == 0 or (arr.min() >= _INT32_MIN and arr.max() <= _INT32_MAX):
        return arr.astype(_np.int32)
    if arr.min() >= 0 and arr.max() <= _UINT32_MAX:
        return arr.astype(_U32)
    raise ValueError(f"{name}: {param} has values beyond int32 and uint32")


def _clip_to(trace: Any, v: Any, dtype: _np.dtype) -> Any:
    """Integer `v` in `dtype`, clipped to the values both types hold (JAX's
    _convert_and_clip_integer)."""
    if v.dtype == dtype:
        return v
    # Between int32 and uint32 (either way) the common values are [0, 2**31 - 1].
    lo, hi = _const(trace, 0, v.dtype), _const(trace, _INT32_MAX, v.dtype)
    return _pnp.minimum(_pnp.maximum(v, lo), hi).astype(dtype)


def _urem(a: Any, n: Any) -> Any:
    """a mod n of uint32 values, n == 0 giving a (XLA's remainder), computed exactly in
    float64 (the IR has no integer remainder): the truncated quotient is at most one too
    large, which one correction undoes."""
    af = a.astype(_F64)
    nf = n.astype(_F64)
    q = (af / nf).astype(_U32).astype(_F64)  # saturates for n == 0: r = a - q * 0
    r = af - q * nf
    return _pnp.where(r < 0.0, r + nf, r).astype(_U32)


def randint(key: Any, shape: Any, minval: Any, maxval: Any, dtype: Any = _np.int32) -> Any:
    """Uniform integers in [minval, maxval), like `jax.random.randint` (exactly).

    As JAX: two 32-bit words per value, folded modulo the span (slightly
    biased unless the span is a power of two); `maxval <= minval` gives
    minval.

    Args:
      key: A key.
      shape: The result's shape.
      minval, maxval: Bounds: integers or integer arrays (numpy or traced)
        broadcasting to `shape`; clipped to `dtype`'s range (a `maxval`
        above it makes the range's top reachable).
      dtype: int32 (default) or uint32.

    Returns:
      An array of `shape` and `dtype`.

    Raises:
      TypeError: For a bad key, non-integer bounds or dtype.
      ValueError: For a key of another shape, bounds not broadcasting to
        `shape` or beyond int32 and uint32.
    """
    trace = _trace("randint", (key, minval, maxval))
    k = _check_key("randint", key, trace)
    shape = _shape("randint", shape)
    dt = _np.dtype(dtype)
    if dt not in (_np.dtype(_np.int32), _U32):
        raise TypeError(f"randint: dtype must be int32 or uint32, got {dt}")
    mn = _check_int_bound("randint", "minval", minval)
    mx = _check_int_bound("randint", "maxval", maxval)
    _broadcast_shape("randint", shape, _shape_of(mn), _shape_of(mx))
    mn, mx = _on(trace, mn), _on(trace, mx)
    with _quiet():
        info = _np.iinfo(dt)
        # The dtype's maximum in maxval's type (clipped there): above it, the span grows
        # by one so that the maximum itself can be drawn.
        top = _clip_to(trace, _const(trace, info.max, dt), mx.dtype)
        out_of_range = mx > top
        mn_d = _clip_to(trace, mn, dt)
        mx_d = _clip_to(trace, mx, dt)
        ks = _split(trace, k)
        k1, k2 = ks[0], ks[1]
        higher = _random_bits32("randint", trace, k1, shape)
        lower = _random_bits32("randint", trace, k2, shape)
        one = _const(trace, 1, _U32)
        span = (mx_d - mn_d).astype(_U32)
        span = _pnp.where(mx_d <= mn_d, one, span)
        span = _pnp.where(out_of_range & (mx_d > mn_d), span + one, span)
        multiplier = _urem(_const(trace, 2**16, _U32), span)
        multiplier = _urem(multiplier * multiplier, span)
        offset = _urem(higher, span) * multiplier + _urem(lower, span)
        offset = _urem(offset, span)
        return _out(trace, mn_d + offset.astype(dt))


# --- Permutations ---------------------------------------------------------------------


def _ascending_order(trace: Any, sort_keys: Any) -> Any:
    """int32 positions that sort the last axis of uint32 `sort_keys` ascending, stably.

    top_k ranks larger first and equal ones by position, so top_k of the
    complemented keys is the stable ascending order (no sort op needed).
    """
    if trace is None:
        return _np.argsort(sort_keys, axis=-1, kind="stable").astype(_np.int32)
    return bind(trace, "top_k", (~sort_keys,), k=_shape_of(sort_keys)[-1])


def _take_along_last(trace: Any, x: Any, order: Any) -> Any:
    """x[..., order[..., j]] for each row of the last axis."""
    if trace is None:
        return _np.take_along_axis(x, order, axis=-1)
    shape = _shape_of(x)
    n = shape[-1]
    rows = math.prod(shape[:-1])
    if rows * n > _INT32_MAX:
        raise ValueError(f"permutation: {math.prod(shape)} elements are beyond int32 positions")
    starts = (_np.arange(rows, dtype=_np.int32) * _np.int32(n)).reshape(shape[:-1] + (1,))
    flat = _pnp.reshape(x, (rows * n,))
    return bind(trace, "take", (flat, order + _const(trace, starts, _np.int32)), axis=0)


def _shuffle(trace: Any, key: Any, x: Any, axis: int) -> Any:
    """`x` shuffled along `axis` independently per position of the other axes, as JAX's:
    rounds of a stable sort by fresh random uint32 keys, enough that collisions of all
    rounds' keys are unlikely."""
    shape = _shape_of(x)
    rounds = int(_np.ceil(3 * _np.log(max(1, math.prod(shape))) / _np.log(_UINT32_MAX)))
    if rounds == 0:
        return x
    x = _pnp.moveaxis(x, axis, -1)
    for _ in range(rounds):
        pair = _split(trace, key)
        key, subkey = pair[0], pair[1]
        # The keys are drawn in x's own layout (JAX's), then moved as x is.
        sort_keys = _pnp.moveaxis(_random_bits32("permutation", trace, subkey, shape), axis, -1)
        x = _take_along_last(trace, x, _ascending_order(trace, sort_keys))
    return _pnp.moveaxis(x, -1, axis)


def permutation(key: Any, x: Any, axis: int = 0, independent: bool = False) -> Any:
    """A random permutation of `x` along `axis`, or of range(x), like
    `jax.random.permutation` (exactly).

    As JAX: `x` is sorted by random uint32 keys (one round, or more for large
    arrays, with fresh keys), stably; here the sort is a `top_k` of the keys.

    Args:
      key: A key.
      x: An int n (a permutation of range(n), int32), or an array (numpy or
        traced) of rank >= 1.
      axis: The axis to permute.
      independent: If True, each slice along `axis` is permuted on its own
        (with other random keys); if False, all by the same permutation.

    Returns:
      The permuted array (int32 `range(x)` for an int).

    Raises:
      TypeError: For a bad key, or `x` a non-integer scalar.
      ValueError: For a key of another shape, a negative n, or an axis out
        of range.
    """
    trace = _trace("permutation", (key, x))
    k = _check_key("permutation", key, trace)
    if not isinstance(x, Tracer) and _np.ndim(x) == 0:
        arr = _np.asarray(x)
        if arr.dtype.kind not in "iu" or isinstance(x, (bool, _np.bool_)):
            raise TypeError(f"permutation: x must be an integer or an array of rank >= 1, got "
                            f"{x!r}")
        n = int(arr)
        if n < 0:
            raise ValueError(f"permutation: x must be non-negative, got {n}")
        x = _np.arange(n, dtype=_np.int32)
    elif isinstance(x, Tracer) and x.ndim == 0:
        raise TypeError(f"permutation: x must be an int or an array of rank >= 1, got a "
                        f"traced {x.aval}")
    xv = _on(trace, x)
    ndim = len(_shape_of(xv))
    try:
        a = operator.index(axis)
    except TypeError:
        raise TypeError(f"permutation: axis must be an int, got {axis!r}") from None
    if not -ndim <= a < ndim:
        raise ValueError(f"permutation: axis {a} is out of range for shape {_shape_of(xv)}")
    a %= ndim
    with _quiet():
        if independent or ndim == 1:
            return _out(trace, _shuffle(trace, k, xv, a))
        n = _shape_of(xv)[a]
        order = _shuffle(trace, k, _on(trace, _np.arange(n, dtype=_np.int32)), 0)
        if trace is None:
            return _np.take(xv, order, axis=a)
        return bind(trace, "take", (xv, order), axis=a)
