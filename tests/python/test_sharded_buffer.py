"""ShardedBuffer API, device_put, block_until_ready and memory accounting."""

import gc

import numpy as np
import pytest

import pathways as pw
from pathways import _core


def test_device_put_and_attributes(devices_of):
    tpus = devices_of(4)
    x = np.arange(12.0).reshape(4, 3)
    buf = pw.device_put(x, tpus)
    assert isinstance(buf, pw.ShardedBuffer)
    assert buf.shape == (4, 3)
    assert buf.dtype == np.float64
    assert buf.ndim == 2 and buf.size == 12 and buf.nbytes == 96
    assert len(buf) == 4
    assert [d.id for d in buf.devices] == [v.physical.id for v in tpus]
    assert all(isinstance(d, pw.Device) for d in buf.devices)
    assert buf.block_until_ready() is buf
    assert buf.is_ready()
    assert not buf.is_deleted()
    np.testing.assert_array_equal(np.asarray(buf), x)
    assert repr(buf) == repr(x)


def test_device_put_float32_and_physical_devices():
    devs = pw.devices()[:2]
    buf = pw.device_put(np.array([[1.5], [2.5]], np.float32), devs)
    assert buf.dtype == np.float32
    assert [d.id for d in buf.devices] == [d.id for d in devs]
    assert repr(buf) == repr(np.array([[1.5], [2.5]], np.float32))
    np.testing.assert_array_equal(np.asarray(buf, dtype=np.float64), [[1.5], [2.5]])


def test_device_put_list_and_slice(devices_of):
    vslice = pw.make_virtual_device_set().add_slice(tpu_devices=2)
    buf = pw.device_put(np.array([1, 2]), vslice)  # a list would be a pytree of two leaves
    assert buf.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(buf), [1, 2])


def test_outputs_are_futures_that_become_ready(devices_of):
    f = pw.pmap(lambda x: x * 3.0, devices=devices_of(2))
    out = f(np.ones((2, 1000)))
    assert out.shape == (2, 1000) and out.dtype == np.float64  # known before it is ready
    assert pw.block_until_ready(out) is out
    assert out.is_ready()
    np.testing.assert_array_equal(np.asarray(out), np.full((2, 1000), 3.0))


def test_block_until_ready_on_pytree(devices_of):
    f = pw.pmap(lambda x: {"a": x + 1.0, "b": [x * 2.0, None]}, devices=devices_of(2))
    tree = f(np.array([1.0, 2.0]))
    tree["c"] = "not a buffer"
    assert pw.block_until_ready(tree) is tree
    assert tree["a"].is_ready() and tree["b"][0].is_ready()


def test_delete(devices_of, runtime_ok):
    tpus = devices_of(2)
    buf = pw.device_put(np.array([1.0, 2.0]), tpus)
    buf.delete()
    assert buf.is_deleted()
    with pytest.raises(pw.DeletedBufferError, match="deleted"):
        np.asarray(buf)
    f = pw.pmap(lambda x: x + 1.0, devices=tpus)
    with pytest.raises(pw.DeletedBufferError, match="deleted"):
        pw.block_until_ready(f(buf))
    runtime_ok()


def test_delete_output_then_use_in_program(devices_of, runtime_ok):
    f = pw.pmap(lambda x: x + 1.0, devices=devices_of(2))

    @pw.program
    def p(x):
        return f(f(x))

    y = f(np.array([1.0, 2.0]))
    y.block_until_ready()
    y.delete()
    with pytest.raises(pw.DeletedBufferError, match="deleted"):
        pw.block_until_ready(p(y))
    runtime_ok()


def _bytes_in_use():
    gc.collect()
    _core.await_quiescence()
    return pw.memory_stats()["bytes_in_use"]


def test_memory_returned_when_last_reference_goes(devices_of):
    tpus = devices_of(2)
    f = pw.pmap(lambda x: x * 2.0 + 1.0, devices=tpus)
    x = np.ones((2, 100_000))
    f(x).block_until_ready()  # compile and warm up
    before = _bytes_in_use()
    live_before = pw.memory_stats()["live_buffers"]
    out = f(x).block_until_ready()
    buf = pw.device_put(x, tpus)
    during = _bytes_in_use()
    assert during >= before + out.nbytes + buf.nbytes
    assert pw.memory_stats()["live_buffers"] > live_before
    del out, buf
    assert _bytes_in_use() == before


def test_memory_returned_after_delete(devices_of):
    tpus = devices_of(2)
    before = _bytes_in_use()
    buf = pw.device_put(np.ones((2, 50_000)), tpus)
    assert _bytes_in_use() >= before + buf.nbytes
    buf.delete()
    assert _bytes_in_use() == before
    del buf
    assert _bytes_in_use() == before


def test_memory_returned_for_program_intermediates(devices_of):
    a = pw.pmap(lambda x: x * 2.0, devices=devices_of(2))
    b = pw.pmap(lambda x: x + 1.0, devices=devices_of(2))

    @pw.program
    def f(v):
        return b(a(b(a(v))))

    v = np.ones((2, 10_000))
    f(v).block_until_ready()
    before = _bytes_in_use()
    for _ in range(5):
        f(v).block_until_ready()
    assert _bytes_in_use() == before


def test_device_bytes_in_use_counts_shards(devices_of):
    tpus = devices_of(2)
    dev = tpus[0].physical
    gc.collect()
    _core.await_quiescence()
    before = dev.bytes_in_use()
    buf = pw.device_put(np.ones((2, 1000)), tpus)
    buf.block_until_ready()
    assert dev.bytes_in_use() >= before + 8000
    del buf
    gc.collect()
    _core.await_quiescence()
    assert dev.bytes_in_use() == before


def test_transfer_and_scheduler_stats(devices_of):
    stats = pw.transfer_stats()
    for key in (
        "ici_bytes",
        "dcn_bytes",
        "host_bytes",
        "ici_transfers",
        "dcn_transfers",
        "host_transfers",
    ):
        assert isinstance(stats[key], int) and stats[key] >= 0
    before = pw.transfer_stats()["host_bytes"]
    pw.device_put(np.ones((2, 10)), devices_of(2)).block_until_ready()
    assert pw.transfer_stats()["host_bytes"] >= before + 160
    sched = pw.scheduler_stats()
    assert [s["island"] for s in sched] == list(range(pw.topology()["islands"]))
    assert all(s["enqueued"] >= 0 and s["in_flight"] >= 0 for s in sched)


def test_indexing_reads_back_like_numpy(devices_of):
    x = np.arange(12.0).reshape(2, 6)
    buf = pw.pmap(lambda v: v * 2, devices=devices_of(2))(x)
    np.testing.assert_array_equal(buf[1], 2 * x[1])
    assert buf[0, 3] == 6.0
    np.testing.assert_array_equal(buf[:, ::-2], (2 * x)[:, ::-2])
    buf.delete()
    with pytest.raises(pw.DeletedBufferError, match="has been deleted"):
        buf[0]


def test_device_put_of_a_pytree(devices_of):
    tpus = devices_of(2)
    tree = {"w": np.ones((2, 3), np.float32), "b": [np.arange(2), np.full(2, 1.5)], "none": None}
    put = pw.device_put(tree, tpus)
    assert set(put) == {"w", "b", "none"} and put["none"] is None
    assert isinstance(put["w"], pw.ShardedBuffer) and put["w"].dtype == np.float32
    assert put["b"][0].dtype == np.int32  # numpy's int64, as for pmap arguments
    np.testing.assert_array_equal(np.asarray(put["b"][1]), [1.5, 1.5])
