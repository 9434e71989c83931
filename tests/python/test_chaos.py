"""The chaos test (issue 28): 60 s of clients training while host processes die and devices fail."""

import json
import pathlib
import sys

import pytest

from conftest import run_python_process

CHAOS = pathlib.Path(__file__).resolve().parent / "chaos.py"


@pytest.mark.in_process_only("runs host processes of its own whatever the suite's hosts; once per suite run")
@pytest.mark.parametrize("seed", [1])
def test_clients_train_through_killed_hosts_and_failed_devices(seed):
    code = (f"import sys, runpy; sys.argv = ['chaos.py', '60', '{seed}']; "
            f"runpy.run_path({str(CHAOS)!r}, run_name='__main__')")
    proc = run_python_process(code, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["wrong"] == 0, report
    assert report["undocumented"] == [], report
    assert report["hung_threads"] == 0, report
    assert report["memory_end"] == report["memory_start"], report
    # The chaos happened, and the work went on through it.
    assert report["kills"] >= 1 and report["kills"] + report["failed_devices"] >= 3, report
    # (A kill may hit a host with no work at the time: one whose slices were
    # remapped away, or a replacement not yet used.)
    assert report["errors"].get("HostLostError", 0) + report["errors"].get("DeviceFailedError", 0) >= 1, report
    assert report["dp_steps"] >= 60 and report["steps"] > 0 and report["recoveries"] >= 1, report
    assert report["dp_recoveries"] >= 1, report  # the data-parallel job went on through a lost replica
    assert report["replacements"] >= 1, report  # a new host process took a killed one's place
    print(json.dumps(report), file=sys.stderr)
