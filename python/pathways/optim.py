"""Optimizers as gradient transformations on pytrees, in the shape of optax.

A `GradientTransformation` is a pair of pure functions:

* `init(params) -> state`, the optimizer state for a pytree of parameters;
* `update(updates, state, params=None) -> (updates, new_state)`, which turns
  gradients into parameter updates (already scaled by minus the learning
  rate, as optax's), that `apply_updates(params, updates)` adds.

Usage, as with optax:

    >>> import pathways.optim as optim
    >>> tx = optim.chain(optim.clip_by_global_norm(1.0), optim.adam(1e-3))
    >>> state = tx.init(params)
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optim.apply_updates(params, updates)

The functions compute with `pathways.numpy`, so they run both outside any
trace (on numpy arrays and `ShardedBuffer`s, giving numpy arrays) and inside
a `pw.pmap`'d function, where the leaves are traced values: there a train
step takes the state as an argument and returns the new one, and the state's
dtypes stay those of the parameters (the step count is int32), so the step is
traced once. In a `@pw.program` the state flows between such pmap'd steps.

Transformations: `identity`, `chain`, `scale`, `scale_by_learning_rate`,
`scale_by_schedule`, `trace` (momentum), `scale_by_adam`,
`add_decayed_weights`, `clip_by_global_norm`, `masked`; optimizers: `sgd`,
`adam`, `adamw`. Schedules (callables of the int32 step count):
`constant_schedule`, `polynomial_schedule`, `linear_schedule`,
`piecewise_constant_schedule`, `exponential_decay`, `cosine_decay_schedule`,
`warmup_cosine_decay_schedule`, `join_schedules`. Every formula is optax's
(bias correction, where eps goes, the Nesterov form, adamw's decoupled decay,
the clipping rule). Hyperparameters are Python floats, so they take the
dtype of the values they multiply; a schedule's value is cast to each leaf's
dtype, as optax does.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

import numpy as np

from pathways import _core
from pathways import numpy as pnp
from pathways._pytree import tree_flatten, tree_unflatten
from pathways._trace_state import _BFLOAT16 as _BF16
from pathways._trace_state import TracerError, _TracerBase
from pathways._tracer import Tracer

__all__ = [
    "GradientTransformation",
    "Schedule",
    "ScalarOrSchedule",
    "EmptyState",
    "TraceState",
    "ScaleByAdamState",
    "ScaleByScheduleState",
    "MaskedState",
    "MaskedNode",
    "ScaleState",
    "AddDecayedWeightsState",
    "ClipByGlobalNormState",
    "apply_updates",
    "global_norm",
    "identity",
    "chain",
    "scale",
    "scale_by_schedule",
    "scale_by_learning_rate",
    "trace",
    "scale_by_adam",
    "add_decayed_weights",
    "clip_by_global_norm",
    "masked",
    "sgd",
    "adam",
    "adamw",
    "constant_schedule",
    "polynomial_schedule",
    "linear_schedule",
    "piecewise_constant_schedule",
    "exponential_decay",
    "cosine_decay_schedule",
    "warmup_cosine_decay_schedule",
    "join_schedules",
]

Schedule = Callable[[Any], Any]
ScalarOrSchedule = Union[float, Schedule]


class GradientTransformation(NamedTuple):
    """A pair `(init, update)` of pure functions, as optax's.

    Attributes:
      init: `init(params) -> state`.
      update: `update(updates, state, params=None) -> (updates, new_state)`.
    """

    init: Callable[[Any], Any]
    update: Callable[..., tuple]


class EmptyState(NamedTuple):
    """The state of a transformation that keeps none (a pytree node without leaves)."""


ScaleState = EmptyState
AddDecayedWeightsState = EmptyState
ClipByGlobalNormState = EmptyState


class TraceState(NamedTuple):
    """`trace`'s state: the momentum, a pytree like the parameters."""

    trace: Any


class ScaleByAdamState(NamedTuple):
    """`scale_by_adam`'s state: the step count (int32 scalar) and both moments."""

    count: Any
    mu: Any
    nu: Any


class ScaleByScheduleState(NamedTuple):
    """`scale_by_schedule`'s state: the step count (int32 scalar) the schedule reads."""

    count: Any


class MaskedState(NamedTuple):
    """`masked`'s state: the inner transformation's state on the masked tree."""

    inner_state: Any


class MaskedNode(NamedTuple):
    """Stands for a leaf that a mask leaves out: a node without leaves, so
    that the inner transformation neither sees nor keeps state for it."""


# --- Leaves, structures and scalars --------------------------------------------


def _describe(x: Any) -> str:
    text = repr(x)
    return (text if len(text) <= 60 else text[:57] + "...") + f" ({type(x).__name__})"


