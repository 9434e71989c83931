"""pathways.optim: optax's transformations and schedules, against numpy references
written from optax's formulas, outside any trace, inside pw.pmap and in @pw.program."""

import math
import re

import numpy as np
import pytest

import pathways as pw
import pathways.numpy as pnp
import pathways.optim as optim

from conftest import get_devices


# --- Pytrees and the numpy references --------------------------------------------


def make_params(rng, dtype=np.float32):
    """Mixed shapes and every container: dict, list, tuple, a 0-d leaf."""
    return {
        "dense": [rng.standard_normal((3, 4)).astype(dtype), rng.standard_normal(4).astype(dtype)],
        "scale": np.asarray(rng.standard_normal(), dtype),
        "emb": (rng.standard_normal((2, 1, 3)).astype(dtype),),
    }


def grads_like(rng, params, scale=1.0):
    return pw.tree_map(lambda p: (scale * rng.standard_normal(p.shape)).astype(p.dtype), params)


def leaves(tree):
    return pw.tree_flatten(tree)[0]


def structure(tree):
    return pw.tree_flatten(tree)[1]


def f64(tree):
    return [np.asarray(x, np.float64) for x in leaves(tree)]


TOL = {np.dtype(np.float32): dict(rtol=2e-5, atol=2e-6), np.dtype(np.float64): dict(rtol=1e-11, atol=1e-13)}


def assert_tree_close(got, want_leaves, like, steps=1):
    """`got` has `like`'s structure and dtypes and its leaves match float64 `want_leaves`
    (to the rounding of its dtype, added up over `steps` steps)."""
    assert structure(got) == structure(like)
    for g, w, ref in zip(leaves(got), want_leaves, leaves(like)):
        g = np.asarray(g)
        assert g.dtype == np.asarray(ref).dtype and g.shape == np.shape(ref)
        tol = TOL[g.dtype]
        np.testing.assert_allclose(g, w, rtol=tol["rtol"], atol=tol["atol"] * steps)


class RefSGD:
    """optax.sgd: trace = g + m * trace; update = trace (Nesterov: g + m * trace); times -lr."""

    def __init__(self, lr, momentum=None, nesterov=False):
        self.lr, self.m, self.nesterov, self.trace, self.count = lr, momentum, nesterov, None, 0

    def step(self, g, p):
        lr = self.lr(self.count) if callable(self.lr) else self.lr
        self.count += 1
        if self.m is None:
            return [-lr * x for x in g]
        if self.trace is None:
            self.trace = [np.zeros_like(x) for x in g]
        self.trace = [x + self.m * t for x, t in zip(g, self.trace)]
        u = [x + self.m * t for x, t in zip(g, self.trace)] if self.nesterov else self.trace
        return [-lr * x for x in u]


class RefAdam:
    """optax.adam / adamw, from Kingma & Ba with optax's eps placement and decoupled decay."""

    def __init__(self, lr, b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, wd=None, mask=None):
        self.lr, self.b1, self.b2, self.eps, self.eps_root = lr, b1, b2, eps, eps_root
        self.wd, self.mask, self.mu, self.nu, self.t = wd, mask, None, None, 0

    def step(self, g, p):
        if self.mu is None:
            self.mu = [np.zeros_like(x) for x in g]
            self.nu = [np.zeros_like(x) for x in g]
        lr = self.lr(self.t) if callable(self.lr) else self.lr
        self.t += 1
        self.mu = [self.b1 * m + (1 - self.b1) * x for m, x in zip(self.mu, g)]
        self.nu = [self.b2 * v + (1 - self.b2) * x ** 2 for v, x in zip(self.nu, g)]
        mu_hat = [m / (1 - self.b1 ** self.t) for m in self.mu]
        nu_hat = [v / (1 - self.b2 ** self.t) for v in self.nu]
        u = [m / (np.sqrt(v + self.eps_root) + self.eps) for m, v in zip(mu_hat, nu_hat)]
        if self.wd is not None:
            mask = self.mask or [True] * len(u)
            u = [x + self.wd * w if keep else x for x, w, keep in zip(u, p, mask)]
        return [-lr * x for x in u]


def ref_clip(g, max_norm):
    norm = math.sqrt(sum(float(np.sum(x * x)) for x in g))
    return g if norm < max_norm else [x / norm * max_norm for x in g]


# --- Running a transformation outside any trace and inside pmap ------------------


def run_numpy(tx, params, grads_seq):
    """(updates, state) per step, with params updated by apply_updates, on numpy arrays."""
    state, out = tx.init(params), []
    for g in grads_seq:
        u, state = tx.update(g, state, params)
        out.append((u, state))
        params = optim.apply_updates(params, u)
    return out, params


