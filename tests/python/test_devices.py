"""Topology, physical devices and virtual device sets (resource manager, §4.1)."""

import os

import numpy as np
import pytest

import pathways as pw


@pytest.fixture(autouse=True)
def _default_topology():
    if os.environ.get("PATHWAYS_TOPOLOGY"):
        pytest.skip("these tests expect the default topology")


def test_default_topology():
    topo = pw.topology()
    assert topo["islands"] == 2
    assert topo["hosts_per_island"] == 2
    assert topo["devices_per_host"] == 4
    assert topo["device_memory"] > 0
    assert topo["executor_threads"] >= 1
    # The two views of where hosts run agree.
    if pw.hosts()[0].address is None:
        assert topo["hosts"] == "in_process"
    else:
        assert topo["hosts"] in ("local_processes", "service")


def test_physical_devices():
    devs = pw.devices()
    assert len(devs) == 16
    assert [d.id for d in devs] == list(range(16))
    assert all(isinstance(d, pw.Device) for d in devs)
    assert {d.kind for d in devs} == {"tpu"}
    assert [d.island for d in devs] == [0] * 8 + [1] * 8
    assert devs[3] == pw.devices()[3] and hash(devs[3]) == hash(pw.devices()[3])
    assert devs[3] != devs[4]
    assert [d.host for d in devs] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4  # global host ids
    assert repr(devs[9]) == "TpuDevice(id=9, island=1, host=2)"
    assert devs[0].memory_capacity == pw.topology()["device_memory"]


def test_virtual_device_set_and_slice():
    device_set = pw.make_virtual_device_set()
    assert isinstance(device_set, pw.VirtualDeviceSet)
    assert device_set.slices == []
    s = device_set.add_slice(tpu_devices=4)
    assert isinstance(s, pw.VirtualSlice)
    assert device_set.slices == [s] and len(device_set) == 1
    assert s.size == 4 and len(s) == 4
    assert s.kind == "tpu"
    assert isinstance(s.id, int)
    assert s.island in (0, 1)
    assert len(s.tpus) == 4 and s.tpus == s.devices
    assert all(isinstance(v, pw.VirtualDevice) for v in s.tpus)
    assert [v.index for v in s.tpus] == [0, 1, 2, 3]
    assert [v.physical for v in s.tpus] == s.physical_devices
    assert all(d.island == s.island for d in s.physical_devices)
    assert len({d.id for d in s.physical_devices}) == 4
    assert all(v.kind == "tpu" for v in s.tpus)
    assert f"id={s.id}" in repr(s) and "island=" in repr(s) and "size=4" in repr(s)
    assert list(iter(s)) == s.devices
    s2 = device_set.add_slice(tpu_devices=1)
    assert device_set.slices == [s, s2] and s2.id != s.id


def test_virtual_devices_compare_by_slice_and_index():
    s = pw.make_virtual_device_set().add_slice(tpu_devices=2)
    t = pw.make_virtual_device_set().add_slice(tpu_devices=2)
    assert s.tpus[0] == s.tpus[0] and s.tpus[0] != s.tpus[1]
    assert s.tpus[0] != t.tpus[0]
    assert len({s.tpus[0], s.tpus[0], s.tpus[1]}) == 2


def test_slices_are_placed_on_least_loaded_island(python_subprocess):
    # In a fresh process, so that no other slice is alive.
    out = python_subprocess(
        """
import pathways as pw
slices = [pw.make_virtual_device_set().add_slice(tpu_devices=n) for n in (8, 8, 2, 2, 2)]
print([s.island for s in slices])
print([[d.id for d in s.physical_devices] for s in slices[2:]])
"""
    )
    islands, physical = out.splitlines()
    assert islands == "[0, 1, 0, 1, 0]"
    # Least-loaded devices of the island, in id order among equals.
    assert physical == "[[0, 1], [8, 9], [2, 3]]"


def test_slices_can_share_physical_devices():
    device_set = pw.make_virtual_device_set()
    slices = [device_set.add_slice(tpu_devices=4) for _ in range(8)]
    physical = [d.id for s in slices for d in s.physical_devices]
    assert len(physical) == 32 and len(set(physical)) <= 16  # multiplexed
    # Functions on overlapping slices all compute correctly.
    fns = [pw.pmap(lambda x, k=k: x * float(k), devices=s.tpus) for k, s in enumerate(slices)]
    x = np.arange(4.0)
    for k, f in enumerate(fns):
        np.testing.assert_array_equal(np.asarray(f(x)), x * k)


def test_tpus_of_other_kind_raises():
    s = pw.make_virtual_device_set().add_slice(tpu_devices=1)
    object.__setattr__(s, "kind", "gpu")
    with pytest.raises(AttributeError, match="has gpu devices, not tpus"):
        s.tpus  # noqa: B018
