"""pw.checkpointing (issue 28, item 1): checkpoints in Orbax's format, written by the hosts.

Saved and restored here; opened by orbax.checkpoint and tensorstore, and
Orbax's opened by pathways; an interrupted save never reads as complete.
Host processes write and read their own shards (no shard through the
client); a service's tenant writes and reads from its own process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import pathways as pw
from pathways import _checkpoint_io

from conftest import PYTHON_DIR, hosts_env, run_python

pytest.importorskip("tensorstore")

not_service = pytest.mark.not_service("a service's tenant does not have the hosts write or read checkpoints yet")


def _state(devices_of):
    t = devices_of(8)  # an island: 2 hosts of 4 devices
    w = pw.device_put(np.arange(64, dtype=np.float32).reshape(8, 8), t)
    total = pw.pmap(lambda x: pw.psum(x, "i"), axis_name="i", devices=t, out_axes=None)(np.ones((8, 3), np.float32))
    return t, {"params": {"w": w, "total": total}, "step": 7, "lr": np.float32(0.5),
               "layers": [np.arange(3, dtype=np.int32), np.eye(2)]}


@not_service
def test_each_host_writes_its_shards(tmp_path, devices_of):
    t, state = _state(devices_of)
    future = pw.checkpointing.save(tmp_path / "ckpt", state)
    assert future.result(timeout=60) == str(tmp_path / "ckpt")
    hosts = sorted({d.physical.host for d in t})
    assert len(hosts) == 2
    assert sorted(p for p in os.listdir(tmp_path / "ckpt") if p.startswith("ocdbt.process_")) == sorted(
        ["ocdbt.process_client"] + [f"ocdbt.process_h{h}" for h in hosts])  # each host wrote its shards
    # Its own tree: numpy arrays and scalars.
    back = pw.checkpointing.restore(tmp_path / "ckpt")
    np.testing.assert_array_equal(back["params"]["w"], np.arange(64).reshape(8, 8))
    np.testing.assert_array_equal(back["params"]["total"], np.full(3, 8.0))
    assert back["step"] == 7 and back["lr"] == 0.5
    np.testing.assert_array_equal(back["layers"][1], np.eye(2))
    ocp = pytest.importorskip("orbax.checkpoint")
    theirs = ocp.StandardCheckpointer().restore(str(tmp_path / "ckpt"))
    np.testing.assert_array_equal(theirs["params"]["w"], np.arange(64).reshape(8, 8))
    np.testing.assert_array_equal(theirs["params"]["total"], np.full(3, 8.0))


@not_service
def test_restore_onto_devices(tmp_path, devices_of):
    t, state = _state(devices_of)
    pw.checkpointing.save(tmp_path / "ckpt", state).result(timeout=60)
    # Into buffers like the saved ones: on their devices, split or replicated as they are.
    like = {"params": {"w": state["params"]["w"], "total": state["params"]["total"]}, "step": 0,
            "lr": np.float32(0), "layers": [np.zeros(3, np.int32), np.zeros((2, 2))]}
    got = pw.checkpointing.restore(tmp_path / "ckpt", like=like)
    assert isinstance(got["params"]["w"], pw.ShardedBuffer) and not got["params"]["w"].is_replicated
    assert [d.id for d in got["params"]["w"].devices] == [d.physical.id for d in t]
    assert got["params"]["total"].is_replicated
    np.testing.assert_array_equal(np.asarray(got["params"]["w"]), np.arange(64).reshape(8, 8))
    np.testing.assert_array_equal(np.asarray(got["params"]["total"]), np.full(3, 8.0))
    assert got["step"] == 7 and type(got["step"]) is int
    assert got["lr"] == np.float32(0.5) and isinstance(got["lr"], np.float32)
    # The restored buffers compute.
    f = pw.pmap(lambda x: x * 2.0, devices=t)
    np.testing.assert_array_equal(np.asarray(f(got["params"]["w"])), 2 * np.arange(64).reshape(8, 8))


@not_service
def test_restore_reshards_onto_other_devices_and_layouts(tmp_path, devices_of):
    t, state = _state(devices_of)
    pw.checkpointing.save(tmp_path / "ckpt", state).result(timeout=60)
    other = devices_of(8)  # the other island
    assert {d.physical.island for d in other} != {d.physical.island for d in t}
    # w split over the other island's devices; total replicated on 2 devices.
    two = pw.pmap(lambda x: x, devices=devices_of(2), out_axes=None)(np.zeros((2, 3), np.float32))
    like = {"params": {"w": pw.device_put(np.zeros((8, 8), np.float32), other), "total": two}}
    got = pw.checkpointing.restore(tmp_path / "ckpt", like=like)
    assert [d.id for d in got["params"]["w"].devices] == [d.physical.id for d in other]
    np.testing.assert_array_equal(np.asarray(got["params"]["w"]), np.arange(64).reshape(8, 8))
    assert got["params"]["total"].is_replicated and len(got["params"]["total"].devices) == 2
    np.testing.assert_array_equal(np.asarray(got["params"]["total"]), np.full(3, 8.0))
    # The saved split buffer, replicated on 2 devices.
    rep = pw.pmap(lambda x: x, devices=devices_of(2), out_axes=None)(np.zeros((2, 8, 8), np.float32))
    got = pw.checkpointing.restore(tmp_path / "ckpt", like={"params": {"w": rep}})
    assert got["params"]["w"].is_replicated
    np.testing.assert_array_equal(np.asarray(got["params"]["w"]), np.arange(64).reshape(8, 8))
    # The saved replicated buffer, split over 3 devices (a shard each).
    three = pw.device_put(np.zeros(3, np.float32), devices_of(3))
    got = pw.checkpointing.restore(tmp_path / "ckpt", like={"params": {"total": three}})
    assert not got["params"]["total"].is_replicated
    np.testing.assert_array_equal(np.asarray(got["params"]["total"]), np.full(3, 8.0))
    # devices=: the checkpoint's own tree on these devices.
    on = pw.checkpointing.restore(tmp_path / "ckpt", devices=other)
    assert not on["params"]["w"].is_replicated and on["params"]["total"].is_replicated
    np.testing.assert_array_equal(np.asarray(on["params"]["w"]), np.arange(64).reshape(8, 8))
    np.testing.assert_array_equal(np.asarray(on["params"]["total"]), np.full(3, 8.0))
    np.testing.assert_array_equal(np.asarray(on["layers"][0]), np.arange(3))  # 3 != 8 devices: replicated
    assert on["step"] == 7
    # An array of a dtype devices do not hold (Orbax's int64, say) is named.
    pw.checkpointing.save(tmp_path / "i64", {"n": np.arange(8, dtype=np.int64)}).result(timeout=60)
    with pytest.raises(TypeError, match="int64"):
        pw.checkpointing.restore(tmp_path / "i64", devices=other)
    as_i32 = pw.checkpointing.restore(tmp_path / "i64", like={"n": pw.device_put(np.zeros(8, np.int32), other)})
    np.testing.assert_array_equal(np.asarray(as_i32["n"]), np.arange(8))


@not_service
def test_restore_onto_hosts_in_turn_and_another_dtype(tmp_path, devices_of):
    # w's rows onto an island's devices taken host by host in turn: each host
    # holds every other row (positions that are not one run), as int32.
    t, state = _state(devices_of)
    pw.checkpointing.save(tmp_path / "ckpt", state).result(timeout=60)
    island = [d for d in pw.devices() if d.island == 0]
    hosts = sorted({d.host for d in island})
    by_host = [[d for d in island if d.host == h] for h in hosts]
    in_turn = [d for group in zip(*by_host) for d in group][:8]
    assert len({d.host for d in in_turn[:2]}) == 2
    like = {"params": {"w": pw.device_put(np.zeros((8, 8), np.int32), in_turn)}}
    got = pw.checkpointing.restore(tmp_path / "ckpt", like=like)["params"]["w"]
    assert got.dtype == np.int32 and [d.id for d in got.devices] == [d.id for d in in_turn]
    np.testing.assert_array_equal(np.asarray(got), np.arange(64).reshape(8, 8))


@not_service
def test_a_chunk_holds_a_run_of_one_hosts_shards(tmp_path, devices_of):
    # As many rows as keep every chunk one host's (each host's devices, in order).
    assert _checkpoint_io.rows_per_chunk([0, 0, 0, 0, 1, 1, 1, 1]) == 4
    assert _checkpoint_io.rows_per_chunk([0, 0, 1, 1, 1, 1]) == 2
    assert _checkpoint_io.rows_per_chunk([5, 5, 5]) == 3
    assert _checkpoint_io.rows_per_chunk([0, 1, 0, 1]) == 1
    # Hosts taking turns device by device: a chunk per shard; read back onto a run per host.
    t, _ = _state(devices_of)
    island = [d for d in pw.devices() if d.island == 0]
    by_host = [[d for d in island if d.host == h] for h in sorted({d.host for d in island})]
    in_turn = [d for group in zip(*by_host) for d in group][:8]
    data = np.arange(64, dtype=np.float32).reshape(8, 8)
    pw.checkpointing.save(tmp_path / "ckpt", {"w": pw.device_put(data, in_turn)}).result(timeout=60)
    assert _checkpoint_io.open_array(str(tmp_path / "ckpt"), "w", True).chunk_layout.write_chunk.shape == (1, 8)
    got = pw.checkpointing.restore(tmp_path / "ckpt", like={"w": pw.device_put(np.zeros((8, 8), np.float32), t)})
    np.testing.assert_array_equal(np.asarray(got["w"]), data)


@not_service
def test_save_is_asynchronous_and_holds_its_buffers(tmp_path, devices_of):
    t = devices_of(4)
    slow = pw.pmap(lambda x: pw.simulated_compute(x + 1.0, 300_000.0), devices=t)  # 0.3 s
    in_use = pw.memory_stats()["bytes_in_use"]
    x = slow(np.zeros((4, 2), np.float32))
    start = time.monotonic()
    future = pw.checkpointing.save(tmp_path / "ckpt", {"x": x})
    assert time.monotonic() - start < 0.25  # it did not wait for x
    x.delete()  # the caller's handle; the save holds its own
    assert future.result(timeout=60)
    assert pw.memory_stats()["bytes_in_use"] == in_use  # and lets go of it once written
    np.testing.assert_array_equal(pw.checkpointing.restore(tmp_path / "ckpt")["x"], np.ones((4, 2)))


def test_orbax_reads_ours_and_we_read_orbaxs(tmp_path, devices_of):
    ocp = pytest.importorskip("orbax.checkpoint")
    tree = {"a": {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, "l": [np.int32(3), 2.5], "step": 11}
    for compression in (None, "zstd"):
        pw.checkpointing.save(tmp_path / f"ours-{compression}", tree, compression=compression).result(timeout=60)
        theirs = ocp.StandardCheckpointer().restore(str(tmp_path / f"ours-{compression}"))
        np.testing.assert_array_equal(theirs["a"]["w"], tree["a"]["w"])
        assert theirs["step"] == 11 and theirs["l"][1] == 2.5
        with open(tmp_path / f"ours-{compression}" / "_METADATA") as f:
            assert json.load(f)["use_zarr3"] is True
    # Orbax's own, zarr3 (PyTreeCheckpointer) and zarr v2 (StandardCheckpointer's default).
    ocp.PyTreeCheckpointer(use_ocdbt=True, use_zarr3=True).save(str(tmp_path / "z3"), tree)
    standard = ocp.StandardCheckpointer()
    standard.save(str(tmp_path / "z2"), tree)
    standard.wait_until_finished()
    for name in ("z3", "z2"):
        got = pw.checkpointing.restore(tmp_path / name)
        np.testing.assert_array_equal(got["a"]["w"], tree["a"]["w"])
        assert got["step"] == 11 and got["l"] == [3, 2.5]
    if pw.topology()["hosts"] != "service":  # onto devices (by the hosts themselves when they are processes)
        t = devices_of(3)
        for name in ("z3", "z2"):
            like = {"a": {"w": pw.device_put(np.zeros((3, 4), np.float32), t)}}
            got = pw.checkpointing.restore(tmp_path / name, like=like)
            np.testing.assert_array_equal(np.asarray(got["a"]["w"]), tree["a"]["w"])


@not_service
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_tensorstore_opens_ours(tmp_path, devices_of, compression):
    ts = pytest.importorskip("tensorstore")
    _, state = _state(devices_of)
    pw.checkpointing.save(tmp_path / "ckpt", state, compression=compression).result(timeout=60)
    spec = {"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": f"file://{tmp_path / 'ckpt'}/",
                                           "path": "params.w/"}}
    w = ts.open(spec, open=True, read=True).result()
    assert w.shape == (8, 8) and w.chunk_layout.write_chunk.shape == (4, 8)  # a chunk per host's 4 shards
    codecs = w.codec.to_json()["codecs"][0]["configuration"]["codecs"]
    assert [c["name"] for c in codecs] == (["bytes"] if compression is None else ["bytes", "zstd"]), codecs
    np.testing.assert_array_equal(w[4:6].read().result(), np.arange(32, 48).reshape(2, 8))
    restored = pw.checkpointing.restore(tmp_path / "ckpt", like=state)
    np.testing.assert_array_equal(np.asarray(restored["params"]["w"]), np.asarray(state["params"]["w"]))


def test_an_interrupted_save_never_reads_as_complete(tmp_path):
    # A process killed while it writes leaves only PATH.orbax-checkpoint-tmp.
    path = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, "-c", f"""