def stack(trees):
    return pw.tree_map(lambda *xs: np.stack(xs), *trees)


def shard(tree, i):
    return pw.tree_map(lambda x: np.asarray(x)[i], tree)


def run_pmap(tx, params_per_device, grads_per_device, devices):
    """As run_numpy inside a pmap: device i runs its own params and grads; states flow
    out of one call and into the next. Returns per-device lists of (updates, state)."""
    calls = []

    def step(g, s, p):
        calls.append(1)
        u, s = tx.update(g, s, p)
        return u, s, optim.apply_updates(p, u)

    f = pw.pmap(step, devices=devices)
    params = stack(params_per_device)
    state = stack([tx.init(p) for p in params_per_device])
    if leaves(state):  # else no output: pmap refuses to compile a function of none
        state = pw.pmap(tx.init, devices=devices)(params)
    out = []
    for gs in zip(*grads_per_device):
        u, state, params = f(stack(gs), state, params)
        out.append((u, state))
    assert len(calls) == 1, "the step was traced more than once: the state's signature changed"
    n = len(devices)
    return [[(shard(u, i), shard(s, i)) for u, s in out] for i in range(n)], [shard(params, i) for i in range(n)]


def check_against(ref_factory, tx, dtype, devices, steps=4, grad_scale=1.0):
    """The transformation's updates equal the reference's, outside a trace and in pmap
    (each device its own stream), and the state keeps the parameters' dtypes."""
    rng = np.random.default_rng(0)
    n = len(devices)
    params = [make_params(rng, dtype) for _ in range(n)]
    grads = [[grads_like(rng, params[i], grad_scale) for _ in range(steps)] for i in range(n)]
    refs = []
    for i in range(n):
        ref, p = ref_factory(), f64(params[i])
        want = []
        for g in grads[i]:
            u = ref.step(f64(g), p)
            want.append(u)
            p = [a + b for a, b in zip(p, u)]
        refs.append((want, p))
    got_np, final_np = run_numpy(tx, params[0], grads[0])
    for (u, state), w in zip(got_np, refs[0][0]):
        assert_tree_close(u, w, params[0])
        for leaf in leaves(state):
            assert np.asarray(leaf).dtype in (np.dtype(dtype), np.dtype(np.int32))
    assert_tree_close(final_np, refs[0][1], params[0], steps)
    got_pm, final_pm = run_pmap(tx, params, grads, devices)
    for i in range(n):
        for (u, state), w, (_, state_np) in zip(got_pm[i], refs[i][0], got_np):
            assert_tree_close(u, w, params[i])
            assert structure(state) == structure(state_np)
            for a, b in zip(leaves(state), leaves(state_np)):
                assert np.asarray(a).dtype == np.asarray(b).dtype
        assert_tree_close(final_pm[i], refs[i][1], params[i], steps)
    return got_np


DTYPES = [np.float32, np.float64]


@pytest.fixture(scope="module")
def tpus1():
    return get_devices(1)


# --- Every transformation against its reference ----------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("momentum, nesterov", [(None, False), (0.9, False), (0.9, True), (0.5, True)])
def test_sgd_matches_optax_formulas(dtype, momentum, nesterov, tpus2):
    check_against(lambda: RefSGD(0.1, momentum, nesterov), optim.sgd(0.1, momentum, nesterov),
                  dtype, tpus2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b1, b2, eps, eps_root", [(0.9, 0.999, 1e-8, 0.0), (0.5, 0.9, 1e-3, 1e-4),
                                                   (0.0, 0.99, 0.0, 0.0)])
def test_adam_matches_optax_formulas(dtype, b1, b2, eps, eps_root, tpus2):
    states = check_against(lambda: RefAdam(0.01, b1, b2, eps, eps_root),
                           optim.adam(0.01, b1, b2, eps, eps_root), dtype, tpus2)
    adam_state, lr_state = states[-1][1]
    assert isinstance(adam_state, optim.ScaleByAdamState) and lr_state == optim.EmptyState()
    assert adam_state.count.dtype == np.int32 and int(adam_state.count) == 4


@pytest.mark.parametrize("dtype", DTYPES)
def test_adamw_decays_decoupled_from_the_adam_step(dtype, tpus2):
    check_against(lambda: RefAdam(0.05, wd=0.1), optim.adamw(0.05, weight_decay=0.1), dtype, tpus2)