def _array(name: str, what: str, i: int, x: Any, floats: bool = True) -> Any:
    """Leaf `i` of `what` as a traced value or a numpy array (a ShardedBuffer is fetched)."""
    if isinstance(x, Tracer):
        dtype = x.dtype
    elif isinstance(x, _TracerBase):
        raise TracerError(
            f"{name}: {what} leaf {i} is a traced program value ({x.aval}); optimizers "
            "compute inside pw.pmap'd functions: update the state in one and pass it in and out"
        )
    else:
        if not isinstance(x, np.ndarray):
            if not isinstance(x, (_core.ShardedBuffer, numbers.Number, np.generic)):
                raise TypeError(f"{name}: {what} leaf {i} is {_describe(x)}, not an array")
            x = np.asarray(x)
        dtype = x.dtype
    if floats and dtype.kind != "f" and dtype != _BF16:
        raise TypeError(
            f"{name}: {what} leaf {i} has dtype {dtype}; optimizers update float32, float64 "
            "and bfloat16 values"
        )
    return x


def _leaves(name: str, what: str, tree: Any) -> tuple:
    """The leaves of `tree` (arrays or traced values, float dtypes) and its structure."""
    leaves, treedef = tree_flatten(tree)
    return [_array(name, what, i, x) for i, x in enumerate(leaves)], treedef


def _check_same(name: str, what: str, treedef: Any, other_what: str, other_def: Any) -> None:
    if treedef != other_def:
        raise ValueError(
            f"{name}: {what} has structure {treedef} but {other_what} has structure "
            f"{other_def}; they must match (a state comes from init of parameters with the "
            "structure of the updates)"
        )


def _state_of(name: str, state: Any, cls: type) -> Any:
    if not isinstance(state, cls):
        raise TypeError(
            f"{name}: state must be the {cls.__name__} that {name}'s init returns, got "
            f"{_describe(state)}"
        )
    return state


def _real(name: str, param: str, value: Any, what: str = "a float") -> float:
    """A hyperparameter as a Python float, so that it takes the dtype of what it multiplies."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if not ok and isinstance(value, np.ndarray):
        ok = value.shape == () and value.dtype.kind in "iuf"
    if not ok:
        raise TypeError(f"{name}: {param} must be {what}, got {_describe(value)}")
    return float(value)


def _learning_rate(name: str, learning_rate: Any) -> Any:
    """A learning rate: a schedule, a traced scalar (an argument of the step), or a float."""
    if callable(learning_rate):
        return learning_rate
    if isinstance(learning_rate, Tracer):
        if learning_rate.shape != ():
            raise ValueError(
                f"{name}: learning_rate must be a scalar, got a traced {learning_rate.aval}"
            )
        return learning_rate
    return _real(name, "learning_rate", learning_rate,
                 "a float or a schedule (a callable of the step count)")


def _astype(x: Any, dtype: np.dtype) -> Any:
    """`x` in `dtype`: a traced value is converted, a Python number stays weakly typed."""
    if isinstance(x, Tracer):
        return x if x.dtype == dtype else x.astype(dtype)
    if type(x) is int or type(x) is float:  # not np.float64, a float subclass that is not weak
        return x
    return np.asarray(x, dtype)


def _scalar_value(name: str, value: Any) -> Any:
    """A schedule's value, checked to be a scalar."""
    shape = getattr(value, "shape", None)
    if shape is None:
        if isinstance(value, _TracerBase) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name}: the schedule returned {_describe(value)}, not a number")
        return value
    if tuple(shape) != ():
        raise ValueError(f"{name}: the schedule returned a value of shape {tuple(shape)}, not a scalar")
    return value


_INT32_MAX = int(np.iinfo(np.int32).max)


def _count(name: str, count: Any) -> Any:
    """A state's step count as an int32 scalar (traced, or a numpy array)."""
    if isinstance(count, Tracer):
        if count.dtype != np.int32 or count.shape != ():
            raise TypeError(f"{name}: state.count must be an int32 scalar, got {count.aval}")
        return count
    if isinstance(count, _TracerBase):
        raise TracerError(
            f"{name}: state.count is a traced program value ({count.aval}); optimizers "
            "compute inside pw.pmap'd functions"
        )
    c = np.asarray(count)
    if c.dtype.kind not in "iu":
        raise TypeError(f"{name}: state.count must be an int32 scalar, got dtype {c.dtype}")
    if c.shape != ():
        raise ValueError(
            f"{name}: state.count must be a scalar, got shape {c.shape}: a state stacked over "
            "devices (a pmap's output) is updated inside the pmap'd function, or one device's "
            "slice of it outside"
        )
    return c.astype(np.int32)