import numpy as np, pathways as pw, sys
f = pw.checkpointing.save({str(path)!r}, {{f"a{{i}}": np.random.rand(1_000_000) for i in range(40)}})
print("saving", flush=True)
f.result()
"""], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(PYTHON_DIR)})
    assert proc.stdout.readline().strip() == "saving"
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not path.exists()
    tmp = str(path) + _checkpoint_io.TMP_SUFFIX
    assert os.path.isdir(tmp)
    with pytest.raises(ValueError, match="did not finish"):
        pw.checkpointing.restore(tmp)
    with pytest.raises(FileNotFoundError):
        pw.checkpointing.restore(path)
    # The next save to the same path starts over.
    pw.checkpointing.save(path, {"a": np.ones(3)}).result(timeout=60)
    assert not os.path.exists(tmp)
    np.testing.assert_array_equal(pw.checkpointing.restore(path)["a"], np.ones(3))


@not_service
def test_a_failed_save_leaves_nothing(tmp_path):
    # In a process of its own: a failed device stays failed for the runtime's life.
    path = tmp_path / "ckpt"
    out = run_python(f"""
import os
import numpy as np, pathways as pw
t = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
bad = pw.pmap(lambda x: pw.simulated_compute(x, 100_000.0), devices=t)(np.zeros(2, np.float32))
pw.testing.fail_device(t[0])
future = pw.checkpointing.save({str(path)!r}, {{"x": bad}})
try:
    future.result(timeout=60)
    print("saved")