def test_adamw_mask_decays_only_the_selected_leaves(tpus2):
    # Leaves in flattening order: dense[0], dense[1], emb[0], scale.
    mask = {"dense": [True, False], "scale": False, "emb": (True,)}
    flat = [True, False, True, False]
    check_against(lambda: RefAdam(0.05, wd=0.3, mask=flat), optim.adamw(0.05, weight_decay=0.3, mask=mask),
                  np.float64, tpus2)
    # A function of the params gives the same mask.
    check_against(lambda: RefAdam(0.05, wd=0.3, mask=flat),
                  optim.adamw(0.05, weight_decay=0.3, mask=lambda p: mask), np.float64, tpus2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_clip_by_global_norm_chained_before_sgd(dtype, tpus2):
    class Ref:
        def step(self, g, p):
            return [-0.1 * x for x in ref_clip(g, 1.5)]

    # Gradients of norm about 7: every step is clipped.
    check_against(Ref, optim.chain(optim.clip_by_global_norm(1.5), optim.sgd(0.1)), dtype, tpus2)
    # Gradients of norm about 0.3: none is.
    check_against(Ref, optim.chain(optim.clip_by_global_norm(1.5), optim.sgd(0.1)), dtype, tpus2,
                  grad_scale=0.1)


def test_clip_at_exactly_max_norm_and_with_zero_gradients(tpus2):
    g = {"a": np.array([3.0, 0.0]), "b": np.array([[4.0]])}  # norm exactly 5
    tx = optim.clip_by_global_norm(5.0)
    clipped, _ = tx.update(g, tx.init(g))
    # optax keeps t only when norm < max_norm; at the boundary it is (t / norm) * max_norm.
    np.testing.assert_array_equal(clipped["a"], g["a"] / 5.0 * 5.0)
    assert float(optim.global_norm(g)) == 5.0
    zero = pw.tree_map(np.zeros_like, g)
    out, _ = tx.update(zero, tx.init(zero))
    for x in leaves(out):
        np.testing.assert_array_equal(x, 0.0)  # not NaN: a zero norm is below max_norm
    scaled, _ = optim.clip_by_global_norm(2.5).update(g, optim.EmptyState())
    np.testing.assert_allclose(scaled["b"], [[2.0]], rtol=1e-15)
    # At a norm equal to max_norm (computed the same way) the leaves are rescaled, not kept.
    r = {"a": np.random.default_rng(1).standard_normal(20), "b": np.array([[0.1]])}
    at = float(optim.global_norm(r))
    out, _ = optim.clip_by_global_norm(at).update(r, optim.EmptyState())
    assert not np.array_equal(out["a"], r["a"])  # the check can tell the two apart
    np.testing.assert_array_equal(out["a"], r["a"] / at * at)
    in_pmap = pw.pmap(lambda g: optim.global_norm(g), devices=tpus2)(stack([r, r]))
    at = float(np.asarray(in_pmap)[0])
    f = pw.pmap(lambda g: optim.clip_by_global_norm(at).update(g, optim.EmptyState())[0], devices=tpus2)
    np.testing.assert_array_equal(np.asarray(f(stack([r, r]))["a"])[0], r["a"] / at * at)
    # Zero gradients inside pmap.
    f = pw.pmap(lambda g: tx.update(g, optim.EmptyState())[0], devices=tpus2)
    got = f(stack([g, zero]))
    np.testing.assert_array_equal(np.asarray(got["a"]), [[3.0, 0.0], [0.0, 0.0]])
    np.testing.assert_array_equal(np.asarray(got["b"]), [[[4.0]], [[0.0]]])
    assert optim.global_norm({}) == 0.0


def test_clip_norm_promotes_mixed_dtypes_and_keeps_each_leaf_dtype(tpus2):
    g = {"a": np.array([3.0], np.float32), "b": np.array([4.0], np.float64)}
    out, _ = optim.clip_by_global_norm(1.0).update(g, optim.EmptyState())
    assert out["a"].dtype == np.float32 and out["b"].dtype == np.float64
    np.testing.assert_allclose(out["a"], [0.6], rtol=1e-7)
    np.testing.assert_allclose(out["b"], [0.8], rtol=1e-15)
    f = pw.pmap(lambda g: optim.clip_by_global_norm(1.0).update(g, optim.EmptyState())[0], devices=tpus2)
    got = f(stack([g, g]))
    assert got["a"].dtype == np.float32 and got["b"].dtype == np.float64
    np.testing.assert_allclose(np.asarray(got["b"]), [[0.8], [0.8]], rtol=1e-15)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adam_on_a_tree_of_mixed_dtypes_keeps_each(dtype, tpus2):
    other = np.float64 if dtype == np.float32 else np.float32
    rng = np.random.default_rng(3)
    p = {"a": rng.standard_normal(3).astype(dtype), "b": rng.standard_normal((2, 2)).astype(other)}
    tx = optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(0.1, weight_decay=0.01))
    gs = [grads_like(rng, p) for _ in range(3)]
    got, _ = run_numpy(tx, p, gs)
    pm, _ = run_pmap(tx, [p, p], [gs, gs], tpus2)
    for (u, s), (u2, s2) in zip(got, pm[0]):
        assert u["a"].dtype == dtype and u["b"].dtype == other
        assert s[1][0].mu["a"].dtype == dtype and s[1][0].nu["b"].dtype == other
        assert u2["a"].dtype == dtype and s2[1][0].mu["b"].dtype == other
        np.testing.assert_allclose(u2["a"], u["a"], **TOL[np.dtype(np.float32)])
        np.testing.assert_allclose(u2["b"], u["b"], **TOL[np.dtype(np.float32)])