def _increment(count: Any) -> Any:
    # Saturates at the int32 maximum (optax's safe_int32_increment) instead of
    # wrapping to a negative count; the minimum first so that numpy never overflows.
    inc = pnp.minimum(count, _INT32_MAX - 1) + 1
    return inc if isinstance(inc, Tracer) else np.asarray(inc, np.int32)


def _zeros_count() -> Any:
    # Inside a pmap trace a traced int32 scalar, else a numpy one.
    return pnp.zeros((), np.int32)


# --- Transformations -------------------------------------------------------------


def apply_updates(params: Any, updates: Any) -> Any:
    """Adds `updates` to `params`, leaf by leaf, keeping each parameter's dtype.

    Args:
      params: A pytree of float arrays (or traced values).
      updates: A pytree of the same structure, e.g. from a transformation's `update`.

    Returns:
      The pytree `params + updates`, each leaf in its parameter's dtype.

    Raises:
      ValueError: If the structures differ.
      TypeError: If a leaf is not a float array.
    """
    p, p_def = _leaves("apply_updates", "params", params)
    u, u_def = _leaves("apply_updates", "updates", updates)
    _check_same("apply_updates", "params", p_def, "updates", u_def)
    return tree_unflatten(p_def, [_astype(x + y, x.dtype) for x, y in zip(p, u)])


def _global_norm(leaves: list) -> Any:
    total = None
    for x in leaves:
        s = pnp.sum(x * x)
        total = s if total is None else total + s
    return pnp.sqrt(total)


def global_norm(updates: Any) -> Any:
    """The L2 norm of all the leaves of `updates` together, as `optax.global_norm`.

    Args:
      updates: A pytree of float arrays (or traced values).

    Returns:
      A scalar in the leaves' promoted dtype (0.0 for a tree without leaves).

    Raises:
      TypeError: If a leaf is not a float array.
    """
    leaves, _ = _leaves("global_norm", "updates", updates)
    return _global_norm(leaves) if leaves else np.sqrt(0.0)


