"""Linear algebra: `matmul` (the `@` operator), `dot`, `tensordot`, `inner`, `outer`,
`vdot`, `einsum`.
"""

from __future__ import annotations

import builtins as _builtins
from typing import Any

import numpy as _np
import opt_einsum

from pathways import _checks
from pathways._tracer import Tracer, bind
from pathways.numpy._common import _axis, _operand, _trace_of
from pathways.numpy._shapes import reshape, squeeze, transpose

# Subscripts for the contractions built on einsum, and for '...' in einsum's.
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def matmul(a: Any, b: Any) -> Any:
    """`numpy.matmul` (the `@` operator): batched matrix product, batch dims broadcast.

    1-d operands are promoted to matrices and the added dimension removed
    afterwards, as numpy does; scalars are rejected.
    """
    trace = _trace_of("matmul", (a, b))
    if trace is None:
        return _np.matmul(a, b)
    a = _operand(trace, a)
    b = _operand(trace, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(
            f"matmul: operands must not be scalars, got {a.aval} and {b.aval}; use * instead"
        )
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise ValueError(
            f"matmul: incompatible shapes {a.aval} and {b.aval} (contracting dimension "
            f"{ka} != {kb})"
        )
    a2 = reshape(a, (1, ka)) if a.ndim == 1 else a
    b2 = reshape(b, (kb, 1)) if b.ndim == 1 else b
    out = bind(trace, "matmul", (a2, b2))
    if a.ndim == 1 and b.ndim == 1:
        return reshape(out, ())
    if a.ndim == 1:
        return squeeze(out, -2)
    if b.ndim == 1:
        return squeeze(out, -1)
    return out


def _on_pair(name: str, numpy_fn: Any, doc: str) -> Any:
    """A function of two values: `numpy_fn` outside a trace; inside, the decorated
    function of both as traced values."""

    def wrap(traced: Any) -> Any:
        def fn(a: Any, b: Any) -> Any:
            trace = _trace_of(name, (a, b))
            if trace is None:
                return numpy_fn(a, b)
            return traced(_operand(trace, a), _operand(trace, b))

        fn.__name__ = fn.__qualname__ = name
        fn.__doc__ = doc
        return fn

    return wrap


@_on_pair("dot", _np.dot, """`numpy.dot`: for rank <= 2 the matrix product (1-d operands as numpy,
    scalars multiply); for higher ranks the sum over `a`'s last axis and `b`'s second
    to last (its only one if 1-d): shape `a.shape[:-1] + b.shape[:-2] + b.shape[-1:]`.""")
def dot(a: Tracer, b: Tracer) -> Any:
    if a.ndim == 0 or b.ndim == 0:
        return a * b
    if a.ndim <= 2 and b.ndim <= 2:
        return matmul(a, b)
    return _contract("dot", a, b, [a.ndim - 1], [max(b.ndim - 2, 0)])


def _contract(name: str, a: Tracer, b: Tracer, a_axes: list, b_axes: list) -> Tracer:
    """Sum of products over `a_axes` of `a` paired with `b_axes` of `b` (axes in range,
    distinct); the result has `a`'s other axes, then `b`'s, in order."""
    for i, j in zip(a_axes, b_axes):
        if a.shape[i] != b.shape[j]:
            raise ValueError(
                f"{name}: shape mismatch for sum: axis {i} of {a.aval} has size {a.shape[i]}, "
                f"axis {j} of {b.aval} has {b.shape[j]}"
            )
    letters = _LETTERS[: a.ndim + b.ndim]
    xs = list(letters[: a.ndim])
    ys = list(letters[a.ndim :])
    for i, j in zip(a_axes, b_axes):
        ys[j] = xs[i]
    out = [c for k, c in enumerate(xs) if k not in a_axes] + [c for k, c in enumerate(ys) if k not in b_axes]
    return einsum(f"{''.join(xs)},{''.join(ys)}->{''.join(out)}", a, b)


def _axes_list(name: str, param: str, axes: Any, ndim: int, shape: tuple) -> list:
    return [_axis(name, param, i, ndim, shape) for i in _checks.ints(name, param, axes)]


def tensordot(a: Any, b: Any, axes: Any = 2) -> Any:
    """`numpy.tensordot`: sum of products over `axes`: an int N (the last N of `a`
    with the first N of `b`), or a pair of axis sequences (or ints) to pair up.

    Raises:
      ValueError: For axes out of range, repeated, pairs of two lengths, or paired
        axes of different sizes.
      TypeError: For axes that are not integers.
    """
    trace = _trace_of("tensordot", (a, b))
    if trace is None:
        return _np.tensordot(a, b, axes)
    a = _operand(trace, a)
    b = _operand(trace, b)
    if isinstance(axes, _np.ndarray):
        axes = axes.tolist()
    if isinstance(axes, (tuple, list)):
        if len(axes) != 2:
            raise ValueError(f"tensordot: axes must be an int or a pair of axis sequences, got {axes!r}")
        a_axes = _axes_list("tensordot", "axes", axes[0], a.ndim, a.shape)
        b_axes = _axes_list("tensordot", "axes", axes[1], b.ndim, b.shape)
    else:
        n = _checks.integer("tensordot", "axes", axes)
        if not 0 <= n <= min(a.ndim, b.ndim):
            raise ValueError(
                f"tensordot: axes {n} must be between 0 and the lesser rank of {a.aval} and {b.aval}"
            )
        a_axes = list(range(a.ndim - n, a.ndim))
        b_axes = list(range(n))
    if len(a_axes) != len(b_axes):
        raise ValueError(f"tensordot: axes {axes!r} pair {len(a_axes)} axes of a with {len(b_axes)} of b")
    if len(set(a_axes)) != len(a_axes) or len(set(b_axes)) != len(b_axes):
        raise ValueError(f"tensordot: repeated axis in {axes!r}")
    return _contract("tensordot", a, b, a_axes, b_axes)


@_on_pair("inner", _np.inner, """`numpy.inner`: sum of products over the last axes (scalars
    multiply); shape `a.shape[:-1] + b.shape[:-1]`.""")
def inner(a: Tracer, b: Tracer) -> Any:
    if a.ndim == 0 or b.ndim == 0:
        return a * b
    return _contract("inner", a, b, [a.ndim - 1], [b.ndim - 1])


@_on_pair("outer", _np.outer, """`numpy.outer`: every product of an element of `a` with one of
    `b`, both flattened: shape `(a.size, b.size)`.""")
def outer(a: Tracer, b: Tracer) -> Any:
    return reshape(a, (a.size, 1)) * reshape(b, (1, b.size))


@_on_pair("vdot", _np.vdot, """`numpy.vdot` (real values): the dot product of `a` and `b` flattened.""")
def vdot(a: Tracer, b: Tracer) -> Any:
    if a.size != b.size:
        raise ValueError(f"vdot: operands of {a.size} and {b.size} elements ({a.aval}, {b.aval})")
    return matmul(reshape(a, (a.size,)), reshape(b, (b.size,)))


def _einsum_pair(trace: Any, x: Tracer, xs: str, y: Tracer, ys: str, out: str) -> tuple:
    """Contracts two operands by one batched matmul; `out` lists the letters to keep.

    Returns the result and its letters.
    """
    batch = [c for c in xs if c in ys and c in out]
    contract = [c for c in xs if c in ys and c not in out]
    x_free = [c for c in xs if c not in ys]
    y_free = [c for c in ys if c not in xs]
    size = dict(zip(xs, x.shape))
    size.update(zip(ys, y.shape))  # equal where shared: checked by einsum

    def prod(letters: list) -> int:
        return int(_np.prod([size[c] for c in letters], dtype=_np.int64))

    xt = transpose(x, [xs.index(c) for c in batch + x_free + contract])
    yt = transpose(y, [ys.index(c) for c in batch + contract + y_free])
    xm = reshape(xt, (prod(batch), prod(x_free), prod(contract)))
    ym = reshape(yt, (prod(batch), prod(contract), prod(y_free)))
    r = bind(trace, "matmul", (xm, ym))
    return reshape(r, [size[c] for c in batch + x_free + y_free]), "".join(batch + x_free + y_free)


def _einsum_diagonal(x: Tracer, s: str) -> tuple:
    """Operand `x` with subscripts `s`, reduced to its diagonal over every repeated letter.

    The axes of a letter repeated k times (size n) are moved to the end and
    flattened; element (i, ..., i) is then at i * (1 + n + ... + n**(k-1)),
    so a strided slice takes the diagonal. Returns the result and its
    letters (each once; a repeated letter's axis last).

    Raises:
      ValueError: If the axes of a repeated letter differ in size.
    """
    for c in dict.fromkeys(s):
        at = [i for i, letter in enumerate(s) if letter == c]
        if len(at) < 2:
            continue
        sizes = {x.shape[i] for i in at}
        if len(sizes) > 1:
            raise ValueError(
                f"einsum: letter '{c}' repeats in {s!r} over axes of different sizes "
                f"{sorted(sizes)} (operand {x.aval})"
            )
        n = x.shape[at[0]]
        rest = [i for i in range(len(s)) if i not in at]
        x = reshape(transpose(x, rest + at), [x.shape[i] for i in rest] + [n ** len(at)])
        x = x[..., :: _builtins.sum(n**j for j in range(len(at)))]
        s = "".join(s[i] for i in rest) + c
    return x, s


def _einsum_sum_out(x: Tracer, s: str, keep: Any) -> tuple:
    """Sums `x` (subscripts `s`) over its letters not in `keep`; returns it and its letters.

    Over bool the sum is a logical or, as numpy's einsum, and stays bool.
    """
    drop = tuple(i for i, c in enumerate(s) if c not in keep)
    if not drop:
        return x, s
    total = x.sum(axis=drop)
    if x.dtype == _np.bool_:
        total = total != 0
    return total, "".join(c for c in s if c in keep)


def _einsum_ellipsis(subscripts: str, ins: list, out: str, xs: list) -> tuple:
    """`ins` and `out` with each '...' replaced by letters unused elsewhere, one per
    dimension it stands for (operands' '...' aligned at the right, as numpy
    broadcasts). Dimensions of '...' missing from `out` are summed, as JAX.

    Raises:
      ValueError: For a '.' outside an '...', two in one term, or an operand
        with fewer dimensions than its explicit letters.
    """
    terms = ins + [out]
    if not any("." in t for t in terms):
        return ins, out
    for t in terms:
        if t.count(".") not in (0, 3) or (t.count(".") == 3 and "..." not in t):
            raise ValueError(f"einsum: invalid subscripts {t!r} in {subscripts!r} ('.' only in one '...')")
    ranks = []
    for t, x in zip(ins, xs):
        rank = x.ndim - len(t.replace("...", "")) if "..." in t else 0
        if rank < 0:
            raise ValueError(f"einsum: subscripts {t!r} do not match operand {x.aval}")
        ranks.append(rank)
    fresh = [c for c in _LETTERS if c not in "".join(terms)]
    dots = fresh[: max(ranks)]
    if len(dots) < max(ranks):
        raise ValueError(f"einsum: too many dimensions for '...' in {subscripts!r}")
    ins = [t.replace("...", "".join(dots[len(dots) - r :])) for t, r in zip(ins, ranks)]
    return ins, out.replace("...", "".join(dots))


def _einsum_broadcast(xs: list, ins: list) -> tuple:
    """Size-1 dimensions against a larger one of the same letter elsewhere (numpy's
    broadcasting) summed out of their operand: the letter then comes from the others."""
    sizes: dict = {}
    for x, s in zip(xs, ins):
        for c, d in zip(s, x.shape):
            sizes.setdefault(c, set()).add(d)
    for k, (x, s) in enumerate(zip(xs, ins)):
        ones = [i for i, (c, d) in enumerate(zip(s, x.shape)) if d == 1 and sizes[c] - {1}]
        if ones:
            xs[k] = reshape(x, [d for i, d in enumerate(x.shape) if i not in ones])
            ins[k] = "".join(c for i, c in enumerate(s) if i not in ones)
    return xs, ins


def einsum(subscripts: str, *operands: Any) -> Any:
    """`numpy.einsum`.

    Covers the usual contractions: matrix products (`ij,jk->ik`), batched ones
    (`bij,bjk->bik`, `...ij,...jk->...ik`), outer products, traces over shared
    letters, sums over letters missing from the output, transposes (`ij->ji`),
    and diagonals of letters repeated within an operand (`ii->i`, `ii->`,
    `iij->j`). Without '->', the output has the dimensions of '...', then the
    letters appearing once, in alphabetical order. Dimensions broadcast as
    numpy's (size 1 against any size; those of '...' aligned at the right);
    those of '...' missing from the output are summed, as JAX. Two or more
    operands are contracted in the order opt_einsum finds cheapest for their
    shapes, each step one batched matmul. The result has the operands'
    promoted dtype; over bool, as numpy, products are logical and and sums
    logical or.
    """
    trace = _trace_of("einsum", operands)
    if trace is None:
        return _np.einsum(subscripts, *operands)
    spec = subscripts.replace(" ", "")
    lhs, arrow, out = spec.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(operands):
        raise ValueError(
            f"einsum: {subscripts!r} names {len(ins)} operands, got {len(operands)}"
        )
    xs = [_operand(trace, x) for x in operands]
    if not arrow:
        # The letters appearing once, in alphabetical order (after the
        # dimensions of '...', if any).
        letters = lhs.replace(",", "").replace(".", "")
        out = ("..." if "." in lhs else "") + "".join(
            sorted(c for c in set(letters) if letters.count(c) == 1))
    ins, out = _einsum_ellipsis(subscripts, ins, out, xs)
    for s, x in zip(ins, xs):
        if len(s) != x.ndim:
            raise ValueError(f"einsum: subscripts {s!r} do not match operand {x.aval}")
        if not s.isalpha() and s:
            raise ValueError(f"einsum: invalid subscripts {s!r}")
    if len(set(out)) != len(out) or any(c not in "".join(ins) for c in out):
        raise ValueError(f"einsum: invalid output subscripts {out!r}")
    dtype = _np.result_type(*[x.dtype for x in xs])
    if dtype != _np.bool_:  # bool operands count as 0 and 1 among numbers
        xs = [x.astype(dtype) if x.dtype == _np.bool_ else x for x in xs]
    xs, ins = zip(*[_einsum_diagonal(x, s) for x, s in zip(xs, ins)])
    xs, ins = _einsum_broadcast(list(xs), list(ins))
    size: dict = {}
    for x, s in zip(xs, ins):
        for c, d in zip(s, x.shape):
            if size.setdefault(c, d) != d:
                raise ValueError(
                    f"einsum: dimension '{c}' has size {size[c]} in one operand and {d} in another"
                )

    # opt_einsum picks the order of the contractions from the shapes (which
    # pair first decides the sizes of the intermediates: a chain of matrix
    # products, or a small operand met late, costs orders of magnitude more
    # left to right). Each step sums out the letters no one else needs, then
    # contracts its operands pairwise.
    ops = list(zip(xs, ins))
    if len(ops) > 1:
        path, _ = opt_einsum.contract_path(
            ",".join(ins) + "->" + out, *[x.shape for x in xs], shapes=True, optimize="auto"
        )
    else:
        path = [(0,)]
    for step in path:
        picked = [ops[i] for i in step]
        for i in sorted(step, reverse=True):
            ops.pop(i)
        rest = set(out).union(*[set(s) for _, s in ops])
        cur, cur_s = picked[0]
        for k in range(1, len(picked)):
            keep = rest.union(*[set(s) for _, s in picked[k + 1 :]])
            cur, cur_s = _einsum_sum_out(cur, cur_s, keep | set(picked[k][1]))
            y, ys = _einsum_sum_out(picked[k][0], picked[k][1], keep | set(cur_s))
            cur, cur_s = _einsum_pair(trace, cur, cur_s, y, ys, "".join(sorted(keep)))
        ops.append(_einsum_sum_out(cur, cur_s, rest))
    cur, cur_s = ops[0]
    return transpose(cur, [cur_s.index(c) for c in out]) if cur_s != out else cur