except pw.DeviceFailedError as e:
    print("DeviceFailedError")
print(os.path.exists({str(path)!r}), os.path.exists({str(path) + _checkpoint_io.TMP_SUFFIX!r}))
f = pw.pmap(lambda x: x + 1.0, devices=pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus)
print(np.asarray(f(np.zeros(2, np.float32))).tolist())
""", env=hosts_env())
    assert out.split("\n")[:3] == ["DeviceFailedError", "False False", "[1.0, 1.0]"], out


def test_bad_input_is_named(tmp_path, runtime_ok):
    with pytest.raises(TypeError, match="path must be a str"):
        pw.checkpointing.save(3, {"a": np.ones(2)})
    with pytest.raises(ValueError, match="no leaves"):
        pw.checkpointing.save(tmp_path / "e", {})
    with pytest.raises(TypeError, match=r"the leaf at \['a'\] is a object"):
        pw.checkpointing.save(tmp_path / "o", {"a": object()})
    with pytest.raises(ValueError, match="'a.b'"):
        pw.checkpointing.save(tmp_path / "k", {"a.b": np.ones(2)})
    with pytest.raises(ValueError, match=r"compression must be one of \[None, 'zstd'\], got 'lz4'"):
        pw.checkpointing.save(tmp_path / "c", {"a": np.ones(2)}, compression="lz4")
    pw.checkpointing.save(tmp_path / "ok", {"a": np.ones(2)}).result(timeout=60)
    with pytest.raises(FileExistsError):
        pw.checkpointing.save(tmp_path / "ok", {"a": np.ones(2)})
    with pytest.raises(ValueError, match="has no array 'b'"):
        pw.checkpointing.restore(tmp_path / "ok", like={"b": np.ones(2)})
    with pytest.raises(ValueError, match=r"has shape \(2,\) in the checkpoint, like's is \(3,\)"):
        pw.checkpointing.restore(tmp_path / "ok", like={"a": np.ones(3)})
    with pytest.raises(FileNotFoundError):
        pw.checkpointing.restore(tmp_path / "none")
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        pw.checkpointing.restore(tmp_path / "empty")
    with pytest.raises(ValueError, match="not both"):
        pw.checkpointing.restore(tmp_path / "ok", like={"a": np.ones(2)}, devices=pw.devices()[:2])
    with pytest.raises(TypeError, match="like's leaf for 'a'"):
        pw.checkpointing.restore(tmp_path / "ok", like={"a": "text"})
    runtime_ok()


def test_a_service_tenant_writes_and_reads_from_its_own_process(tmp_path, devices_of):
    """The hosts are the service's: a tenant's checkpoint goes through the
    tenant (its buffers fetched and put over its own sessions with the
    hosts), in the same format, split and replicated buffers alike."""
    if pw.topology()["hosts"] != "service":
        pytest.skip("a service's tenant only")
    devs = devices_of(2)
    x = pw.device_put(np.arange(8, dtype=np.float32).reshape(2, 4), devs)
    r = pw.pmap(lambda v: v * 2.0, out_axes=None, devices=devs)(np.ones((2, 3), np.float32))
    pw.checkpointing.save(tmp_path / "ckpt", {"x": x, "r": r, "step": 7}).result(timeout=60)
    assert not os.path.exists(str(tmp_path / "ckpt") + _checkpoint_io.TMP_SUFFIX)
    back = pw.checkpointing.restore(tmp_path / "ckpt", like={"x": x, "r": r, "step": 0})
    assert isinstance(back["x"], pw.ShardedBuffer) and [d.id for d in back["x"].devices] == [d.id for d in x.devices]
    np.testing.assert_array_equal(np.asarray(back["x"]), np.arange(8).reshape(2, 4))
    np.testing.assert_array_equal(np.asarray(back["r"]), np.full(3, 2.0))
    assert back["r"].is_replicated and back["step"] == 7
    np.testing.assert_array_equal(pw.checkpointing.restore(tmp_path / "ckpt")["x"], np.arange(8).reshape(2, 4))


def _client_bytes_read() -> int:
    """Bytes this process has read through read(2)-like calls (tensorstore's file reads count here)."""
    with open("/proc/self/io", encoding="ascii") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_no_shard_passes_through_the_client(tmp_path, devices_of):
    if pw.topology()["hosts"] != "local_processes":
        pytest.skip("host processes only: in process, the client is the hosts")
    if not os.path.exists("/proc/self/io"):
        pytest.skip("needs /proc/self/io")
    t = devices_of(8)  # 2 hosts
    data = np.random.default_rng(0).standard_normal((8, 256 * 1024)).astype(np.float32)  # 8 MiB, 7.4 zstd'd
    size = data.nbytes
    w = pw.device_put(data, t)
    rep = pw.pmap(lambda x: x, devices=t, out_axes=None)(np.broadcast_to(data[0], (8,) + data[0].shape).copy())
    pw.checkpointing.save(tmp_path / "ckpt", {"w": w, "rep": rep}).result(timeout=120)
    put_before = pw.transfer_stats()["host_bytes"]
    read_before = _client_bytes_read()
    got = pw.checkpointing.restore(tmp_path / "ckpt", like={"w": w, "rep": rep})
    read = _client_bytes_read() - read_before
    assert pw.transfer_stats()["host_bytes"] == put_before  # nothing put from here
    assert read < size // 8, f"the client read {read} bytes restoring {size + data[0].nbytes}"
    np.testing.assert_array_equal(np.asarray(got["w"]), data)
    np.testing.assert_array_equal(np.asarray(got["rep"]), data[0])
    # The measure sees reads through the client: restoring as numpy reads the files here.
    read_before = _client_bytes_read()
    as_numpy = pw.checkpointing.restore(tmp_path / "ckpt")
    assert _client_bytes_read() - read_before >= size // 2
    np.testing.assert_array_equal(as_numpy["w"], data)


def _hosts_data_files(path) -> list:
    """The files of the hosts' databases that hold array data (chunks of more than 1 KiB are not inlined)."""
    return [os.path.join(root, name) for root, _, files in os.walk(path)
            if os.path.basename(root) == "d" and "ocdbt.process_h" in root for name in files]


@not_service
def test_a_corrupt_checkpoint_is_named_and_the_runtime_goes_on(tmp_path, devices_of, runtime_ok):
    t = devices_of(8)
    w = pw.device_put(np.arange(8 * 1024, dtype=np.float32).reshape(8, 1024), t)  # 4 KiB a shard
    rep = pw.pmap(lambda x: x, devices=t, out_axes=None)(np.ones((8, 2048), np.float32))
    state = {"w": w, "rep": rep}
    for name, corrupt in (("cut", lambda f: os.truncate(f, 8)), ("gone", os.remove)):
        pw.checkpointing.save(tmp_path / name, state).result(timeout=60)
        files = _hosts_data_files(tmp_path / name)
        assert files
        for f in files:
            corrupt(f)
        live = pw.memory_stats()["live_buffers"]
        with pytest.raises(ValueError, match=r"cannot read the array '(w|rep)' of the checkpoint"):
            pw.checkpointing.restore(tmp_path / name, like=state)
        assert pw.memory_stats()["live_buffers"] == live  # the failed restore's buffers are gone
        runtime_ok()
    # The runtime restores a good one after.
    pw.checkpointing.save(tmp_path / "good", state).result(timeout=60)
    got = pw.checkpointing.restore(tmp_path / "good", like=state)
    np.testing.assert_array_equal(np.asarray(got["w"]), np.arange(8 * 1024).reshape(8, 1024))
    np.testing.assert_array_equal(np.asarray(got["rep"]), np.ones(2048))
    runtime_ok()


@not_service
def test_a_checkpoint_replaced_at_its_path_is_read_anew(tmp_path, devices_of):
    # Saved, restored, removed and saved again at the same path, by the same
    # processes (the hosts live as long as the client): nothing stale is read.
    import shutil

    t = devices_of(8)
    path = tmp_path / "latest"
    for k, shape in enumerate([(8, 1024), (8, 1024), (8, 16)]):
        data = np.full(shape, float(k), np.float32)
        w = pw.device_put(data, t)
        pw.checkpointing.save(path, {"w": w, "v": data}).result(timeout=60)
        got = pw.checkpointing.restore(path, like={"w": w, "v": data})
        np.testing.assert_array_equal(np.asarray(got["w"]), data)
        np.testing.assert_array_equal(got["v"], data)
        shutil.rmtree(path)