def identity() -> GradientTransformation:
    """The transformation that leaves updates unchanged (state: `EmptyState()`)."""

    def init(params: Any) -> EmptyState:
        del params
        return EmptyState()

    def update(updates: Any, state: Any, params: Any = None) -> tuple:
        del params
        return updates, state

    return GradientTransformation(init, update)


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Applies `transforms` one after the other, as `optax.chain`.

    Args:
      *transforms: `GradientTransformation`s (or pairs of `init`, `update`).

    Returns:
      A transformation whose state is the tuple of their states.

    Raises:
      TypeError: If an argument is not a pair of callables.
    """
    for i, t in enumerate(transforms):
        if not (isinstance(t, tuple) and len(t) == 2 and callable(t[0]) and callable(t[1])):
            raise TypeError(
                f"chain: argument {i} must be a GradientTransformation (init, update), got "
                f"{_describe(t)}"
            )
    transforms = tuple(GradientTransformation(*t) for t in transforms)

    def init(params: Any) -> tuple:
        return tuple(t.init(params) for t in transforms)

    def update(updates: Any, state: Any, params: Any = None) -> tuple:
        if type(state) is not tuple or len(state) != len(transforms):
            raise ValueError(
                f"chain: state must be the tuple of {len(transforms)} states that chain's init "
                f"returns (one per transformation), got {_describe(state)}"
            )
        new_state = []
        for t, s in zip(transforms, state):
            updates, s = t.update(updates, s, params)
            new_state.append(s)
        return updates, tuple(new_state)

    return GradientTransformation(init, update)


def _stateless(name: str, fn: Callable[[list, Any], list], needs_params: bool = False
               ) -> GradientTransformation:
    """A transformation with an `EmptyState` that maps the update leaves with `fn(leaves, params)`."""

    def init(params: Any) -> EmptyState:
        del params
        return EmptyState()

    def update(updates: Any, state: Any, params: Any = None) -> tuple:
        _state_of(name, state, EmptyState)
        u, u_def = _leaves(name, "updates", updates)
        p = None
        if needs_params:
            if params is None:
                raise ValueError(f"{name} needs the parameters: call update(updates, state, params)")
            p, p_def = _leaves(name, "params", params)
            _check_same(name, "updates", u_def, "params", p_def)
        return tree_unflatten(u_def, fn(u, p)), state

    return GradientTransformation(init, update)


def scale(step_size: Any) -> GradientTransformation:
    """Multiplies the updates by `step_size`, as `optax.scale`.

    Args:
      step_size: A float (or a traced scalar, e.g. an argument of the step).

    Returns:
      A transformation with state `EmptyState()`.

    Raises:
      TypeError: If `step_size` is not a number.
    """
    if not isinstance(step_size, Tracer):
        step_size = _real("scale", "step_size", step_size)
    return _stateless("scale", lambda u, _: [_astype(step_size, g.dtype) * g for g in u])


def scale_by_schedule(step_size_fn: Schedule) -> GradientTransformation:
    """Multiplies the updates by `step_size_fn(count)`, as `optax.scale_by_schedule`.

    The schedule reads the count of updates done before this one (0 first);
    its value is cast to each leaf's dtype.

    Args:
      step_size_fn: A schedule: a function of the int32 step count.

    Returns:
      A transformation with state `ScaleByScheduleState(count)`.

    Raises:
      TypeError: If `step_size_fn` is not callable.
    """
    return _scale_by_schedule("scale_by_schedule", step_size_fn)


def _scale_by_schedule(name: str, step_size_fn: Schedule) -> GradientTransformation:
    if not callable(step_size_fn):
        raise TypeError(f"{name}: step_size_fn must be callable, got {_describe(step_size_fn)}")

    def init(params: Any) -> ScaleByScheduleState:
        del params
        return ScaleByScheduleState(count=_zeros_count())

    def update(updates: Any, state: Any, params: Any = None) -> tuple:
        del params
        st = _state_of(name, state, ScaleByScheduleState)
        count = _count(name, st.count)
        u, u_def = _leaves(name, "updates", updates)
        step_size = _scalar_value(name, step_size_fn(count))
        out = [_astype(step_size, g.dtype) * g for g in u]
        return tree_unflatten(u_def, out), ScaleByScheduleState(count=_increment(count))

    return GradientTransformation(init, update)


def scale_by_learning_rate(learning_rate: ScalarOrSchedule, *, flip_sign: bool = True
                           ) -> GradientTransformation:
    """Multiplies the updates by `-learning_rate` (or `learning_rate`), as optax's.

    Args:
      learning_rate: A float, or a schedule (a callable of the step count).
      flip_sign: Scale by minus the learning rate (descent), the default.

    Returns:
      `scale` for a float, `scale_by_schedule` for a schedule.

    Raises:
      TypeError: If `learning_rate` is neither a number nor callable.
    """
    return _by_learning_rate("scale_by_learning_rate", learning_rate, flip_sign)


def _by_learning_rate(name: str, learning_rate: Any, flip_sign: bool = True
                      ) -> GradientTransformation:
    learning_rate = _learning_rate(name, learning_rate)
    m = -1 if flip_sign else 1
    if callable(learning_rate):
        return _scale_by_schedule(name, lambda count: m * learning_rate(count))
    return scale(m * learning_rate)


def trace(decay: float, nesterov: bool = False) -> GradientTransformation:
    """Momentum: a trace of past updates, as `optax.trace`.

    `trace = g + decay * trace`; the update is the new trace, or with
    Nesterov `g + decay * new_trace`.

    Args:
      decay: The decay of the trace (the momentum, e.g. 0.9).
      nesterov: Use Nesterov's form.

    Returns:
      A transformation with state `TraceState(trace)`.

    Raises:
      TypeError: If `decay` is not a number.
    """
    decay = _real("trace", "decay", decay)

    def init(params: Any) -> TraceState:
        p, p_def = _leaves("trace", "params", params)
        return TraceState(trace=tree_unflatten(p_def, [pnp.zeros_like(x) for x in p]))

    def update(updates: Any, state: Any, params: Any = None) -> tuple:
        del params
        st = _state_of("trace", state, TraceState)
        g, g_def = _leaves("trace", "updates", updates)
        t, t_def = _leaves("trace", "state.trace", st.trace)
        _check_same("trace", "updates", g_def, "state.trace", t_def)
        new_trace = [x + decay * y for x, y in zip(g, t)]
        out = [x + decay * y for x, y in zip(g, new_trace)] if nesterov else new_trace
        return tree_unflatten(g_def, out), TraceState(trace=tree_unflatten(g_def, new_trace))

    return GradientTransformation(init, update)


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0
                  ) -> GradientTransformation:
    """Rescales updates by Adam's rule, as `optax.scale_by_adam`.

    With `t` the count of updates including this one:
    `mu = (1 - b1) * g + b1 * mu`, `nu = (1 - b2) * g**2 + b2 * nu`, and the
    update is `mu_hat / (sqrt(nu_hat + eps_root) + eps)` with
    `mu_hat = mu / (1 - b1**t)`, `nu_hat = nu / (1 - b2**t)` (the bias
    corrections computed in each leaf's dtype).

    Args:
      b1: The decay of the first moment.
      b2: The decay of the second moment.
      eps: Added to the denominator, outside the square root.
      eps_root: Added inside the square root.

    Returns:
      A transformation with state `ScaleByAdamState(count, mu, nu)`.

    Raises:
      TypeError: If a hyperparameter is not a number.
    """
    name = "scale_by_adam"
    b1, b2 = _real(name, "b1", b1), _real(name, "b2", b2)
    eps, eps_root = _real(name, "eps", eps), _real(name, "eps_root", eps_root)

    def init(params: Any) -> ScaleByAdamState:
        p, p_def = _leaves(name, "params", params)
        mu = tree_unflatten(p_def, [pnp.zeros_like(x) for x in p])
        nu = tree_unflatten(p_def, [pnp.zeros_like(x) for x in p])
        return ScaleByAdamState(count=_zeros_count(), mu=mu, nu=nu)

    def update(updates: Any, state: Any, params: Any = None) -> tuple:
        del params
        st = _state_of(name, state, ScaleByAdamState)
        g, g_def = _leaves(name, "updates", updates)
        mu, mu_def = _leaves(name, "state.mu", st.mu)
        nu, nu_def = _leaves(name, "state.nu", st.nu)
        _check_same(name, "updates", g_def, "state.mu", mu_def)
        _check_same(name, "updates", g_def, "state.nu", nu_def)
        count = _increment(_count(name, st.count))
        mu = [(1 - b1) * x + b1 * m for x, m in zip(g, mu)]
        nu = [(1 - b2) * (x * x) + b2 * v for x, v in zip(g, nu)]
        corrections: dict = {}  # one pair per dtype, not per leaf

        def correction(dtype: np.dtype) -> tuple:
            # bfloat16 moments take corrections computed in float32 and cast, as
            # optax's (1 - 0.999 ** t in bfloat16 would be 0: 0.999 rounds to 1).
            if dtype not in corrections:
                t = _astype(count, np.dtype(np.float32) if dtype == _BF16 else dtype)
                corrections[dtype] = (_astype(1 - b1 ** t, dtype), _astype(1 - b2 ** t, dtype))
            return corrections[dtype]

        out = []
        for m, v in zip(mu, nu):
            c1, c2 = correction(m.dtype)
            v_hat = v / c2
            # Adding a zero eps_root changes no value (sqrt(-0) + eps is eps).
            if eps_root != 0.0:
                v_hat = v_hat + eps_root
            out.append((m / c1) / (pnp.sqrt(v_hat) + eps))
        new_state = ScaleByAdamState(
            count=count, mu=tree_unflatten(g_def, mu), nu=tree_unflatten(g_def, nu))
        return tree_unflatten(g_def, out), new_state

    return GradientTransformation(init, update)


def _mask_flags(name: str, mask_tree: Any, treedef: Any, what: str) -> list:
    flags, mask_def = tree_flatten(mask_tree)
    if mask_def != treedef:
        raise ValueError(
            f"{name}: mask has structure {mask_def} but {what} has structure {treedef}; the "
            "mask must be a pytree of bools with the parameters' structure"
        )
    for i, f in enumerate(flags):
        if not isinstance(f, (bool, np.bool_)):
            raise TypeError(
                f"{name}: mask leaf {i} must be a bool (True: transform the leaf), got "
                f"{_describe(f)}"
            )
    return [bool(f) for f in flags]


def masked(inner: GradientTransformation, mask: Any) -> GradientTransformation:
    """Applies `inner` to the leaves that `mask` selects, as `optax.masked`.

    The other leaves' updates pass through unchanged, and `inner` keeps no
    state for them.

    Args:
      inner: The transformation to apply.
      mask: A pytree of bools with the parameters' structure (True: apply),
        or a function of the parameters (of the updates, in `update`) that
        returns one.

    Returns:
      A transformation with state `MaskedState(inner_state)`.

    Raises:
      TypeError: If `inner` is not a transformation.
    """
    if not (isinstance(inner, tuple) and len(inner) == 2 and callable(inner[0])
            and callable(inner[1])):
        raise TypeError(f"masked: inner must be a GradientTransformation, got {_describe(inner)}")
    inner = GradientTransformation(*inner)

    def apply_mask(tree: Any, mask_tree: Any, what: str) -> tuple:
        leaves, treedef = tree_flatten(tree)
        flags = _mask_flags("masked", mask_tree, treedef, what)
        kept = [x if f else MaskedNode() for x, f in zip(leaves, flags)]
        return tree_unflatten(treedef, kept), flags

    def init(params: Any) -> MaskedState:
        mask_tree = mask(params) if callable(mask) else mask
        return MaskedState(inner_state=inner.init(apply_mask(params, mask_tree, "params")[0]))

    def update(updates: Any, state: Any, params: Any = None) -> tuple:
        st = _state_of("masked", state, MaskedState)
        mask_tree = mask(updates) if callable(mask) else mask
        masked_updates, flags = apply_mask(updates, mask_tree, "updates")
        masked_params = None if params is None else apply_mask(params, mask_tree, "params")[0]
        new_updates, inner_state = inner.update(masked_updates, st.inner_state, masked_params)
        new_leaves = iter(tree_flatten(new_updates)[0])
        leaves, treedef = tree_flatten(updates)
        out = [next(new_leaves) if f else x for x, f in zip(leaves, flags)]
        return tree_unflatten(treedef, out), MaskedState(inner_state=inner_state)

    return GradientTransformation(init, update)


def add_decayed_weights(weight_decay: float = 0.0, mask: Any = None) -> GradientTransformation:
    """Adds `weight_decay * params` to the updates, as `optax.add_decayed_weights`.

    Args:
      weight_decay: The decay rate.
      mask: None (every leaf), or as for `masked`: a pytree of bools with the
        parameters' structure, or a function of the parameters returning one.

    Returns:
      A transformation with state `EmptyState()` (`MaskedState(EmptyState())`
      with a mask). Its `update` needs `params`.

    Raises:
      TypeError: If `weight_decay` is not a number.
    """
    weight_decay = _real("add_decayed_weights", "weight_decay", weight_decay)
    t = _stateless("add_decayed_weights",
                   lambda u, p: [g + weight_decay * x for g, x in zip(u, p)], needs_params=True)
    return t if mask is None else masked(t, mask)


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Scales the updates so that their global norm is at most `max_norm`, as optax's.

    With `norm = global_norm(updates)`, each leaf `t` stays `t` when
    `norm < max_norm` and becomes `(t / norm) * max_norm` otherwise.

    Args:
      max_norm: The largest global norm let through.

    Returns:
      A transformation with state `EmptyState()`.

    Raises:
      TypeError: If `max_norm` is not a number.
    """
    max_norm = _real("clip_by_global_norm", "max_norm", max_norm)

    def clip(leaves: list, _: Any) -> list:
        if not leaves:
            return leaves
        norm = _global_norm(leaves)
        trigger = norm < max_norm
        # The kept branch divides by 1, not by a norm that may be 0: no 0/0
        # (numpy warns of it) in the values `where` drops.
        divisor = pnp.where(trigger, 1, norm)
        return [pnp.where(trigger, t, (t / _astype(divisor, t.dtype)) * max_norm) for t in leaves]

    return _stateless("clip_by_global_norm", clip)


def sgd(learning_rate: ScalarOrSchedule, momentum: Optional[float] = None,
        nesterov: bool = False) -> GradientTransformation:
    """Stochastic gradient descent, with optional momentum, as `optax.sgd`.

    `chain(trace(momentum, nesterov) or identity(), scale_by_learning_rate(learning_rate))`.

    Args:
      learning_rate: A float, or a schedule (a callable of the step count).
      momentum: None (plain SGD) or the decay of the momentum trace.
      nesterov: Use Nesterov momentum.

    Returns:
      The transformation; its state is a pair of the two states.

    Raises:
      TypeError: If `learning_rate` is neither a number nor callable, or
        `momentum` is neither None nor a number.
    """
    lr = _by_learning_rate("sgd", learning_rate)
    if momentum is not None:
        _real("sgd", "momentum", momentum, "None or a float")
    return chain(identity() if momentum is None else trace(momentum, nesterov), lr)


def adam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         eps_root: float = 0.0) -> GradientTransformation:
    """Adam, as `optax.adam`: `chain(scale_by_adam(...), scale_by_learning_rate(learning_rate))`.

    Args:
      learning_rate: A float, or a schedule (a callable of the step count).
      b1, b2, eps, eps_root: As for `scale_by_adam`.

    Returns:
      The transformation; its state is `(ScaleByAdamState, EmptyState or
      ScaleByScheduleState)`.

    Raises:
      TypeError: If a hyperparameter is not a number (or the learning rate
        neither a number nor callable).
    """
    lr = _by_learning_rate("adam", learning_rate)
    return chain(scale_by_adam(b1, b2, eps, eps_root), lr)


def adamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          eps_root: float = 0.0, weight_decay: float = 1e-4, mask: Any = None
          ) -> GradientTransformation:
    """Adam with decoupled weight decay, as `optax.adamw`.

    `chain(scale_by_adam(...), add_decayed_weights(weight_decay, mask),
    scale_by_learning_rate(learning_rate))`: the update is
    `-learning_rate * (adam_update + weight_decay * params)`.

    Args:
      learning_rate: A float, or a schedule (a callable of the step count).
      b1, b2, eps, eps_root: As for `scale_by_adam`.
      weight_decay: The decay rate.
      mask: Which parameters decay, as for `add_decayed_weights` (None: all).

    Returns:
      The transformation; its `update` needs `params`.

    Raises:
      TypeError: If a hyperparameter is not a number (or the learning rate
        neither a number nor callable).
    """
    lr = _by_learning_rate("adamw", learning_rate)
    return chain(scale_by_adam(b1, b2, eps, eps_root), add_decayed_weights(weight_decay, mask), lr)


# --- Schedules -----------------------------------------------------------------------


def _count_f64(count: Any) -> Any:
    # Schedules compute in float64: exact for every int32 count, and no int32
    # overflow in `count - transition_begin` and the like.
    if isinstance(count, Tracer):
        return count if count.dtype == np.float64 else count.astype(np.float64)
    return np.asarray(count, np.float64)


