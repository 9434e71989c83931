"""Timelines: the trace the runtime writes is valid trace-event JSON, with no
overlap on a device's track, and its busy time per device matches the
runtime's own accounting (paper Figure 9, Appendix D)."""

import json
import threading

import numpy as np
import pytest

import pathways as pw
from conftest import get_devices


def _step(tpus, microseconds):
    return pw.pmap(
        lambda x: pw.simulated_compute(pw.psum(x, "i") * 0.5 + 1.0, microseconds),
        devices=tpus,
        axis_name="i",
    )


def test_trace_is_valid_and_matches_runtime_accounting(tmp_path):
    # Two clients on overlapping slices, so tracks interleave gangs of both.
    tpus_a, tpus_b = get_devices(4), get_devices(8)
    fa, fb = _step(tpus_a, 50), _step(tpus_b, 30)
    a, b = pw.Client("trace-a"), pw.Client("trace-b")
    pw._core.await_quiescence()
    busy_before = pw.device_busy_seconds()

    def run(client, f, tpus, n):
        with client:
            x = pw.device_put(np.ones(len(tpus)), tpus)
            for _ in range(n):
                x = f(x)
            x.block_until_ready()

    with pw.timeline() as tl:
        threads = [
            threading.Thread(target=run, args=(a, fa, tpus_a, 40)),
            threading.Thread(target=run, args=(b, fb, tpus_b, 40)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    busy_after = pw.device_busy_seconds()

    path = tmp_path / "trace.json"
    tl.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert events
    for ev in events:
        for key in ("name", "ph", "ts", "pid", "tid"):
            assert key in ev, (key, ev)
    complete = [ev for ev in events if ev["ph"] == "X"]
    ours = [ev for ev in complete if ev["cat"] in ("trace-a", "trace-b")]
    assert len(ours) == 40 * 4 + 40 * 8  # one event per gang and device
    names = {ev["args"]["name"] for ev in events if ev["ph"] == "M" and ev["name"] == "thread_name"}
    assert len(names) == len({ev["tid"] for ev in complete})

    by_track = {}
    for ev in complete:
        by_track.setdefault((ev["pid"], ev["tid"]), []).append(ev)
    for track in by_track.values():
        track.sort(key=lambda ev: ev["ts"])
        for prev, nxt in zip(track, track[1:]):
            assert prev["ts"] + prev["dur"] <= nxt["ts"] + 1e-3, (prev, nxt)

    # Busy time per device: the trace vs the runtime's own accounting.
    for (pid, tid), track in by_track.items():
        trace_busy = sum(ev["dur"] for ev in track) * 1e-6
        runtime_busy = busy_after[tid] - busy_before[tid]
        assert trace_busy == pytest.approx(runtime_busy, rel=1e-6, abs=1e-6), tid
        assert trace_busy == pytest.approx(tl.device_busy_seconds()[tid], rel=1e-6)
    # Simulated kernels keep their devices at least that long.
    for ev in ours:
        assert ev["dur"] >= (50 if ev["cat"] == "trace-a" else 30)
    # Grouping: every device's track sits in its host's process.
    info = {d.id: d for d in pw.devices()}
    for pid, tid in by_track:
        assert info[tid].host == pid


def test_timeline_events_name_client_program_and_node():
    tpus = get_devices(2)
    f = _step(tpus, 10)

    @pw.program
    def two_steps(x):
        return f(f(x))

    with pw.Client("named"), pw.timeline() as tl:
        two_steps(np.zeros(2)).block_until_ready()
    events = tl.events()
    assert len(events) == 2 * 2
    assert {e["client"] for e in events} == {"named"}
    assert {e["program"] for e in events} == {"two_steps"}
    assert all(e["end_us"] >= e["start_us"] + 10 for e in events)
    assert {e["device"] for e in events} == {d.physical.id for d in tpus}


def test_timeline_exits_while_others_keep_submitting():
    tpus = get_devices(4)
    f = _step(tpus, 200)
    stop = threading.Event()

    def busy():
        with pw.Client("background"):
            x = pw.device_put(np.zeros(4), tpus)
            while not stop.is_set():  # a client with at most 8 gangs in flight
                for _ in range(8):
                    x = f(x)
                x.block_until_ready()

    worker = threading.Thread(target=busy)
    worker.start()
    exited = threading.Event()

    def record():
        with pw.timeline() as tl:
            f(np.ones(4)).block_until_ready()
        exited.set()
        record.events = tl.events()

    recorder = threading.Thread(target=record)
    recorder.start()
    recorder.join(timeout=30)
    stop.set()
    worker.join(timeout=60)
    assert exited.is_set(), "pw.timeline() did not exit while another client kept submitting"
    assert any(e["client"] == "default" for e in record.events)


def test_the_events_of_one_gang_share_its_number_across_hosts(devices_of):
    # 8 devices span two hosts of 4: with host processes each host records its
    # part of the gang (its own start and end); `gang` groups them.
    wide = pw.pmap(lambda x: pw.simulated_compute(x + 1.0, 100), devices=devices_of(8))
    x = np.zeros(8)
    wide(x).block_until_ready()
    with pw.timeline() as tl:
        y = wide(x)
        y = wide(y)
        y.block_until_ready()
    events = [e for e in tl.events() if e["program"] == "lambda"]
    assert len(events) == 2 * 8  # per gang and device
    by_gang = {}
    for e in events:
        by_gang.setdefault(e["gang"], set()).add(e["device"])
    assert len(by_gang) == 2 and all(len(devs) == 8 for devs in by_gang.values())
    assert len({e["host"] for e in events}) == 2
