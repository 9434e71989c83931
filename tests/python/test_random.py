"""pw.random against jax.random, statistics, and reproducibility whatever the device count.

JAX (its default threefry2x32 generator, partitionable) is the reference:
keys, split, fold_in, bits, uniform, bernoulli, randint, permutation and the
dropout mask equal its values bitwise; normal and gumbel to a few ulp (their
logarithms are computed differently), categorical exactly at these seeds.
float64 is compared with JAX's x64 mode, and checked by its own construction.
Statistics use fixed seeds and bounds about 5 standard deviations (or a
chi-square quantile near 1 - 1e-5) wide: generous, but a broken generator
fails them. Every function draws the same values eagerly (numpy), inside a
1-device and an 8-device pmap (keys copied, broadcast with in_axes=None, or
split per device), in `pw.jit`, and inside `@pw.program`.
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pathways as pw

R = pw.random
SEEDS = [0, 1, 42, 2**31 - 1]


def jkey(seed):
    return jax.random.PRNGKey(seed)


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


def max_ulp(a, b):
    """The largest distance in ulp between same-signed floats of one dtype."""
    a, b = np.asarray(a), np.asarray(b)
    ints = np.int64 if a.dtype == np.float64 else np.int32
    assert (np.sign(a) == np.sign(b)).all()
    return int(np.max(np.abs(a.view(ints).astype(np.int64) - b.view(ints).astype(np.int64))))


def chi2_bound(df):
    """The chi-square quantile near 1 - 1e-5 (Wilson-Hilferty)."""
    z = 4.265
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(observed, expected):
    observed = np.asarray(observed, np.float64)
    expected = np.asarray(expected, np.float64)
    return float(((observed - expected) ** 2 / expected).sum())


# --- Keys -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 42, -1, 2**31 - 1, -(2**31), 2**32 + 5, 2**63 - 1,
                                  -(2**63), np.uint32(0xFFFFFFFF), np.int64(-7), np.int32(9),
                                  True], ids=repr)
def test_prng_key_matches_jax(seed):
    k = R.PRNGKey(seed)
    assert isinstance(k, np.ndarray)
    same_bits(k, jax.random.PRNGKey(seed))
    same_bits(R.key(seed), k)  # no typed keys: key() gives the raw key too
    same_bits(R.key(seed), jax.random.key_data(jax.random.key(seed)))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("num", [2, 3, 1, 0, (2, 3), 17])
def test_split_matches_jax(seed, num):
    got = R.split(R.PRNGKey(seed), num)
    same_bits(got, jax.random.split(jkey(seed), num))


@pytest.mark.parametrize("seed", SEEDS)
def test_fold_in_matches_jax(seed):
    k = R.split(R.PRNGKey(seed))[1]
    jk = jax.random.split(jkey(seed))[1]
    for data in [0, 1, 7, 2**31, 2**32 - 1, np.int32(-1), np.uint32(5), np.array(12, np.int32)]:
        same_bits(R.fold_in(k, data), jax.random.fold_in(jk, data))
    # fold_in(key, i) is split(key, n)[i]: the same counter.
    same_bits(R.fold_in(k, 5), R.split(k, 9)[5])


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 5, 2), (5000,), (3, 0, 2)])
def test_bits_match_jax(shape):
    for seed in SEEDS:
        same_bits(R.bits(R.PRNGKey(seed), shape), jax.random.bits(jkey(seed), shape))


# --- Uniform floats ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (1,), (17,), (4, 6), (10000,)])
def test_uniform_float32_is_jax_bitwise(shape):
    for seed in SEEDS:
        k, jk = R.PRNGKey(seed), jkey(seed)
        got = R.uniform(k, shape)
        assert got.dtype == np.float32
        same_bits(got, jax.random.uniform(jk, shape))
        same_bits(R.uniform(k, shape, minval=-3.5, maxval=2.0),
                  jax.random.uniform(jk, shape, minval=-3.5, maxval=2.0))


def test_uniform_array_bounds_are_jax_bitwise():
    k, jk = R.PRNGKey(7), jkey(7)
    lo = np.array([0.0, -1.0, 10.0], np.float32)
    hi = np.array([[1.0], [3.0]], np.float32)
    same_bits(R.uniform(k, (2, 3), minval=lo, maxval=hi),
              jax.random.uniform(jk, (2, 3), minval=lo, maxval=hi))


def test_uniform_float64_is_jax_x64_bitwise_and_its_documented_construction():
    k = R.PRNGKey(11)
    got = R.uniform(k, (4000,), np.float64)
    assert got.dtype == np.float64
    with jax.enable_x64(True):
        jk = jax.random.PRNGKey(11)
        same_bits(got, jax.random.uniform(jk, (4000,), jnp.float64))
        bounded = np.asarray(jax.random.uniform(jk, (4000,), jnp.float64, -2.0, 3.0))
    # The construction: the two hash words of counter i (split's key i) as hi * 2**-32 +
    # (lo >> 12) * 2**-52, 52 random bits, exact in float64; then scaled in two roundings
    # (JAX fuses them: apart by at most the product's rounding, half an ulp of 5).
    words = R.split(k, 4000).astype(np.float64)
    want = words[:, 0] * 2.0**-32 + np.floor(words[:, 1] / 4096) * 2.0**-52
    same_bits(got, want)
    got_bounded = R.uniform(k, (4000,), np.float64, -2.0, 3.0)
    same_bits(got_bounded, np.maximum(-2.0, want * 5.0 + -2.0))
    np.testing.assert_allclose(got_bounded, bounded, rtol=0, atol=2.0**-51)
    assert (got >= 0).all() and (got < 1).all()
    assert len(np.unique(got)) == 4000


# --- Normal, gumbel, categorical -------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_normal_float32_matches_jax_to_a_few_ulp(seed):
    got = R.normal(R.PRNGKey(seed), (20000,))
    want = np.asarray(jax.random.normal(jkey(seed), (20000,)))
    assert got.dtype == np.float32
    assert max_ulp(got, want) <= 8
    same_bits(R.normal(R.PRNGKey(seed), ()), R.normal(R.PRNGKey(seed), (1,))[0])


def test_normal_float64_matches_jax_x64_and_inverts_erf():
    got = R.normal(R.PRNGKey(5), (20000,), np.float64)
    with jax.enable_x64(True):
        want = np.asarray(jax.random.normal(jax.random.PRNGKey(5), (20000,), jnp.float64))
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    # Independently of JAX: erf(z / sqrt(2)) is the uniform draw it came from.
    lo = np.nextafter(-1.0, 0.0)
    u = R.uniform(R.PRNGKey(5), (20000,), np.float64, lo, 1.0)
    back = np.array([math.erf(z / math.sqrt(2)) for z in got[:3000]])
    np.testing.assert_allclose(back, u[:3000], rtol=0, atol=4e-16)


def test_gumbel_matches_jax():
    got = R.gumbel(R.PRNGKey(3), (20000,))
    np.testing.assert_allclose(got, np.asarray(jax.random.gumbel(jkey(3), (20000,))),
                               rtol=2e-6, atol=1e-6)
    got64 = R.gumbel(R.PRNGKey(3), (5000,), np.float64)
    with jax.enable_x64(True):
        want64 = np.asarray(jax.random.gumbel(jax.random.PRNGKey(3), (5000,), jnp.float64))
    np.testing.assert_allclose(got64, want64, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("case", ["rows", "axis0", "more_samples", "broadcast_batch", "float64"])
def test_categorical_matches_jax(case):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(300, 6)).astype(np.float32)
    logits[::7, 2] = -np.inf  # never drawn
    kwargs = {
        "rows": {},
        "axis0": {"axis": 0},
        "more_samples": {"shape": (4, 300)},
        "broadcast_batch": {"shape": (5, 300)},
        "float64": {},
    }[case]
    if case == "broadcast_batch":
        logits = logits[:1]
    if case == "float64":
        logits = logits.astype(np.float64)
    for seed in SEEDS:
        got = R.categorical(R.PRNGKey(seed), logits, **kwargs)
        assert got.dtype == np.int32
        if case == "float64":
            with jax.enable_x64(True):
                want = jax.random.categorical(jax.random.PRNGKey(seed), logits, **kwargs)
        else:
            want = jax.random.categorical(jkey(seed), logits, **kwargs)
        np.testing.assert_array_equal(got, np.asarray(want))
    if case == "rows":
        assert (got[::7] != 2).all()


# --- Discrete ----------------------------------------------------------------------------


def test_bernoulli_matches_jax():
    for seed in SEEDS:
        k, jk = R.PRNGKey(seed), jkey(seed)
        for p, shape in [(0.5, (1000,)), (0.1, (3, 7)), (0.0, (10,)), (1.0, (10,))]:
            got = R.bernoulli(k, p, shape)
            assert got.dtype == np.bool_
            np.testing.assert_array_equal(got, np.asarray(jax.random.bernoulli(jk, p, shape)))
        p = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(R.bernoulli(k, p), np.asarray(jax.random.bernoulli(jk, p)))
        np.testing.assert_array_equal(R.bernoulli(k, p[0], (5, 4)),
                                      np.asarray(jax.random.bernoulli(jk, p[0], (5, 4))))
    assert not R.bernoulli(R.PRNGKey(0), 0.0, (100,)).any()
    assert R.bernoulli(R.PRNGKey(0), 1.0, (100,)).all()


@pytest.mark.parametrize("bounds", [(0, 10), (-5, 3), (5, 3), (7, 7), (0, 1),
                                    (-(2**31), 2**31 - 1), (-100, 2**30 + 17)])
def test_randint_matches_jax(bounds):
    for seed in SEEDS:
        got = R.randint(R.PRNGKey(seed), (500,), *bounds)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, np.asarray(jax.random.randint(jkey(seed), (500,),
                                                                         *bounds)))
        lo, hi = bounds
        assert (got == lo).all() if hi <= lo else ((got >= lo) & (got < hi)).all()


def test_randint_uint32_and_array_bounds_match_jax():
    k, jk = R.PRNGKey(9), jkey(9)
    got = R.randint(k, (200,), 3, 1000, np.uint32)
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, np.asarray(jax.random.randint(jk, (200,), 3, 1000,
                                                                     jnp.uint32)))
    lo = np.array([0, 10, -3], np.int32)
    hi = np.array([[5], [20]], np.int32)
    np.testing.assert_array_equal(R.randint(k, (2, 3), lo, hi),
                                  np.asarray(jax.random.randint(jk, (2, 3), lo, hi)))
    # A uint32 maxval above int32's range: clipped, with the top reachable (JAX's rule).
    top = np.uint32(2**32 - 1)
    np.testing.assert_array_equal(R.randint(k, (50,), 0, top),
                                  np.asarray(jax.random.randint(jk, (50,), 0, top)))


@pytest.mark.parametrize("x", [10, 1, 0, 5000, "array", "array2d"])
def test_permutation_matches_jax(x):
    if x == "array":
        x = np.linspace(0, 1, 40, dtype=np.float32)
    elif x == "array2d":
        x = np.arange(60).reshape(5, 12).astype(np.int32)
    for seed in SEEDS:
        got = R.permutation(R.PRNGKey(seed), x)
        np.testing.assert_array_equal(got, np.asarray(jax.random.permutation(jkey(seed), x)))
        if np.ndim(x) == 0:
            assert got.dtype == np.int32
            np.testing.assert_array_equal(np.sort(got), np.arange(x))


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
@pytest.mark.parametrize("independent", [False, True])
def test_permutation_axes_match_jax(axis, independent):
    x = np.arange(2 * 3 * 40).reshape(2, 3, 40).astype(np.float64)
    for seed in SEEDS:
        got = R.permutation(R.PRNGKey(seed), x, axis=axis, independent=independent)
        want = jax.random.permutation(jkey(seed), x, axis=axis, independent=independent)
        np.testing.assert_array_equal(got, np.asarray(want))


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_dropout_mask_is_jax_bernoulli_and_scales(rate):
    x = np.random.default_rng(2).normal(size=(64, 33)).astype(np.float32)
    k = R.PRNGKey(4)
    got = pw.nn.dropout(k, rate, x)
    keep = np.asarray(jax.random.bernoulli(jkey(4), 1 - rate, x.shape))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.where(keep, x / np.float32(1 - rate), 0))
    # The mean is kept: about (1 - rate) of the elements survive, scaled up.
    ones = pw.nn.dropout(k, rate, np.ones((200, 200), np.float32))
    assert abs(ones.mean() - 1) < 5 * math.sqrt(rate / (1 - rate) / ones.size)
    # A mask shared along broadcast_dims.
    shared = pw.nn.dropout(k, rate, x, broadcast_dims=(0,))
    keep_row = np.asarray(jax.random.bernoulli(jkey(4), 1 - rate, (1, 33)))
    np.testing.assert_array_equal(shared, np.where(keep_row, x / np.float32(1 - rate), 0))
    assert pw.nn.dropout(k, 0.0, x) is x


# --- Statistics ---------------------------------------------------------------------------


def test_uniform_statistics():
    for dtype in (np.float32, np.float64):
        u = R.uniform(R.PRNGKey(100), (200000,), dtype)
        n = u.size
        assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / n)
        assert abs(u.var() - 1 / 12) < 5 * math.sqrt(1 / 180 / n)
        counts = np.histogram(u, bins=50, range=(0, 1))[0]
        assert chi2(counts, np.full(50, n / 50)) < chi2_bound(49)
        lo = R.uniform(R.PRNGKey(100), (10000,), dtype, -3.0, -1.0)
        assert (lo >= -3).all() and (lo < -1).all()


def normal_cdf(x):
    return 0.5 * (1 + np.vectorize(math.erf)(np.asarray(x) / math.sqrt(2)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normal_statistics(dtype):
    z = R.normal(R.PRNGKey(101), (200000,), dtype).astype(np.float64)
    n = z.size
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs((z**3).mean()) < 5 * math.sqrt(15 / n)  # skewness
    assert abs((z**4).mean() - 3) < 5 * math.sqrt(96 / n)  # kurtosis
    edges = np.concatenate([[-np.inf], np.linspace(-3, 3, 31), [np.inf]])
    counts = np.histogram(z, bins=edges)[0]
    expected = np.diff(normal_cdf(edges)) * n
    assert chi2(counts, expected) < chi2_bound(len(counts) - 1)
    assert np.isfinite(z).all()


def test_gumbel_statistics():
    g = R.gumbel(R.PRNGKey(102), (200000,)).astype(np.float64)
    n = g.size
    euler = 0.5772156649015329
    assert abs(g.mean() - euler) < 5 * math.sqrt(math.pi**2 / 6 / n)
    assert abs(g.var() - math.pi**2 / 6) < 0.05


def test_bernoulli_categorical_and_randint_statistics():
    b = R.bernoulli(R.PRNGKey(103), 0.3, (100000,))
    assert abs(b.mean() - 0.3) < 5 * math.sqrt(0.21 / b.size)
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    c = R.categorical(R.PRNGKey(104), logits, shape=(100000,))
    counts = np.bincount(c, minlength=4)
    assert chi2(counts, np.array([0.1, 0.2, 0.3, 0.4]) * c.size) < chi2_bound(3)
    r = R.randint(R.PRNGKey(105), (100000,), -3, 14)
    counts = np.bincount(r + 3, minlength=17)
    assert len(counts) == 17
    assert chi2(counts, np.full(17, r.size / 17)) < chi2_bound(16)


def test_permutation_statistics():
    # Where element 0 lands, over 3000 keys: uniform over the 6 positions; and every draw a
    # permutation.
    keys = R.split(R.PRNGKey(106), 3000)
    positions = np.zeros(6, np.int64)
    for k in keys:
        p = R.permutation(k, 6)
        assert sorted(p.tolist()) == list(range(6))
        positions[int(np.argmax(p == 0))] += 1
    assert chi2(positions, np.full(6, 500)) < chi2_bound(5)


def test_keys_are_deterministic_and_distinct():
    k = R.PRNGKey(0)
    same_bits(R.normal(k, (10,)), R.normal(k, (10,)))
    children = R.split(k, 100)
    assert len({tuple(c) for c in children} | {tuple(k)}) == 101
    draws = [R.bits(c, (4,)).tolist() for c in children]
    assert len({tuple(d) for d in draws}) == 100
    assert not np.array_equal(R.uniform(R.PRNGKey(1), (10,)), R.uniform(R.PRNGKey(2), (10,)))


# --- The same values everywhere --------------------------------------------------------------

LOGITS = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)

DRAWS = {
    "PRNGKey": lambda k: R.PRNGKey(12345),
    "split": lambda k: R.split(k, (2, 3)),
    "fold_in": lambda k: R.fold_in(k, 123),
    "bits": lambda k: R.bits(k, (3, 7)),
    "uniform": lambda k: R.uniform(k, (3, 5), minval=-1.0, maxval=4.0),
    "uniform_large": lambda k: R.uniform(k, (70, 71)),  # a traced iota of two constants
    "uniform64": lambda k: R.uniform(k, (4, 300), np.float64),
    "normal": lambda k: R.normal(k, (6000,)),
    "normal64": lambda k: R.normal(k, (2000,), np.float64),
    "gumbel": lambda k: R.gumbel(k, (500,)),
    "gumbel64": lambda k: R.gumbel(k, (500,), np.float64),
    "bernoulli": lambda k: R.bernoulli(k, 0.3, (999,)),
    "categorical": lambda k: R.categorical(k, LOGITS, axis=0, shape=(5, 4)),
    "randint": lambda k: R.randint(k, (1000,), -7, 100),
    "permutation": lambda k: R.permutation(k, 3000),
    "permutation_2d": lambda k: R.permutation(k, np.arange(12.0).reshape(3, 4), axis=1,
                                              independent=True),
    "dropout": lambda k: pw.nn.dropout(k, 0.25, np.ones((6, 7), np.float32)),
    "scalar": lambda k: R.normal(k, ()),
}


@pytest.fixture(scope="module")
def tpus1():
    return pw.make_virtual_device_set().add_slice(tpu_devices=1).tpus


@pytest.fixture(scope="module")
def tpus8():
    return pw.make_virtual_device_set().add_slice(tpu_devices=8).tpus


@pytest.mark.parametrize("name", list(DRAWS))
def test_same_values_eagerly_and_on_1_or_8_devices(tpus1, tpus8, name):
    draw = DRAWS[name]
    k = R.fold_in(R.PRNGKey(2024), 3)
    eager = draw(k)
    assert isinstance(eager, np.ndarray)
    same_bits(np.asarray(pw.pmap(draw, devices=tpus1)(k[None]))[0], eager)
    # Replicated, as copies or with in_axes=None: every device draws the eager values.
    replicated = np.asarray(pw.pmap(draw, devices=tpus8)(np.stack([k] * 8)))
    broadcast = np.asarray(pw.pmap(draw, devices=tpus8, in_axes=None)(k))
    for d in range(8):
        same_bits(replicated[d], eager)
        same_bits(broadcast[d], eager)
    same_bits(np.asarray(pw.jit(draw)(k)), eager)
    # Split per device: device d draws what keys[d] draws eagerly, and on one device.
    keys = R.split(k, 8)
    per_device = np.asarray(pw.pmap(draw, devices=tpus8)(keys))
    for d in (0, 5, 7):
        same_bits(per_device[d], draw(keys[d]))
        same_bits(np.asarray(pw.pmap(draw, devices=tpus1)(keys[d][None]))[0], draw(keys[d]))


def test_keys_made_and_folded_on_the_devices(tpus8):
    # A traced seed, and a key folded with the device's index: as eagerly.
    f = pw.pmap(lambda s: (R.PRNGKey(s), R.fold_in(R.PRNGKey(7), pw.axis_index("i")),
                           R.normal(R.fold_in(R.PRNGKey(7), pw.axis_index("i")), (3,))),
                devices=tpus8, axis_name="i")
    seeds = np.array([0, -1, 5, 2**31 - 1, 9, 10, 11, -(2**31)], np.int32)
    keys, folded, noise = (np.asarray(o) for o in f(seeds))
    for d in range(8):
        same_bits(keys[d], R.PRNGKey(int(seeds[d])))
        same_bits(folded[d], R.fold_in(R.PRNGKey(7), d))
        same_bits(noise[d], R.normal(R.fold_in(R.PRNGKey(7), d), (3,)))
    assert len({tuple(n) for n in noise}) == 8


def test_inside_a_program(tpus8):
    step = pw.pmap(lambda k, x: pw.nn.dropout(k, 0.5, x) + R.normal(R.fold_in(k, 1), x.shape),
                   devices=tpus8)

    @pw.program
    def prog(keys, x):
        return step(keys, step(keys, x))

    base = R.PRNGKey(8)
    keys = R.split(base, 8)  # concrete keys at program trace time: numpy
    x = np.ones((8, 16), np.float32)
    got = np.asarray(prog(keys, x))
    for d in range(8):
        eager = x[d]
        for _ in range(2):
            eager = pw.nn.dropout(keys[d], 0.5, eager) + R.normal(R.fold_in(keys[d], 1), (16,))
        same_bits(got[d], eager)


# --- Gradients ----------------------------------------------------------------------------


def test_gradients_flow_around_the_random_values(tpus8):
    def loss(w, k):
        noise = R.normal(k, w.shape)
        u = R.uniform(R.fold_in(k, 1), w.shape, minval=w, maxval=w + 2.0)
        dropped = pw.nn.dropout(R.fold_in(k, 2), 0.5, w * w)
        return (w * noise).sum() + u.sum() + dropped.sum()

    keys = R.split(R.PRNGKey(0), 8)
    w = np.random.default_rng(3).normal(size=(8, 5)).astype(np.float32)
    got = np.asarray(pw.pmap(pw.grad(loss), devices=tpus8)(w, keys))
    for d in range(8):
        k = keys[d]
        keep = R.bernoulli(R.fold_in(k, 2), 0.5, (5,))
        # d/dw of uniform(minval=w, maxval=w+2): floats * 0 + 1 (and max(minval, .)'s tie).
        want = R.normal(k, (5,)) + 1.0 + np.where(keep, 2 * w[d] / 0.5, 0)
        np.testing.assert_allclose(got[d], want, rtol=1e-6)
    # Outside a trace too (grad runs on one device).
    np.testing.assert_allclose(np.asarray(pw.grad(loss)(w[0], keys[0])), got[0], rtol=1e-6)


# --- Errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [
    lambda k: R.split(k), lambda k: R.fold_in(k, 1), lambda k: R.bits(k, (2,)),
    lambda k: R.uniform(k), lambda k: R.normal(k), lambda k: R.bernoulli(k, 0.5, (2,)),
    lambda k: R.gumbel(k), lambda k: R.categorical(k, np.zeros(3, np.float32)),
    lambda k: R.randint(k, (2,), 0, 3), lambda k: R.permutation(k, 4),
    lambda k: pw.nn.dropout(k, 0.5, np.ones(3)),
])
def test_invalid_keys_name_the_key(tpus2, runtime_ok, fn):
    with pytest.raises(TypeError, match=r"key must be a PRNG key.*got dtype int32"):
        fn(np.array([0, 1], np.int32))
    with pytest.raises(TypeError, match=r"key must be a PRNG key.*got dtype float32"):
        fn(np.array([0, 1], np.float32))
    with pytest.raises(ValueError, match=re.escape("key must be a single PRNG key of shape (2,), "
                                                   "got shape (3, 2)")):
        fn(R.split(R.PRNGKey(0), 3))
    with pytest.raises(ValueError, match=re.escape("got shape (4,)")):
        fn(np.zeros(4, np.uint32))
    with pytest.raises(TypeError, match="key must be a PRNG key"):
        fn("not a key")
    # Traced keys too, at trace time.
    with pytest.raises(TypeError, match=r"key must be a PRNG key.*got dtype int32"):
        pw.pmap(fn, devices=tpus2)(np.zeros((2, 2), np.int32))
    with pytest.raises(ValueError, match=re.escape("got shape (3,)")):
        pw.pmap(fn, devices=tpus2)(np.zeros((2, 3), np.uint32))
    runtime_ok()


def test_argument_errors(runtime_ok):
    k = R.PRNGKey(0)
    cases = [
        (lambda: R.PRNGKey(1.5), TypeError, "PRNGKey: seed must be an integer, got float"),
        (lambda: R.PRNGKey(np.zeros(2, np.int32)), TypeError, "PRNGKey: seed must be a scalar"),
        (lambda: R.PRNGKey(2**64), ValueError, "PRNGKey: seed must be within int64"),
        (lambda: R.PRNGKey("0"), TypeError, "PRNGKey: seed must be an integer, got str"),
        (lambda: R.split(k, -1), ValueError, "split: num must be non-negative"),
        (lambda: R.split(k, 1.5), TypeError, "split: num must be an int or a tuple of ints"),
        (lambda: R.fold_in(k, -1), ValueError, r"fold_in: data must be in \[0, 2\*\*32\)"),
        (lambda: R.fold_in(k, 2**32), ValueError, r"fold_in: data must be in \[0, 2\*\*32\)"),
        (lambda: R.fold_in(k, np.arange(2)), TypeError, "fold_in: data must be a scalar"),
        (lambda: R.fold_in(k, 1.5), TypeError, "fold_in: data must be an integer"),
        (lambda: R.bits(k, (2,), np.uint8), ValueError, "bits: dtype must be uint32"),
        (lambda: R.bits(k, (-1,)), ValueError, "bits: negative dimensions are not allowed"),
        (lambda: R.uniform(k, "x"), TypeError, "uniform: shape must be an int or a sequence of ints"),
        (lambda: R.uniform(k, (2,), np.int32), ValueError,
         "uniform: dtype must be float32 or float64, got int32"),
        (lambda: R.uniform(k, (2,), minval=np.zeros(3)), ValueError,
         re.escape("uniform: parameter shapes (3,), () must broadcast to the shape argument (2,)")),
        (lambda: R.normal(k, (2,), np.float16), ValueError, "normal: dtype must be float32 or float64"),
        (lambda: R.bernoulli(k, 1, (2,)), TypeError, "bernoulli: p must be a float"),
        (lambda: R.bernoulli(k, np.zeros(3, np.float32), (2,)), ValueError,
         "bernoulli: parameter shapes"),
        (lambda: R.categorical(k, np.zeros(3, np.int32)), TypeError,
         "categorical: logits must be float32 or float64"),
        (lambda: R.categorical(k, np.zeros((2, 3), np.float32), axis=2), ValueError,
         r"categorical: axis 2 is out of range for logits of shape \(2, 3\)"),
        (lambda: R.categorical(k, np.zeros((2, 3), np.float32), shape=(3,)), ValueError,
         "categorical: parameter shapes"),
        (lambda: R.randint(k, (2,), 0, 3, np.float32), TypeError,
         "randint: dtype must be int32 or uint32"),
        (lambda: R.randint(k, (2,), 0.5, 3), TypeError, "randint: minval must be an integer"),
        (lambda: R.randint(k, (2,), 0, 2**40), ValueError, "randint: maxval 1099511627776 is beyond"),
        (lambda: R.permutation(k, 2.5), TypeError, "permutation: x must be an integer"),
        (lambda: R.permutation(k, -3), ValueError, "permutation: x must be non-negative"),
        (lambda: R.permutation(k, np.zeros((2, 3)), axis=2), ValueError,
         "permutation: axis 2 is out of range"),
        (lambda: pw.nn.dropout(k, 1.0, np.ones(3)), ValueError, r"dropout: rate must be in \[0, 1\)"),
        (lambda: pw.nn.dropout(k, -0.1, np.ones(3)), ValueError, r"dropout: rate must be in \[0, 1\)"),
        (lambda: pw.nn.dropout(k, "0.5", np.ones(3)), TypeError, "dropout: rate must be a number"),
        (lambda: pw.nn.dropout(k, 0.5, np.ones(3), broadcast_dims=(1,)), ValueError,
         "dropout: broadcast dimension 1 is out of range"),
    ]
    for fn, error, message in cases:
        with pytest.raises(error, match=message):
            fn()
    runtime_ok()


def test_program_values_are_refused():
    @pw.program
    def prog(k):
        return R.normal(k, (2,))

    with pytest.raises(pw.TracerError, match=r"pw\.random\.normal of a traced program value"):
        prog(R.PRNGKey(0))
