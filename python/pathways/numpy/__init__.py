"""numpy-style functions on the values of a function traced by `pw.pmap`.

Usage:
  >>> import pathways.numpy as pnp
  >>> f = pw.pmap(lambda x: pnp.where(x > 0, pnp.sqrt(x), 0.0), devices=tpus)

Inside a pmap trace, a call with at least one traced value among its array
arguments records an op of the compiled function. Shapes broadcast and dtypes
promote as in numpy (bool < int32, uint32 < float32 < float64; an integer
with float32 gives float64), but int32 with uint32 gives int32 as in JAX;
`bfloat16` (ml_dtypes') sits where JAX puts it, above bool and the integers
and below float32, and computes in float32, each result rounded once; the
transcendental functions compute integers in float64 and bool in
float32; Python scalars are weakly typed as for the `Tracer`
operators. Called with no traced value (e.g. on numpy arrays outside a
trace), each function simply calls its numpy namesake. Conversely numpy's own
functions, called on a traced value (`np.sum(x)`, `np.exp(x)`), call their
namesakes here, and raise TracerError for those this module lacks.

The functions live in submodules by job: `_elementwise` (ufuncs, `where` and
what is built from them, `erf`), `_reductions`, `_shapes`, `_indexing` (`take`,
`take_along_axis`, and indexing of traced values), `_at` (`x.at[index]`'s
updates), `_sorting` (`cumsum`, `cumprod`, `sort`, `argsort`), `_linalg`
(`matmul`, `dot`, `tensordot`, `inner`, `outer`, `vdot`, `einsum`),
`_rearrange` (`split`, `array_split`, `hstack`, `vstack`, `tile`, `repeat`,
`roll`, `pad`); `_protocol` sends numpy's own functions here.
"""

from __future__ import annotations

import ml_dtypes as _ml_dtypes
import numpy as _np

from pathways.numpy._elementwise import (  # noqa: A004 (numpy's names)
    around,
    ceil,
    divmod,
    fmod,
    expm1,
    floor,
    floor_divide,
    isfinite,
    isinf,
    isnan,
    log10,
    log1p,
    log2,
    logaddexp,
    mod,
    reciprocal,
    remainder,
    rint,
    round,
    abs,
    absolute,
    add,
    bitwise_and,
    bitwise_not,
    bitwise_or,
    bitwise_xor,
    clip,
    cos,
    divide,
    erf,
    erfc,
    equal,
    exp,
    greater,
    greater_equal,
    invert,
    left_shift,
    less,
    less_equal,
    log,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    maximum,
    minimum,
    multiply,
    negative,
    not_equal,
    ones_like,
    full_like,
    empty_like,
    power,
    right_shift,
    rsqrt,
    sign,
    sin,
    sqrt,
    square,
    subtract,
    tanh,
    true_divide,
    where,
    zeros_like,
)
from pathways.numpy._reductions import (  # noqa: A004 (numpy's names)
    all,
    any,
    argmax,
    argmin,
    prod,
    max,
    mean,
    min,
    std,
    sum,
    var,
)
from pathways.numpy._shapes import (
    broadcast_to,
    concatenate,
    expand_dims,
    flip,
    moveaxis,
    ravel,
    reshape,
    squeeze,
    stack,
    swapaxes,
    transpose,
)
from pathways.numpy._indexing import _getitem, take, take_along_axis  # noqa: F401 (Tracer.__getitem__)
from pathways.numpy._sorting import argsort, cumprod, cumsum, sort
from pathways.numpy._linalg import dot, einsum, inner, matmul, outer, tensordot, vdot
from pathways.numpy._rearrange import array_split, hstack, pad, repeat, roll, split, tile, vstack
from pathways.numpy._creation import arange, eye, full, linspace, ones, tril, triu, zeros
# Tracer.__array_function__ and __array_ufunc__.
from pathways.numpy._protocol import _numpy_function, _numpy_ufunc  # noqa: F401

__all__ = [
    "zeros",
    "ones",
    "full",
    "arange",
    "linspace",
    "eye",
    "tril",
    "triu",
    "float32",
    "float64",
    "int32",
    "uint32",
    "bool_",
    "bfloat16",
    "exp",
    "log",
    "tanh",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "erf",
    "erfc",
    "abs",
    "absolute",
    "negative",
    "add",
    "subtract",
    "multiply",
    "divide",
    "true_divide",
    "power",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bitwise_not",
    "invert",
    "left_shift",
    "right_shift",
    "maximum",
    "minimum",
    "where",
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "logical_and",
    "logical_or",
    "logical_xor",
    "logical_not",
    "sum",
    "mean",
    "max",
    "min",
    "argmax",
    "argmin",
    "prod",
    "any",
    "all",
    "isnan",
    "isinf",
    "isfinite",
    "floor",
    "ceil",
    "round",
    "around",
    "rint",
    "floor_divide",
    "fmod",
    "divmod",
    "remainder",
    "mod",
    "log1p",
    "expm1",
    "log2",
    "log10",
    "reciprocal",
    "reshape",
    "ravel",
    "transpose",
    "swapaxes",
    "moveaxis",
    "broadcast_to",
    "expand_dims",
    "squeeze",
    "concatenate",
    "stack",
    "flip",
    "take",
    "take_along_axis",
    "cumsum",
    "cumprod",
    "sort",
    "argsort",
    "matmul",
    "dot",
    "tensordot",
    "inner",
    "outer",
    "vdot",
    "einsum",
    "split",
    "array_split",
    "hstack",
    "vstack",
    "tile",
    "repeat",
    "roll",
    "pad",
    "logaddexp",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "square",
    "sign",
    "clip",
    "var",
    "std",
]

float32 = _np.float32
float64 = _np.float64
int32 = _np.int32
uint32 = _np.uint32
bool_ = _np.bool_
bfloat16 = _ml_dtypes.bfloat16  # jax.numpy.bfloat16 is the same type
