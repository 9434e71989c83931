"""Neural-network functions, like `jax.nn`, built from the ops of `pathways.numpy` (and
`dropout`, from `pathways.random`).

Each one is a composite: inside a `pw.pmap` trace it records the primitive ops
it is made of (so `pw.grad` differentiates it through them), and called on
numpy arrays it computes with numpy.

  >>> import pathways.nn as pnn
  >>> f = pw.pmap(lambda logits: pnn.log_softmax(logits).max(), devices=tpus)
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as _np

import pathways.numpy as _pnp
from pathways import _checks
from pathways._tracer import Tracer, stop_gradient

__all__ = [
    "relu",
    "gelu",
    "sigmoid",
    "silu",
    "swish",
    "softplus",
    "log_sigmoid",
    "elu",
    "selu",
    "celu",
    "leaky_relu",
    "relu6",
    "hard_tanh",
    "hard_sigmoid",
    "hard_silu",
    "hard_swish",
    "glu",
    "standardize",
    "softmax",
    "log_softmax",
    "logsumexp",
    "one_hot",
    "layer_norm",
    "dropout",
]


def relu(x: Any) -> Any:
    """max(x, 0), elementwise, with gradient 1 where x > 0 and 0 elsewhere (as `jax.nn.relu`).

    `maximum(x, 0)` alone would split the gradient of the tie at 0 (0.5, as
    maximum's own rule); here its value only fills the other positions (0,
    or NaN for NaN), outside gradients.
    """
    return _pnp.where(x > 0, x, stop_gradient(_pnp.maximum(x, 0)))


def gelu(x: Any, approximate: bool = True) -> Any:
    """The GELU activation, as `jax.nn.gelu` (whose default is also the approximation).

    `approximate=True`: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    `approximate=False`: the exact `x P(X <= x)` for a standard normal X,
    `0.5 x (1 + erf(x / sqrt(2)))`, computed as `0.5 x erfc(-x / sqrt(2))`,
    which keeps its relative accuracy for negative x, where 1 + erf cancels
    (gelu(-10) is -7.6e-23, not 0).

    Raises:
      TypeError: If `approximate` is not a bool.
    """
    if not isinstance(approximate, (bool, _np.bool_)):
        raise TypeError(f"gelu: approximate must be a bool, got {approximate!r}")
    if not approximate:
        return 0.5 * x * _pnp.erfc(x * (-1.0 / math.sqrt(2.0)))
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + _pnp.tanh(c * (x + 0.044715 * (x * x * x))))


def _float_of(x: Any) -> Any:
    """`x` with integers in float64 and bool in float32 (as the transcendental functions
    compute them); floats, bfloat16 included, as they are."""
    dtype = _np.dtype(x.dtype) if isinstance(x, Tracer) else _np.asarray(x).dtype
    if dtype.kind not in "iub":
        return x
    to = _np.float32 if dtype.kind == "b" else _np.float64
    return x.astype(to) if isinstance(x, Tracer) else _np.asarray(x).astype(to)


def sigmoid(x: Any) -> Any:
    """1 / (1 + exp(-x)), elementwise, computed stably.

    Only `e = exp(-|x|)`, at most 1, is computed: the result is `1 / (1 + e)`
    for x >= 0 and `e / (1 + e)` for x < 0. So no intermediate overflows, at
    saturated logits neither (`1 / (1 + exp(-x))` differentiated through its
    ops gives 0 * inf = NaN there), and the gradient the tape derives,
    `e / (1 + e)**2` (= s * (1 - s)), is finite and accurate everywhere.
    """
    x = _float_of(x)  # -x of uint32 would wrap
    nonneg = x >= 0
    # -|x|, written as a select so that its gradient at 0 is that of -x.
    e = _pnp.exp(_pnp.where(nonneg, -x, x))
    return _pnp.where(nonneg, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(x: Any) -> Any:
    """x * sigmoid(x) (also called swish)."""
    return x * sigmoid(x)


swish = silu


def softplus(x: Any) -> Any:
    """log(1 + exp(x)), as `jax.nn.softplus`: `logaddexp(x, 0)`, with no overflow."""
    return _pnp.logaddexp(_float_of(x), 0.0)


def log_sigmoid(x: Any) -> Any:
    """log(sigmoid(x)), as `jax.nn.log_sigmoid`: `-softplus(-x)`."""
    return -softplus(-_float_of(x))


def _elu_branch(x: Any, alpha: Any) -> Any:
    # alpha * (exp(x) - 1) where x <= 0, its argument kept at 0 elsewhere so
    # that neither the value nor its gradient overflows.
    return alpha * _pnp.expm1(_pnp.where(x > 0, 0.0, x))


def elu(x: Any, alpha: Any = 1.0) -> Any:
    """x where x > 0, else alpha * (exp(x) - 1), as `jax.nn.elu` (gradient alpha at 0)."""
    x = _float_of(x)
    return _pnp.where(x > 0, x, _elu_branch(x, alpha))


def selu(x: Any) -> Any:
    """scale * elu(x, alpha) with the self-normalizing constants, as `jax.nn.selu`."""
    alpha = 1.6732632423543772848170429916717
    scale = 1.0507009873554804934193349852946
    return scale * elu(x, alpha)


def celu(x: Any, alpha: Any = 1.0) -> Any:
    """max(x, 0) + alpha * expm1(min(x, 0) / alpha), as `jax.nn.celu`."""
    x = _float_of(x)
    return _pnp.maximum(x, 0.0) + alpha * _pnp.expm1(_pnp.minimum(x, 0.0) / alpha)


def leaky_relu(x: Any, negative_slope: Any = 1e-2) -> Any:
    """x where x >= 0, else negative_slope * x, as `jax.nn.leaky_relu` (gradient 1 at 0)."""
    return _pnp.where(x >= 0, x, negative_slope * x)


def relu6(x: Any) -> Any:
    """min(max(x, 0), 6), as `jax.nn.relu6`: gradient 1 where 0 < x < 6, else 0."""
    inside = (x > 0) & (x < 6)
    return _pnp.where(inside, x, stop_gradient(_pnp.minimum(_pnp.maximum(x, 0), 6)))


def hard_tanh(x: Any) -> Any:
    """x clipped to [-1, 1], as `jax.nn.hard_tanh` (gradient 1 on the closed interval)."""
    return _pnp.where(x > 1, 1, _pnp.where(x < -1, -1, x))


def hard_sigmoid(x: Any) -> Any:
    """relu6(x + 3) / 6, as `jax.nn.hard_sigmoid`."""
    return relu6(x + 3.0) / 6.0


def hard_silu(x: Any) -> Any:
    """x * hard_sigmoid(x) (also called hard_swish), as `jax.nn.hard_silu`."""
    return x * hard_sigmoid(x)


hard_swish = hard_silu


def glu(x: Any, axis: int = -1) -> Any:
    """Gated linear unit, as `jax.nn.glu`: the first half of `x` along `axis` times
    the sigmoid of the second.

    Raises:
      ValueError: If that axis has an odd size.
    """
    a, b = _pnp.split(x, 2, axis=axis)
    return a * sigmoid(b)


def standardize(x: Any, axis: Any = -1, mean: Any = None, variance: Any = None,
                epsilon: float = 1e-5) -> Any:
    """(x - mean) / sqrt(variance + epsilon) over `axis`, as `jax.nn.standardize` (the
    variance is mean(x**2) - mean**2, as JAX's)."""
    if mean is None:
        mean = _pnp.mean(x, axis=axis, keepdims=True)
    if variance is None:
        variance = _pnp.mean(_pnp.square(x), axis=axis, keepdims=True) - _pnp.square(mean)
    return (x - mean) * _pnp.rsqrt(variance + epsilon)


def _max_shift(x: Any, axis: Any, finite: bool = True) -> Any:
    """The max over `axis` (keepdims), outside gradients: what softmax and
    logsumexp subtract. 0 over no elements (a max of nothing has no value,
    and none is needed: logsumexp is -inf, softmax empty, as JAX's).

    `finite`: 0 where the max is not finite (logsumexp: shifting by an
    infinite max would give inf - inf = NaN, but a row holding +inf has
    logsumexp +inf, and a row of -inf has -inf, as JAX and scipy). softmax
    and log_softmax shift by the max itself, as JAX's, so a row holding +inf
    or of -inf only is NaN throughout.
    """
    shape = tuple(x.shape) if hasattr(x, "shape") else _np.shape(x)
    n = len(shape)
    axes = range(n) if axis is None else axis
    if all(-n <= a < n for a in axes) and any(shape[a] == 0 for a in axes):
        return 0.0  # (an axis out of range is the max's error)
    m = stop_gradient(_pnp.max(x, axis=axis, keepdims=True))
    if not finite:
        return m
    return _pnp.where((m > -_np.inf) & (m < _np.inf), m, 0.0)


def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """log(sum(exp(x), axis)), computed stably (shifted by the max where it is finite)."""
    axis = _checks.axes("logsumexp", "axis", axis)
    m = _max_shift(x, axis)
    out = _pnp.log(_pnp.sum(_pnp.exp(x - m), axis=axis, keepdims=True)) + m
    if keepdims:
        return out
    if axis is None:
        return _pnp.reshape(out, ())
    return _pnp.squeeze(out, axis)


def softmax(x: Any, axis: Any = -1) -> Any:
    """exp(x) / sum(exp(x), axis), computed stably."""
    axis = _checks.axes("softmax", "axis", axis)
    e = _pnp.exp(x - _max_shift(x, axis, finite=False))
    return e / _pnp.sum(e, axis=axis, keepdims=True)


def log_softmax(x: Any, axis: Any = -1) -> Any:
    """x - logsumexp(x, axis), computed stably."""
    axis = _checks.axes("log_softmax", "axis", axis)
    shifted = x - _max_shift(x, axis, finite=False)
    return shifted - _pnp.log(_pnp.sum(_pnp.exp(shifted), axis=axis, keepdims=True))


def one_hot(x: Any, num_classes: int, dtype: Any = _np.float32, axis: int = -1) -> Any:
    """Integer labels to one-hot vectors along a new axis `axis`, like `jax.nn.one_hot`.

    Labels outside [0, num_classes) give all-zero vectors.
    """
    n = _checks.integer("one_hot", "num_classes", num_classes)
    axis = _checks.index("one_hot", "axis", axis)
    ndim = _np.ndim(x) if not isinstance(x, Tracer) else x.ndim
    a = axis + ndim + 1 if axis < 0 else axis
    if not 0 <= a <= ndim:
        raise ValueError(f"one_hot: axis {axis} is out of range for a result of rank {ndim + 1}")
    classes = _np.arange(n, dtype=_np.int32).reshape([n if d == a else 1 for d in range(ndim + 1)])
    labels = _pnp.expand_dims(x, a)
    return (labels == classes).astype(dtype)


def layer_norm(
    x: Any,
    scale: Optional[Any] = None,
    offset: Optional[Any] = None,
    axis: Any = -1,
    epsilon: float = 1e-5,
) -> Any:
    """Layer normalization: (x - mean) / sqrt(var + epsilon) over `axis`, then * scale + offset.

    Args:
      x: The values.
      scale: Multiplies the normalized values (broadcasting), or None.
      offset: Added after scaling (broadcasting), or None.
      axis: The axis or axes normalized over.
      epsilon: Added to the variance.
    """
    axis = _checks.axes("layer_norm", "axis", axis)
    mean = _pnp.mean(x, axis=axis, keepdims=True)
    centered = x - mean
    var = _pnp.mean(centered * centered, axis=axis, keepdims=True)
    y = centered * _pnp.rsqrt(var + epsilon)
    if scale is not None:
        y = y * scale
    if offset is not None:
        y = y + offset
    return y


def dropout(key: Any, rate: float, x: Any, broadcast_dims: Any = ()) -> Any:
    """Zeroes each element of `x` with probability `rate` and scales the rest by 1 / (1 - rate).

    Haiku's `hk.dropout(rng, rate, x, broadcast_dims)` (JAX itself has none;
    flax's `nn.Dropout` module computes the same): the mask is
    `pw.random.bernoulli(key, 1 - rate, shape)`, as JAX's, and the result
    `where(mask, x / (1 - rate), 0)`, so the expected value is `x` and no
    NaN of a dropped element leaks through. Inside a `pw.pmap`'d function the
    mask is drawn on the device: give each step (and each device, if they
    must differ) its own key, e.g. `pw.random.fold_in(key, pw.axis_index("i"))`.
    Gradients flow to `x` through the kept elements.

    Args:
      key: A `pw.random` key.
      rate: The probability of dropping an element: a Python float in [0, 1)
        (0 returns `x` itself).
      x: The values (numpy or traced).
      broadcast_dims: Dimensions along which the mask is shared (its size 1
        there), e.g. `(0,)` to drop the same features for the whole batch.

    Returns:
      An array of `x`'s shape and dtype (float64 for integer `x`).

    Raises:
      TypeError: If `rate` is not a real number, or `broadcast_dims` not ints.
      ValueError: If `rate` is not in [0, 1), or a broadcast dimension is out of range.
    """
    from pathways import random as _random  # pathways.random imports pathways.numpy too

    rate = _checks.real("dropout", "rate", rate)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout: rate must be in [0, 1), got {rate}")
    dims = _checks.ints("dropout", "broadcast_dims", broadcast_dims)
    if rate == 0.0:
        return x
    shape = list(x.shape if isinstance(x, Tracer) else _np.shape(x))
    for d in dims:
        if not -len(shape) <= d < len(shape):
            raise ValueError(f"dropout: broadcast dimension {d} is out of range for shape "
                             f"{tuple(shape)}")
        shape[d] = 1
    keep_rate = 1.0 - rate
    keep = _random.bernoulli(key, keep_rate, tuple(shape))
    scaled = x / keep_rate
    # A zero of scaled's dtype: a Python 0 would make int32 against a concrete `x`.
    return _pnp.where(keep, scaled, _np.zeros((), scaled.dtype))