def _pow(x: Any, power: float) -> Any:
    return x if power == 1 else x ** power


def constant_schedule(value: float) -> Schedule:
    """A schedule that is always `value`, as `optax.constant_schedule`.

    Raises:
      TypeError: If `value` is not a number.
    """
    value = _real("constant_schedule", "value", value)
    return lambda count: value


def polynomial_schedule(init_value: float, end_value: float, power: float, transition_steps: int,
                        transition_begin: int = 0) -> Schedule:
    """From `init_value` to `end_value` along a polynomial, as `optax.polynomial_schedule`.

    `(init - end) * (1 - c / transition_steps) ** power + end` with
    `c = clip(count - transition_begin, 0, transition_steps)`; the constant
    `init_value` if `transition_steps <= 0`; a negative `transition_begin` is 0.

    Raises:
      TypeError: If an argument is not a number.
    """
    return _polynomial("polynomial_schedule", init_value, end_value, power, transition_steps,
                       transition_begin)


def _polynomial(name: str, init_value: Any, end_value: Any, power: Any, transition_steps: Any,
                transition_begin: Any) -> Schedule:
    init_value, end_value = _real(name, "init_value", init_value), _real(name, "end_value", end_value)
    power = _real(name, "power", power)
    _real(name, "transition_steps", transition_steps, "a number")
    _real(name, "transition_begin", transition_begin, "a number")
    if transition_steps <= 0:
        return lambda count: init_value
    transition_begin = max(transition_begin, 0)

    def schedule(count: Any) -> Any:
        c = pnp.clip(_count_f64(count) - transition_begin, 0, transition_steps)
        frac = 1 - c / transition_steps
        return (init_value - end_value) * _pow(frac, power) + end_value

    return schedule