def test_scale_trace_add_decayed_weights_and_identity_alone(tpus2):
    rng = np.random.default_rng(5)
    p = make_params(rng, np.float64)
    g = grads_like(rng, p)
    u, s = optim.scale(-0.5).update(g, optim.scale(-0.5).init(p))
    assert s == optim.EmptyState()
    for a, b in zip(leaves(u), leaves(g)):
        np.testing.assert_array_equal(a, -0.5 * b)
    tr = optim.trace(0.9)
    s = tr.init(p)
    u1, s = tr.update(g, s)
    u2, s = tr.update(g, s)
    assert isinstance(s, optim.TraceState)
    for a, b in zip(leaves(u2), leaves(g)):
        np.testing.assert_allclose(a, 1.9 * b, rtol=1e-15)
    wd = optim.add_decayed_weights(0.25)
    u, _ = wd.update(g, wd.init(p), p)
    for a, b, c in zip(leaves(u), leaves(g), leaves(p)):
        np.testing.assert_array_equal(a, b + 0.25 * c)
    u, s = optim.identity().update(g, optim.identity().init(p))
    assert u is g and s == optim.EmptyState()
    u, s = optim.chain().update(g, optim.chain().init(p))
    assert u is g and s == ()


def test_apply_updates_keeps_each_parameter_dtype(tpus2):
    p = {"a": np.array([1.0, 2.0], np.float32), "b": np.array([0.5])}
    u = {"a": np.array([0.1, 0.2]), "b": np.array([0.25], np.float32)}
    out = optim.apply_updates(p, u)
    assert out["a"].dtype == np.float32 and out["b"].dtype == np.float64
    np.testing.assert_array_equal(out["a"], (p["a"] + u["a"]).astype(np.float32))
    got = pw.pmap(optim.apply_updates, devices=tpus2)(stack([p, p]), stack([u, u]))
    assert got["a"].dtype == np.float32 and got["b"].dtype == np.float64
    np.testing.assert_array_equal(np.asarray(got["b"])[1], [0.75])


def test_negative_learning_rate_ascends_as_optax_does_not_check():
    g = {"w": np.array([1.0, -2.0])}
    u, _ = optim.sgd(-0.5).update(g, optim.sgd(-0.5).init(g))
    np.testing.assert_array_equal(u["w"], [0.5, -1.0])


def test_traced_learning_rate_argument(tpus2):
    """A learning rate passed to the step as an argument, as with optax in jit."""

    def step(p, g, lr):
        tx = optim.sgd(lr, momentum=0.9)
        u, _ = tx.update(g, tx.init(p))
        return optim.apply_updates(p, u)

    f = pw.pmap(step, devices=tpus2)
    p = np.ones((2, 3), np.float32)
    out = f(p, np.full((2, 3), 2.0, np.float32), np.array([0.1, 0.5]))
    assert out.dtype == np.float32  # the float64 learning rate is cast to the leaf's dtype
    np.testing.assert_allclose(np.asarray(out), [[0.8] * 3, [0.0] * 3], atol=1e-7)


def test_sharded_buffers_outside_a_trace(tpus2):
    rng = np.random.default_rng(2)
    p = rng.standard_normal((2, 3)).astype(np.float32)
    g_buf = pw.pmap(lambda x: x * 0.5, devices=tpus2)(p)
    assert isinstance(g_buf, pw.ShardedBuffer)
    tx = optim.adam(0.1)
    u, s = tx.update({"w": g_buf}, tx.init({"w": pw.device_put(p, tpus2)}))
    u_np, s_np = tx.update({"w": p * 0.5}, tx.init({"w": p}))
    np.testing.assert_array_equal(u["w"], u_np["w"])
    new = optim.apply_updates({"w": pw.device_put(p, tpus2)}, u)
    np.testing.assert_array_equal(new["w"], p + u_np["w"])


def test_count_saturates_at_the_int32_maximum():
    top = np.iinfo(np.int32).max
    tx = optim.scale_by_adam()
    g = {"w": np.array([1.0], np.float32)}
    s = tx.init(g)._replace(count=np.array(top - 1, np.int32))
    _, s = tx.update(g, s)
    _, s = tx.update(g, s)
    assert s.count.dtype == np.int32 and int(s.count) == top


