"""The examples run and check what they claim (each asserts its own results)."""

import pathlib
import re

from conftest import run_python

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_data_parallel_mlp_matches_single_device_and_learns():
    out = run_python(
        f"import runpy; runpy.run_path({str(EXAMPLES / 'data_parallel_mlp.py')!r}, "
        "run_name='__main__')"
    )
    diff = float(re.search(r"max relative difference of the losses: (\S+)", out).group(1))
    assert diff < 1e-5
    losses = [float(m.group(1)) for m in re.finditer(r"^\s*\d+\s+(\d+\.\d+)\s+\d+\.\d+", out, re.M)]
    assert len(losses) >= 2 and losses[-1] < 0.5 * losses[0]


def test_pipeline_lm_matches_single_device_losses():
    out = run_python(
        f"import runpy, sys; sys.argv = ['pipeline_lm.py', '--quick']; "
        f"runpy.run_path({str(EXAMPLES / 'pipeline_lm.py')!r}, run_name='__main__')"
    )
    assert "one program per step: 96 nodes" in out
    diff = float(re.search(r"max relative difference of the losses: (\S+)", out).group(1))
    assert diff < 1e-5
    bubble = float(re.search(r"bubble fraction of the last step \(timeline\): (\S+)", out).group(1))
    assert 0.0 <= bubble < 1.0
    assert "OK: the pipeline matches" in out