def linear_schedule(init_value: float, end_value: float, transition_steps: int,
                    transition_begin: int = 0) -> Schedule:
    """From `init_value` to `end_value` in a line, as `optax.linear_schedule`.

    `init_value` until `transition_begin`, `end_value` from
    `transition_begin + transition_steps` on; `polynomial_schedule` with power 1.

    Raises:
      TypeError: If an argument is not a number.
    """
    return _polynomial("linear_schedule", init_value, end_value, 1, transition_steps, transition_begin)


def piecewise_constant_schedule(init_value: float,
                                boundaries_and_scales: Optional[dict] = None) -> Schedule:
    """`init_value` times the scales of the boundaries passed, as optax's.

    At count `c` the value is `init_value` times every `scale` whose
    `boundary <= c`.

    Args:
      init_value: The value before the first boundary.
      boundaries_and_scales: `{boundary step: scale}`, or None.

    Raises:
      ValueError: If a scale is negative.
      TypeError: If an argument is not a number.
    """
    name = "piecewise_constant_schedule"
    init_value = _real(name, "init_value", init_value)
    items = []
    if boundaries_and_scales is not None:
        if not isinstance(boundaries_and_scales, dict):
            raise TypeError(f"{name}: boundaries_and_scales must be a dict of step: scale, got "
                            f"{_describe(boundaries_and_scales)}")
        for b, s in sorted(boundaries_and_scales.items()):
            items.append((_real(name, "a boundary", b, "a number"), _real(name, "a scale", s)))
        if any(s < 0.0 for _, s in items):
            raise ValueError(f"{name}: scales must be non-negative, got {boundaries_and_scales}")

    def schedule(count: Any) -> Any:
        c = _count_f64(count)
        v = init_value
        for threshold, s in items:
            indicator = pnp.maximum(0.0, pnp.sign(threshold - c))
            v = v * indicator + (1 - indicator) * s * v
        return v

    return schedule


