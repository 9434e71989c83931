"""The interconnect model (issue 11): ICI and DCN latency and bandwidth as
topology keys. A transfer between slices holds its links for latency +
bytes / bandwidth, its destination is ready no earlier, and it shows on the
timeline. Models run in fresh processes (the topology is fixed when the
runtime starts); placement there is deterministic: each slice below fills an
island, so consecutive slices land on islands 0, 1, 2.

Durations are checked from below only: the model enforces the lower bounds,
and a loaded machine can only add to them."""

import json
import math

import numpy as np
import pytest

import pathways as pw
from conftest import run_python

KEYS = ("ici_latency_us", "ici_bandwidth_gbps", "dcn_latency_us", "dcn_bandwidth_gbps")


def _run_json(code: str) -> dict:
    return json.loads(run_python(code).strip().splitlines()[-1])


def test_keys_default_to_zero_which_models_nothing():
    topology = pw.topology()
    assert all(topology[k] == 0.0 for k in KEYS), topology


# Two nodes on two islands (one host each): f's output crosses DCN to g.
_CROSS_ISLAND = """
import json, numpy as np, pathways as pw
pw.configure(islands=2, hosts_per_island=1, devices_per_host=2{keys})
a = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus  # island 0, host 0
b = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus  # island 1, host 1
f = pw.pmap(lambda x: x * 2.0, devices=a)
g = pw.pmap(lambda x: x + 1.0, devices=b)
@pw.program
def p(x):
    return g(f(x))
x = np.arange(2 * 12500, dtype=np.float32).reshape(2, 12500)  # 100000 bytes
np.asarray(p(x))  # compiled and lowered
with pw.timeline() as tl:
    y = np.asarray(p(x))
print(json.dumps({{"exact": bool(np.array_equal(y, x * 2 + 1)), "nbytes": x.nbytes,
                  "islands": [sorted({{d.physical.island for d in s}}) for s in (a, b)],
                  "transfers": tl.transfers(), "gangs": tl.events(), "topology": pw.topology()}}))
"""


def test_without_a_model_transfers_show_on_the_timeline():
    out = _run_json(_CROSS_ISLAND.format(keys=""))
    assert out["exact"] and out["islands"] == [[0], [1]]
    assert all(out["topology"][k] == 0.0 for k in KEYS)
    (t,) = out["transfers"]
    assert t["link"] == "dcn" and t["bytes"] == out["nbytes"]
    assert t["src_devices"] == [0, 1] and t["dst_devices"] == [2, 3]
    assert t["src_hosts"] == [0] and t["dst_hosts"] == [1]
    assert t["end_us"] >= t["start_us"]


def test_dcn_transfer_holds_its_link_for_latency_plus_bytes_over_bandwidth():
    # 100000 bytes at 0.08 Gbit/s (10 MB/s) = 10 ms, after 2 ms of latency.
    out = _run_json(_CROSS_ISLAND.format(keys=", dcn_latency_us=2000, dcn_bandwidth_gbps=0.08"))
    assert out["exact"] and out["islands"] == [[0], [1]]  # the numbers do not change
    topology = out["topology"]
    assert (topology["dcn_latency_us"], topology["dcn_bandwidth_gbps"]) == (2000.0, 0.08)
    assert (topology["ici_latency_us"], topology["ici_bandwidth_gbps"]) == (0.0, 0.0)
    (t,) = out["transfers"]
    assert t["link"] == "dcn" and t["bytes"] == out["nbytes"] == 100000
    modeled_us = 2000 + 100000 * 8 / 0.08e9 * 1e6
    assert t["end_us"] - t["start_us"] >= modeled_us - 1e-3
    # The consumer starts only once the bytes have arrived.
    g_starts = [e["start_us"] for e in out["gangs"] if e["island"] == 1]
    assert len(g_starts) == 2 and min(g_starts) >= t["end_us"] - 1e-3


def test_ici_transfer_holds_device_ports():
    out = _run_json(
        """
import json, numpy as np, pathways as pw
pw.configure(islands=1, hosts_per_island=1, devices_per_host=4, ici_latency_us=1000, ici_bandwidth_gbps=0.08)
a = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
b = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
f = pw.pmap(lambda x: x * 2.0, devices=a)
g = pw.pmap(lambda x: x + 1.0, devices=b)
p = pw.program(lambda x: g(f(x)))
x = np.ones((2, 10000), np.float32)  # 40000 bytes per shard
np.asarray(p(x))
with pw.timeline() as tl:
    y = np.asarray(p(x))
print(json.dumps({"exact": bool(np.array_equal(y, x * 3)), "transfers": tl.transfers()}))
"""
    )
    assert out["exact"]
    (t,) = out["transfers"]
    assert t["link"] == "ici" and t["bytes"] == 80000
    # Shards move in parallel, each on its own pair of ports: one shard's time.
    assert t["end_us"] - t["start_us"] >= 1000 + 40000 * 8 / 0.08e9 * 1e6 - 1e-3


