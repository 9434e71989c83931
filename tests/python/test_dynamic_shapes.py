"""Data-dependent shapes (paper §4.5): `pw.compact` and the per-node fallback to sequential dispatch."""

import re

import numpy as np
import pytest

import pathways as pw
from pathways import numpy as pnp


def reference_compact(x, mask):
    n = x.shape[0]
    counts = mask.sum(axis=1).astype(np.int32)
    k = int(counts.max()) if n else 0
    out = np.zeros((n, k) + x.shape[2:], x.dtype)
    for i in range(n):
        rows = x[i][mask[i]]
        out[i, : len(rows)] = rows
    return out, counts


@pytest.mark.parametrize("seed", range(4))
def test_compact_outside_a_program_matches_numpy(tpus2, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 7, 3)).astype(np.float32)
    mask = rng.random((2, 7)) < 0.4
    values, counts = pw.compact(pw.device_put(x, tpus2), mask, devices=tpus2)
    ref_values, ref_counts = reference_compact(x, mask)
    np.testing.assert_array_equal(np.asarray(counts), ref_counts)
    np.testing.assert_array_equal(np.asarray(values), ref_values)
    assert np.asarray(values).dtype == np.float32


def test_in_a_program_consumers_are_traced_for_the_shape_each_call_finds(devices_of):
    devs = devices_of(2)
    score = pw.pmap(lambda x: x * 1.0, devices=devs)
    above = pw.pmap(lambda h, t: h > t, devices=devs)
    total = pw.pmap(lambda v: (v * 2.0, v.sum(axis=0)), devices=devs)

    @pw.program
    def prog(x, threshold):
        h = score(x)
        kept, counts = pw.compact(h, above(h, threshold), devices=devs)
        doubled, sums = total(kept)
        return doubled, sums, counts, h

    x = np.array([[0.1, 0.9, 0.7, 0.2], [0.6, 0.1, 0.8, 0.95]])
    for t in (0.5, 0.15, 0.99):
        threshold = np.full((2, 4), t)
        doubled, sums, counts, h = prog(x, threshold)
        ref, ref_counts = reference_compact(x, x > t)
        np.testing.assert_array_equal(np.asarray(counts), ref_counts)
        np.testing.assert_allclose(np.asarray(doubled), 2 * ref)
        np.testing.assert_allclose(np.asarray(sums), ref.sum(axis=1))
        np.testing.assert_array_equal(np.asarray(h), x)
    # k was 3, 3 and 0: the consumer was compiled for those two shapes, and
    # for the bound (4 rows) when the program was traced.
    shapes = sorted(k[1][0][0] for k in total._cache if not isinstance(k[0], str))
    assert shapes == [(2, 0), (2, 3), (2, 4)]
    # The deferred nodes are not in the static program: score and above only.
    assert prog.trace(x, threshold).num_nodes == 2


def test_the_rest_of_the_program_still_dispatches_in_parallel(devices_of):
    a, b = devices_of(2), devices_of(2)
    slow = pw.pmap(lambda x: pw.simulated_compute(x * 1.0, 100_000), devices=a)  # 100 ms
    positive = pw.pmap(lambda h: h > 0.5, devices=a)
    fast = pw.pmap(lambda y: pw.simulated_compute(y + 1.0, 1_000), devices=b)
    after = pw.pmap(lambda v: v * 3.0, devices=a)

    @pw.program
    def prog(x, y):
        h = slow(x)
        kept, counts = pw.compact(h, positive(h), devices=a)
        for _ in range(4):
            y = fast(y)  # independent of the compaction
        return after(kept), counts, y

    x = np.array([[0.1, 0.9, 0.7], [0.6, 0.2, 0.3]])
    y = np.zeros((2, 5))
    pw.block_until_ready(prog(x, y))  # traced and compiled
    with pw.timeline() as tl:
        out = prog(x, y)
        pw.block_until_ready(out)
    ref, counts = reference_compact(x, x > 0.5)
    np.testing.assert_allclose(np.asarray(out[0]), 3 * ref)
    np.testing.assert_array_equal(np.asarray(out[1]), counts)
    np.testing.assert_array_equal(np.asarray(out[2]), np.full((2, 5), 4.0))
    events = {}
    for e in tl.events():
        events.setdefault(e["node"], []).append(e)
    slow_end = max(e["end_us"] for e in events["lambda"] if e["end_us"] - e["start_us"] >= 90_000)
    fast_runs = [e for e in events["lambda"] if 900 <= e["end_us"] - e["start_us"] < 90_000]
    # Parallel: the independent chain ran while the slow node (and so the
    # compaction's mask) was still being computed.
    assert len(fast_runs) == 4 * 2 and max(e["end_us"] for e in fast_runs) < slow_end
    # The fallback: the gather ran only once the mask existed.
    assert min(e["start_us"] for e in events["gather"]) >= slow_end


def test_nothing_kept_gives_an_empty_axis(tpus2):
    x = pw.device_put(np.ones((2, 4, 2)), tpus2)
    values, counts = pw.compact(x, np.zeros((2, 4), bool), devices=tpus2)
    assert np.asarray(values).shape == (2, 0, 2)
    np.testing.assert_array_equal(np.asarray(counts), [0, 0])


def test_bad_input_raises_clear_errors_and_leaves_the_runtime_usable(tpus2, runtime_ok):
    x = pw.device_put(np.ones((2, 4)), tpus2)
    with pytest.raises(TypeError, match="mask must be bool, got float64"):
        pw.compact(x, np.ones((2, 4)), devices=tpus2)
    with pytest.raises(ValueError, match=re.escape("mask must have shape (2, 4)")):
        pw.compact(x, np.ones((2, 3), bool), devices=tpus2)
    with pytest.raises(ValueError, match="leading device axis and a row axis"):
        pw.compact(pw.device_put(np.ones(2), tpus2), np.ones((2,), bool), devices=tpus2)
    with pytest.raises(pw.TracerError, match="static shapes"):
        pw.pmap(lambda v: pw.compact(v, v > 0), devices=tpus2)(np.ones((2, 3)))
    f = pw.pmap(lambda v: v + 1.0, devices=tpus2)

    @pw.program
    def twice(x, m):
        kept, _ = pw.compact(f(x), m, devices=tpus2)
        return pw.compact(kept, m, devices=tpus2)

    with pytest.raises(pw.TracerError, match="data-dependent shape"):
        twice(np.ones((2, 4)), np.ones((2, 4), bool))

    @pw.program
    def vjp_of_dynamic(x, m):
        kept, _ = pw.compact(f(x), m, devices=tpus2)
        return pw.vjp(f, kept)[0]

    with pytest.raises(pw.TracerError, match="data-dependent shape"):
        vjp_of_dynamic(np.ones((2, 4)), np.ones((2, 4), bool))
    runtime_ok()
