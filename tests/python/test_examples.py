"""The examples run and check what they claim (each asserts its own results)."""

import pathlib
import re

import pathways as pw
from conftest import hosts_env, run_python

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


def run_example(name: str, *args: str) -> str:
    """Runs examples/<name> as a script (its folder first on sys.path) in a fresh
    process, with hosts where this test session has them; returns its stdout."""
    return run_python(
        f"import runpy, sys; sys.path.insert(0, {str(EXAMPLES)!r}); "
        f"sys.argv = [{name!r}, *{list(args)!r}]; "
        f"runpy.run_path({str(EXAMPLES / name)!r}, run_name='__main__')",
        env=hosts_env(),
    )


def test_pipeline_lm_matches_single_device_losses():
    out = run_example("pipeline_lm.py", "--quick")
    assert "one program per step: 96 nodes" in out
    diff = float(re.search(r"max relative difference of the losses: (\S+)", out).group(1))
    assert diff < 1e-5
    bubble = float(re.search(r"bubble fraction of the last step \(timeline\): (\S+)", out).group(1))
    assert 0.0 <= bubble < 1.0
    assert "OK: the pipeline matches" in out


def test_multi_island_dp_matches_one_island():
    out = run_example("multi_island_dp.py", "--quick")
    assert "slice A on island 0, slice B on island 1" in out
    diff = float(re.search(r"max relative difference of the losses: (\S+)", out).group(1))
    assert diff < 1e-5
    transfers = int(re.search(r"DCN transfers: (\d+)", out).group(1))
    assert transfers == 2 * 3  # each island's gradient slices to the other, every step
    assert "OK: two islands over DCN match one island" in out


def test_moe_matches_the_dense_reference_and_drops_over_capacity():
    out = run_example("moe.py", "--quick")
    diff = float(re.search(r"max relative difference of the losses: (\S+)", out).group(1))
    assert diff < 1e-5
    dropped, total = map(int, re.search(r"dropped (\d+) of (\d+)", out).groups())
    assert total == 2 * 64 * 4  # top-2 of every token of the 4 groups
    assert dropped > 0  # the capacity binds, so the check covers dropped tokens too
    assert "OK: the mixture of experts over all_to_all matches" in out


def test_lm_scan_matches_the_unrolled_lm_with_a_fraction_of_the_ir():
    def report(out):
        lines = [int(m) for m in re.search(r"scanned IR lines: (\d+), unrolled IR lines: (\d+)",
                                            out).groups()]
        peaks = [int(m) for m in re.search(r"scanned peak scratch: (\d+), unrolled peak scratch: "
                                            r"(\d+)", out).groups()]
        diff = float(re.search(r"max relative difference of the losses: (\S+)", out).group(1))
        assert diff < 1e-5
        assert "OK: the scanned LM matches the unrolled one" in out
        return lines, peaks

    out = run_example("lm_scan.py", "--quick")
    assert "24-layer LM, training step" in out
    (scanned, unrolled), _ = report(out)
    assert scanned * 10 < unrolled  # one block traced, not 24
    (remat_lines, _), (remat_peak, unrolled_peak) = report(
        run_example("lm_scan.py", "--quick", "--remat"))
    assert remat_lines * 10 < unrolled
    assert remat_peak < unrolled_peak  # the backward recomputes each block: less kept


def test_flax_lm_matches_jax_jit_data_parallel_and_pipelined():
    out = run_example("flax_lm.py", "--quick")
    diffs = [float(d) for d in re.findall(r"max relative difference of the losses: (\S+)", out)]
    assert len(diffs) == 2 and max(diffs) < 1e-5
    assert "one program per step: 11 nodes" in out
    assert "OK: data parallel and the 2-stage pipeline match jax.jit" in out


def test_elastic_dp_goes_on_through_a_killed_host_on_the_same_curve():
    # Its own host processes, whatever the suite's hosts: it kills one.
    out = run_python(
        f"import runpy, sys; sys.path.insert(0, {str(EXAMPLES)!r}); "
        "sys.argv = ['elastic_dp.py', '--quick']; "
        f"runpy.run_path({str(EXAMPLES / 'elastic_dp.py')!r}, run_name='__main__')"
    )
    assert "HostLostError: failed devices [4, 5], lost slices [1]" in out, out
    assert "dropped [1]; 3 replicas, the global batch split [12, 10, 10]" in out, out
    assert re.search(r"host 2: a new process \(pid \d+\) took its place", out), out
    assert "slice 1 is back on host 2, its state copied from a survivor" in out, out
    diff = float(re.search(r"max relative difference of the losses: (\S+)", out).group(1))
    assert diff < 1e-4
    recovery = float(re.search(r"recovery: (\S+) s from the kill", out).group(1))
    assert 0 < recovery
    assert "OK: training went on through the loss of a host" in out, out