def test_two_dcn_transfers_from_one_host_take_turns_on_its_nic():
    # Three islands of one host: f's output leaves host 0 twice at once, to
    # hosts 1 and 2, so both transfers share host 0's NIC.
    out = _run_json(
        """
import json, numpy as np, pathways as pw
pw.configure(islands=3, hosts_per_island=1, devices_per_host=2, dcn_latency_us=1000, dcn_bandwidth_gbps=0.08)
a, b, c = (pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus for _ in range(3))
f = pw.pmap(lambda x: x * 2.0, devices=a)
g = pw.pmap(lambda x: x + 1.0, devices=b)
h = pw.pmap(lambda x: x - 1.0, devices=c)
@pw.program
def p(x):
    y = f(x)
    return g(y), h(y)
x = np.ones((2, 5000), np.float32)  # 40000 bytes: 1 ms + 4 ms each
pw.block_until_ready(p(x))  # both outputs: a transfer of this run must not end in the timeline
with pw.timeline() as tl:
    u, v = p(x)
    u, v = np.asarray(u), np.asarray(v)
print(json.dumps({"exact": bool(np.array_equal(u, x * 3) and np.array_equal(v, x)),
                  "islands": [sorted({d.physical.island for d in s}) for s in (a, b, c)],
                  "transfers": tl.transfers()}))
"""
    )
    assert out["exact"] and out["islands"] == [[0], [1], [2]]
    transfers = sorted(out["transfers"], key=lambda t: t["start_us"])
    assert [t["src_hosts"] for t in transfers] == [[0], [0]]
    assert sorted(t["dst_hosts"][0] for t in transfers) == [1, 2]
    one_us = 1000 + 40000 * 8 / 0.08e9 * 1e6
    first, second = transfers
    assert second["start_us"] >= first["start_us"] + one_us - 1e-3  # waited for the NIC
    assert second["end_us"] - first["start_us"] >= 2 * one_us - 1e-3


def test_chrome_trace_has_the_transfer(tmp_path):
    path = tmp_path / "trace.json"
    out = run_python(
        _CROSS_ISLAND.format(keys=", dcn_latency_us=500")
        + f"tl.export_chrome_trace({str(path)!r})\n"
    )
    assert json.loads(out.strip().splitlines()[-1])["exact"]
    events = json.loads(path.read_text())["traceEvents"]
    begin = [e for e in events if e["ph"] == "b" and e["cat"] == "transfer"]
    end = [e for e in events if e["ph"] == "e" and e["cat"] == "transfer"]
    assert len(begin) == len(end) == 1
    assert begin[0]["name"] == "dcn 100000 B" and begin[0]["pid"] == 1  # the destination host
    assert end[0]["ts"] - begin[0]["ts"] >= 500 - 1e-3
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert "island 1 / host 1" in names


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, 2e6])
def test_bad_values_raise_value_error_naming_the_key(key, bad):
    # Values are checked before anything else, so this works after the runtime started.
    with pytest.raises(ValueError, match=f"configure: {key} must be"):
        pw.configure(**{key: bad})


@pytest.mark.parametrize("key", ["ici_bandwidth_gbps", "dcn_bandwidth_gbps"])
def test_bandwidth_is_zero_or_at_least_one_mbit(key):
    with pytest.raises(ValueError, match=r"0 \(unlimited\) or a finite number of Gbit/s from 0.001 to 1000000"):
        pw.configure(**{key: 0.0001})


@pytest.mark.parametrize("key", KEYS)
def test_wrong_type_raises_type_error(key):
    with pytest.raises(TypeError, match=f"configure: {key} must be a number"):
        pw.configure(**{key: "20"})


def test_model_is_refused_with_host_processes():
    with pytest.raises(ValueError, match="hosts=in_process only"):
        pw.configure(hosts="local_processes", dcn_latency_us=20)


def test_keys_from_environment():
    out = run_python(
        "import pathways as pw\nt = pw.topology()\nprint(t['ici_latency_us'], t['ici_bandwidth_gbps'], "
        "t['dcn_latency_us'], t['dcn_bandwidth_gbps'])\n",
        env={"PATHWAYS_TOPOLOGY": "islands=1,ici_latency_us=1,ici_bandwidth_gbps=1600,dcn_latency_us=20,"
             "dcn_bandwidth_gbps=200"},
    )
    assert out.split() == ["1.0", "1600.0", "20.0", "200.0"]