def exponential_decay(init_value: float, transition_steps: int, decay_rate: float,
                      transition_begin: int = 0, staircase: bool = False,
                      end_value: Optional[float] = None) -> Schedule:
    """`init_value * decay_rate ** ((count - transition_begin) / transition_steps)`, as optax's.

    `init_value` until `transition_begin`; with `staircase` the exponent is
    floored; `end_value` bounds the value (below if `decay_rate < 1`, above
    otherwise). The constant `init_value` if `transition_steps <= 0` or
    `decay_rate == 0`; a negative `transition_begin` is 0.

    Raises:
      TypeError: If an argument is not a number.
    """
    name = "exponential_decay"
    init_value = _real(name, "init_value", init_value)
    decay_rate = _real(name, "decay_rate", decay_rate)
    _real(name, "transition_steps", transition_steps, "a number")
    _real(name, "transition_begin", transition_begin, "a number")
    if end_value is not None:
        end_value = _real(name, "end_value", end_value, "None or a float")
    if transition_steps <= 0 or decay_rate == 0:
        return lambda count: init_value
    transition_begin = max(transition_begin, 0)
    bound = pnp.maximum if decay_rate < 1.0 else pnp.minimum

    def schedule(count: Any) -> Any:
        d = _count_f64(count) - transition_begin
        p = d / transition_steps
        if staircase:
            # Truncation is the floor where it matters: `where` keeps p only for d > 0.
            p = p.astype(np.int32).astype(np.float64) if isinstance(p, Tracer) else np.floor(p)
        v = pnp.where(d <= 0, init_value, init_value * pnp.power(decay_rate, p))
        return v if end_value is None else bound(v, end_value)

    return schedule


def cosine_decay_schedule(init_value: float, decay_steps: int, alpha: float = 0.0,
                          exponent: float = 1.0) -> Schedule:
    """Cosine decay from `init_value` to `alpha * init_value`, as optax's.

    `init_value * ((1 - alpha) * (0.5 * (1 + cos(pi * c / decay_steps))) ** exponent + alpha)`
    with `c = min(count, decay_steps)`.

    Raises:
      ValueError: If `decay_steps` is not positive.
      TypeError: If an argument is not a number.
    """
    name = "cosine_decay_schedule"
    init_value, alpha = _real(name, "init_value", init_value), _real(name, "alpha", alpha)
    exponent = _real(name, "exponent", exponent)
    _real(name, "decay_steps", decay_steps, "a number")
    if not decay_steps > 0:
        raise ValueError(f"{name}: decay_steps must be positive, got {decay_steps}")

    def schedule(count: Any) -> Any:
        c = pnp.minimum(_count_f64(count), decay_steps)
        cosine = 0.5 * (1 + pnp.cos(math.pi * c / decay_steps))
        return init_value * ((1 - alpha) * _pow(cosine, exponent) + alpha)

    return schedule


def join_schedules(schedules: Sequence[Schedule], boundaries: Sequence[int]) -> Schedule:
    """Schedule `i + 1` from `boundaries[i]` on, counting from there, as optax's.

    Args:
      schedules: The schedules, in order.
      boundaries: One step fewer than schedules: where each next one starts.

    Raises:
      ValueError: If the lengths do not fit.
    """
    schedules, boundaries = list(schedules), list(boundaries)
    if len(boundaries) != len(schedules) - 1:
        raise ValueError(
            f"join_schedules: {len(schedules)} schedules need {len(schedules) - 1} boundaries, "
            f"got {len(boundaries)}"
        )

    def schedule(step: Any) -> Any:
        out = schedules[0](step)
        for boundary, s in zip(boundaries, schedules[1:]):
            out = pnp.where(step < boundary, out, s(step - boundary))
        return out

    return schedule


def warmup_cosine_decay_schedule(init_value: float, peak_value: float, warmup_steps: int,
                                 decay_steps: int, end_value: float = 0.0,
                                 exponent: float = 1.0) -> Schedule:
    """A linear warmup to `peak_value`, then a cosine decay to `end_value`, as optax's.

    `decay_steps` counts the warmup too: the cosine runs for
    `decay_steps - warmup_steps` steps.

    Raises:
      ValueError: If `decay_steps <= warmup_steps`.
      TypeError: If an argument is not a number.
    """
    name = "warmup_cosine_decay_schedule"
    init_value, exponent = _real(name, "init_value", init_value), _real(name, "exponent", exponent)
    peak_value, end_value = _real(name, "peak_value", peak_value), _real(name, "end_value", end_value)
    _real(name, "warmup_steps", warmup_steps, "a number")
    _real(name, "decay_steps", decay_steps, "a number")
    if not decay_steps > warmup_steps:
        raise ValueError(
            f"{name}: decay_steps ({decay_steps}) must exceed warmup_steps ({warmup_steps}): it "
            "counts the warmup too"
        )
    alpha = 0.0 if peak_value == 0.0 else end_value / peak_value
    return join_schedules(
        [linear_schedule(init_value, peak_value, warmup_steps),
         cosine_decay_schedule(peak_value, decay_steps - warmup_steps, alpha, exponent)],
        [warmup_steps],
    )
