"""Linear algebra: `matmul` (the `@` operator), `dot`, `einsum`.
"""

from __future__ import annotations

import builtins as _builtins
from typing import Any

import numpy as _np
import opt_einsum

from pathways._tracer import Tracer, bind
from pathways.numpy._common import _operand, _trace_of
from pathways.numpy._shapes import reshape, squeeze, transpose


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


def dot(a: Any, b: Any) -> Any:
    """`numpy.dot` for operands of rank <= 2 (the matrix product; scalars multiply)."""
    trace = _trace_of("dot", (a, b))
    if trace is None:
        return _np.dot(a, b)
    a = _operand(trace, a)
    b = _operand(trace, b)
    if a.ndim == 0 or b.ndim == 0:
        return a * b
    if a.ndim > 2 or b.ndim > 2:
        raise ValueError(
            f"dot: operands of rank > 2 are not supported ({a.aval}, {b.aval}); use matmul "
            "or einsum"
        )
    return matmul(a, b)


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


def einsum(subscripts: str, *operands: Any) -> Any:
    """`numpy.einsum` for explicit letters (no '...').

    Covers the usual contractions: matrix products (`ij,jk->ik`), batched ones
    (`bij,bjk->bik`), outer products, traces over shared letters, sums over
    letters missing from the output, transposes (`ij->ji`), and diagonals of
    letters repeated within an operand (`ii->i`, `ii->`, `iij->j`). Without
    '->', the output has the letters appearing once, in alphabetical order.
    Two or more operands are contracted in the order opt_einsum finds
    cheapest for their shapes, each step one batched matmul. The result has the operands' promoted dtype; over bool, as numpy,
    products are logical and and sums logical or.
    """
    trace = _trace_of("einsum", operands)
    if trace is None:
        return _np.einsum(subscripts, *operands)
    spec = subscripts.replace(" ", "")
    if "." in spec:
        raise ValueError(f"einsum: '...' is not supported yet ({subscripts!r})")
    if "->" in spec:
        lhs, out = spec.split("->")
    else:
        lhs = spec
        letters = lhs.replace(",", "")
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    ins = lhs.split(",")
    if len(ins) != len(operands):
        raise ValueError(
            f"einsum: {subscripts!r} names {len(ins)} operands, got {len(operands)}"
        )
    xs = [_operand(trace, x) for x in operands]
    for s, x in zip(ins, xs):
        if len(s) != x.ndim:
            raise ValueError(f"einsum: subscripts {s!r} do not match operand {x.aval}")
        if not s.isalpha() and s:
            raise ValueError(f"einsum: invalid subscripts {s!r}")
    if len(set(out)) != len(out) or any(c not in lhs for c in out):
        raise ValueError(f"einsum: invalid output subscripts {out!r}")
    dtype = _np.result_type(*[x.dtype for x in xs])
    if dtype != _np.bool_:  # bool operands count as 0 and 1 among numbers
        xs = [x.astype(dtype) if x.dtype == _np.bool_ else x for x in xs]
    xs, ins = zip(*[_einsum_diagonal(x, s) for x, s in zip(xs, ins)])
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