# --- Schedules ---------------------------------------------------------------------


def ref_linear(init, end, steps, begin=0):
    return lambda t: init if t <= begin else end if t >= begin + steps else init + (end - init) * (t - begin) / steps


def ref_cosine(init, steps, alpha=0.0, exponent=1.0):
    return lambda t: init * ((1 - alpha) * (0.5 * (1 + math.cos(math.pi * min(t, steps) / steps))) ** exponent + alpha)


def ref_warmup_cosine(init, peak, warmup, decay, end=0.0, exponent=1.0):
    cos = ref_cosine(peak, decay - warmup, end / peak, exponent)
    return lambda t: ref_linear(init, peak, warmup)(t) if t < warmup else cos(t - warmup)


def ref_exponential(init, steps, rate, begin=0, staircase=False, end=None):
    def f(t):
        if t <= begin:
            v = init
        else:
            e = (t - begin) / steps
            v = init * rate ** (math.floor(e) if staircase else e)
        if end is not None:
            v = max(v, end) if rate < 1 else min(v, end)
        return v
    return f


def ref_piecewise(init, bs):
    return lambda t: init * math.prod(s for b, s in bs.items() if t >= b)


SCHEDULES = {
    "constant": (optim.constant_schedule(0.3), lambda t: 0.3, [0, 1, 100]),
    "linear": (optim.linear_schedule(1.0, 0.1, 10), ref_linear(1.0, 0.1, 10), [0, 1, 5, 9, 10, 11, 50]),
    "linear_begin": (optim.linear_schedule(0.0, 2.0, 4, transition_begin=3), ref_linear(0.0, 2.0, 4, 3),
                     [0, 2, 3, 4, 6, 7, 8, 1000]),
    "linear_negative_begin": (optim.linear_schedule(1.0, 0.0, 4, transition_begin=-3), ref_linear(1.0, 0.0, 4),
                              [0, 2, 4, 5]),  # as optax: a negative begin is 0
    "polynomial": (optim.polynomial_schedule(1.0, 0.0, 2, 8), lambda t: (1 - min(t, 8) / 8) ** 2, [0, 3, 8, 9]),
    "cosine": (optim.cosine_decay_schedule(0.5, 20), ref_cosine(0.5, 20), [0, 1, 10, 19, 20, 21, 400]),
    "cosine_alpha_exp": (optim.cosine_decay_schedule(1.0, 7, alpha=0.2, exponent=2.0),
                         ref_cosine(1.0, 7, 0.2, 2.0), [0, 3, 7, 8]),
    "warmup_cosine": (optim.warmup_cosine_decay_schedule(0.0, 1.0, 5, 25, end_value=0.1),
                      ref_warmup_cosine(0.0, 1.0, 5, 25, 0.1), [0, 1, 4, 5, 6, 15, 24, 25, 26, 10**6]),
    "exponential": (optim.exponential_decay(1.0, 4, 0.5), ref_exponential(1.0, 4, 0.5), [0, 1, 4, 8, 9]),
    "exponential_staircase": (optim.exponential_decay(2.0, 3, 0.1, transition_begin=2, staircase=True,
                                                      end_value=0.01),
                              ref_exponential(2.0, 3, 0.1, 2, True, 0.01), [0, 2, 3, 4, 5, 8, 11, 100]),
    "exponential_growth": (optim.exponential_decay(1.0, 2, 3.0, end_value=10.0),
                           ref_exponential(1.0, 2, 3.0, end=10.0), [0, 1, 2, 4, 5, 9]),
    "piecewise": (optim.piecewise_constant_schedule(1.0, {10: 0.5, 4: 0.1}),
                  ref_piecewise(1.0, {10: 0.5, 4: 0.1}), [0, 3, 4, 5, 9, 10, 11]),
    "piecewise_none": (optim.piecewise_constant_schedule(0.7), lambda t: 0.7, [0, 5]),
    "join": (optim.join_schedules([optim.constant_schedule(2.0), optim.linear_schedule(1.0, 0.0, 4)], [3]),
             lambda t: 2.0 if t < 3 else ref_linear(1.0, 0.0, 4)(t - 3), [0, 2, 3, 5, 7, 8]),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedule_at_its_boundaries(name, tpus1):
    sched, ref, counts = SCHEDULES[name]
    want = [ref(t) for t in counts]
    # Python ints and int32 counts, outside any trace.
    np.testing.assert_allclose([float(sched(t)) for t in counts], want, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose([float(sched(np.int32(t))) for t in counts], want, rtol=1e-13, atol=1e-15)
    # Inside a trace: the counts as one int32 vector (the schedules are elementwise).
    c = np.array([counts], np.int32)
    got = np.asarray(pw.pmap(lambda c: sched(c) + pnp.zeros_like(c, np.float64), devices=tpus1)(c))[0]
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("dtype", DTYPES)
def test_schedule_as_learning_rate_reads_the_count_before_the_step(dtype, tpus2):
    sched = optim.warmup_cosine_decay_schedule(0.0, 0.5, 2, 6)
    ref = ref_warmup_cosine(0.0, 0.5, 2, 6)
    check_against(lambda: RefSGD(ref, 0.9), optim.sgd(sched, momentum=0.9), dtype, tpus2, steps=8)
    check_against(lambda: RefAdam(ref), optim.adam(sched), dtype, tpus2, steps=8)
    s = optim.sgd(sched).init(np.zeros(2))
    assert isinstance(s[1], optim.ScaleByScheduleState) and s[1].count.dtype == np.int32


def test_schedule_argument_errors():
    with pytest.raises(ValueError, match=r"cosine_decay_schedule: decay_steps must be positive, got 0"):
        optim.cosine_decay_schedule(1.0, 0)
    with pytest.raises(ValueError, match=r"decay_steps \(5\) must exceed warmup_steps \(5\)"):
        optim.warmup_cosine_decay_schedule(0.0, 1.0, 5, 5)
    with pytest.raises(ValueError, match=r"piecewise_constant_schedule: scales must be non-negative"):
        optim.piecewise_constant_schedule(1.0, {3: -0.5})
    with pytest.raises(TypeError, match=r"linear_schedule: init_value must be a float, got '1' \(str\)"):
        optim.linear_schedule("1", 0.0, 10)
    with pytest.raises(TypeError, match=r"warmup_cosine_decay_schedule: init_value must be a float"):
        optim.warmup_cosine_decay_schedule(None, 1.0, 5, 10)
    with pytest.raises(TypeError, match=r"exponential_decay: transition_steps must be a number, got '10' \(str\)"):
        optim.exponential_decay(1.0, "10", 0.5)
    with pytest.raises(ValueError, match=r"join_schedules: 2 schedules need 1 boundaries, got 2"):
        optim.join_schedules([optim.constant_schedule(1.0)] * 2, [1, 2])
    # As optax: no transition is a constant schedule.
    assert optim.linear_schedule(0.5, 0.0, 0)(7) == 0.5
    assert optim.exponential_decay(0.5, 10, 0.0)(7) == 0.5


# --- Inside pmap and programs: data parallelism, convergence -------------------------


def lsq_loss(p, x, y):
    r = x @ p["w"] + p["b"] - y
    return (r * r).mean()


def test_data_parallel_step_on_two_devices_equals_one_device_on_the_full_batch(tpus2, tpus1):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.3 + 0.1 * rng.standard_normal(8)
    params = {"w": np.zeros(3), "b": np.zeros(())}
    tx = optim.chain(optim.clip_by_global_norm(2.0),
                     optim.adamw(optim.linear_schedule(0.1, 0.01, 5), weight_decay=0.05))

    def make_step(dp):
        def step(p, s, x, y):
            g = pw.grad(lsq_loss)(p, x, y)
            if dp:
                g = pw.pmean(g, "d")
            u, s = tx.update(g, s, p)
            return optim.apply_updates(p, u), s
        return step

    dp_step = pw.pmap(make_step(True), devices=tpus2, axis_name="d")
    one_step = pw.pmap(make_step(False), devices=tpus1)
    p2, s2 = stack([params] * 2), stack([tx.init(params)] * 2)
    p1, s1 = stack([params]), stack([tx.init(params)])
    xs, ys = x.reshape(2, 4, 3), y.reshape(2, 4)
    for _ in range(6):
        p2, s2 = dp_step(p2, s2, xs, ys)
        p1, s1 = one_step(p1, s1, x[None], y[None])
    for a, b in zip(leaves((p2, s2)), leaves((p1, s1))):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(a[0], b[0], rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(a[0], a[1])  # the replicas agree
    assert int(np.asarray(s1[1][0].count)[0]) == 6 and np.asarray(s1[1][2].count).dtype == np.int32
    assert float(np.abs(np.asarray(p1["w"])[0]).sum()) > 0.1  # it moved


def test_training_loop_converges_on_least_squares(tpus1):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = (x @ np.array([0.5, -1.0, 2.0, 0.25]) - 0.7 + 0.05 * rng.standard_normal(64)).astype(np.float32)
    xa = np.concatenate([x, np.ones((64, 1), np.float32)], axis=1).astype(np.float64)
    best, *_ = np.linalg.lstsq(xa, y.astype(np.float64), rcond=None)
    tx = optim.chain(optim.clip_by_global_norm(10.0),
                     optim.adam(optim.warmup_cosine_decay_schedule(0.0, 0.1, 20, 400, end_value=1e-4)))
    traced = []

    @pw.pmap
    def step(p, s, x, y):
        traced.append(1)
        loss, g = pw.value_and_grad(lsq_loss)(p, x, y)
        u, s = tx.update(g, s, p)
        return optim.apply_updates(p, u), s, loss

    params = {"w": np.zeros(4, np.float32), "b": np.zeros((), np.float32)}
    p, s = stack([params]), pw.pmap(tx.init)(stack([params]))
    losses = []
    for _ in range(400):
        p, s, loss = step(p, s, x[None], y[None])
        losses.append(float(np.asarray(loss)[0]))
    assert len(traced) == 1
    assert np.asarray(p["w"]).dtype == np.float32 and np.asarray(s[1][0].mu["w"]).dtype == np.float32
    np.testing.assert_allclose(np.asarray(p["w"])[0], best[:4], atol=2e-3)
    np.testing.assert_allclose(float(np.asarray(p["b"])[0]), best[4], atol=2e-3)
    best_loss = float(np.mean((xa @ best - y) ** 2))
    assert losses[-1] < best_loss * 1.001 and losses[0] > 10 * best_loss


def test_state_flows_between_steps_of_a_program(tpus2):
    rng = np.random.default_rng(4)
    tx = optim.sgd(0.05, momentum=0.9, nesterov=True)

    @pw.pmap
    def step(p, s, x, y):
        u, s = tx.update(pw.grad(lsq_loss)(p, x, y), s, p)
        return optim.apply_updates(p, u), s

    @pw.program
    def three_steps(p, s, x, y):
        for _ in range(3):
            p, s = step(p, s, x, y)
        return p, s

    params = {"w": rng.standard_normal(2), "b": np.zeros(())}
    x, y = rng.standard_normal((2, 5, 2)), rng.standard_normal((2, 5))
    p0, s0 = stack([params] * 2), stack([tx.init(params)] * 2)
    p, s = p0, s0
    for _ in range(3):
        p, s = step(p, s, x, y)
    pp, sp = three_steps(p0, s0, x, y)
    assert structure(sp) == structure(s)
    for a, b in zip(leaves((pp, sp)), leaves((p, s))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert three_steps.trace(p0, s0, x, y).num_nodes == 3


# --- Errors --------------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda lr: optim.sgd(lr), lambda lr: optim.adam(lr), lambda lr: optim.adamw(lr),
    lambda lr: optim.sgd(lr, momentum=0.9), lambda lr: optim.scale_by_learning_rate(lr),
])
@pytest.mark.parametrize("lr", ["0.1", None, [0.1], True])
def test_learning_rate_of_the_wrong_type(make, lr):
    with pytest.raises(TypeError, match=r"learning_rate must be a float or a schedule \(a callable of the "
                                        r"step count\), got"):
        make(lr)


def test_other_hyperparameters_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"sgd: momentum must be None or a float, got '0.9' \(str\)"):
        optim.sgd(0.1, momentum="0.9")
    with pytest.raises(TypeError, match=r"scale_by_adam: b1 must be a float"):
        optim.adam(0.1, b1=None)
    with pytest.raises(TypeError, match=r"clip_by_global_norm: max_norm must be a float"):
        optim.clip_by_global_norm("1")
    with pytest.raises(TypeError, match=r"add_decayed_weights: weight_decay must be a float"):
        optim.adamw(0.1, weight_decay=[0.1])
    with pytest.raises(TypeError, match=r"chain: argument 1 must be a GradientTransformation"):
        optim.chain(optim.sgd(0.1), 0.5)


def test_mismatched_pytrees_name_both_structures(tpus2, runtime_ok):
    p = {"w": np.zeros(3, np.float32), "b": np.zeros(2, np.float32)}
    tx = optim.adam(0.1)
    s = tx.init(p)
    wrong = {"w": np.zeros(3, np.float32)}
    msg = re.escape("scale_by_adam: updates has structure PyTreeSpec({'w': *}) but state.mu has structure "
                    "PyTreeSpec({'b': *, 'w': *})")
    with pytest.raises(ValueError, match=msg):
        tx.update(wrong, s)
    f = pw.pmap(lambda g, s: tx.update(g, s), devices=tpus2)
    with pytest.raises(ValueError, match=msg):
        f(stack([wrong] * 2), stack([s] * 2))
    tr = optim.sgd(0.1, momentum=0.9)
    with pytest.raises(ValueError, match=re.escape("trace: updates has structure PyTreeSpec([*, *]) but "
                                                   "state.trace has structure PyTreeSpec((*, *))")):
        tr.update([np.ones(1), np.ones(1)], tr.init((np.ones(1), np.ones(1))))
    with pytest.raises(ValueError, match=r"apply_updates: params has structure .* but updates has structure"):
        optim.apply_updates(p, wrong)
    with pytest.raises(ValueError, match=r"add_decayed_weights: updates has structure .* but params has"):
        optim.adamw(0.1).update(p, optim.adamw(0.1).init(p), wrong)
    with pytest.raises(ValueError, match=r"masked: mask has structure PyTreeSpec\(\{'w': \*\}\) but params"):
        optim.adamw(0.1, mask={"w": True}).init(p)
    runtime_ok()


def test_wrong_states_and_leaves(tpus2, runtime_ok):
    p = {"w": np.zeros(3, np.float32)}
    with pytest.raises(ValueError, match=r"chain: state must be the tuple of 2 states that chain's init returns"):
        optim.adam(0.1).update(p, optim.adam(0.1).init(p)[0])
    with pytest.raises(TypeError, match=r"scale_by_adam: state must be the ScaleByAdamState that scale_by_adam's "
                                        r"init returns, got TraceState"):
        optim.adam(0.1).update(p, optim.sgd(0.1, momentum=0.9).init(p))
    with pytest.raises(TypeError, match=r"scale_by_adam: updates leaf 0 has dtype int32; optimizers update "
                                        r"float32, float64 and bfloat16 values"):
        optim.adam(0.1).update({"w": np.zeros(3, np.int32)}, optim.adam(0.1).init(p))
    with pytest.raises(TypeError, match=r"scale_by_adam: params leaf 0 is 'w' \(str\), not an array"):
        optim.adam(0.1).init({"w": "w"})
    stacked_state = stack([optim.adam(0.1).init(p)] * 2)
    with pytest.raises(ValueError, match=r"scale_by_adam: state.count must be a scalar, got shape \(2,\)"):
        optim.adam(0.1).update(stack([p] * 2), stacked_state)
    with pytest.raises(ValueError, match=r"add_decayed_weights needs the parameters"):
        optim.adamw(0.1).update(p, optim.adamw(0.1).init(p))
    with pytest.raises(TypeError, match=r"masked: mask leaf 0 must be a bool"):
        optim.adamw(0.1, mask={"w": 1.0}).init(p)
    with pytest.raises(ValueError, match=r"scale_by_schedule: the schedule returned a value of shape \(2,\)"):
        tx = optim.scale_by_schedule(lambda c: np.ones(2))
        tx.update(p, tx.init(p))
    step = pw.pmap(lambda p: p, devices=tpus2)

    @pw.program
    def prog(p):
        return optim.sgd(0.1).update(step(p), optim.sgd(0.1).init(None))[0]

    with pytest.raises(pw.TracerError, match=r"scale: updates leaf 0 is a traced program value \(f32\[2,3\]\); "
                                             r"optimizers compute inside pw.pmap'd functions"):
        prog(np.zeros((2, 3), np.float32))
    runtime_ok()


def test_bfloat16_parameters_as_optax(tpus2):
    # optax takes bfloat16 parameters: its moments are bfloat16, its bias
    # corrections float32 cast to bfloat16 (1 - 0.999 ** t in bfloat16 would be
    # 0). The device path was checked against optax 0.2.8 by hand: the same bits
    # on every leaf over these 4 steps. Here the numpy path (numpy's bfloat16
    # scalars round differently: one leaf differs by an ulp) agrees within an
    # ulp, and both stay within bfloat16's rounding of the float32 run.
    bf16 = pnp.bfloat16
    rng = np.random.default_rng(21)
    p32 = make_params(rng)
    grads = [grads_like(rng, p32) for _ in range(4)]
    tx = optim.chain(optim.clip_by_global_norm(1.0),
                     optim.adamw(optim.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10),
                                 weight_decay=1e-2))
    to_bf16 = lambda tree: pw.tree_map(lambda x: np.asarray(x).astype(bf16), tree)  # noqa: E731
    _, eager = run_numpy(tx, to_bf16(p32), [to_bf16(g) for g in grads])
    _, on_devices = run_pmap(tx, [to_bf16(p32)] * 2, [[to_bf16(g) for g in grads]] * 2, tpus2)
    _, reference = run_numpy(tx, p32, grads)
    for e, d, r in zip(leaves(eager), leaves(on_devices[1]), leaves(reference)):
        assert e.dtype == bf16 and d.dtype == bf16
        np.testing.assert_allclose(e.astype(np.float32), d.astype(np.float32), rtol=2**-7)
        assert np.all(np.isfinite(e.astype(np.float32)))
        np.testing.assert_allclose(e.astype(np.float32), r, rtol=2**-6, atol=2**-7)
