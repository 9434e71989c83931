"""Native code for fused loops (csrc/codegen): tiers, the disk cache, the switches.

Each test runs in its own process with its own kernel cache directory, so
what it counts (compiles, cache hits) is its own.
"""

from __future__ import annotations

import json

import pytest

from conftest import run_python, run_python_process

# Softmax and a layer norm over rows, run a few times, then the native code
# is waited for and the results compared with numpy; prints the compiler's
# counts as JSON on the last line.
PROGRAM = """
    import json
    import numpy as np
    import pathways as pw
    import pathways.numpy as pnp

    def softmax_and_norm(x, g):
        e = pnp.exp(x - x.max(axis=-1, keepdims=True))
        s = e / e.sum(axis=-1, keepdims=True)
        m = x.mean(axis=-1, keepdims=True)
        v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
        return s, (x - m) * pnp.rsqrt(v + 1e-5) * g

    tpu = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
    f = pw.pmap(softmax_and_norm, devices=tpu)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 64, 300)).astype(np.float32)
    g = rng.standard_normal((2, 300)).astype(np.float32)
    for _ in range(3):
        pw.block_until_ready(f(x, g))
    pw.wait_for_native_kernels()
    s, n = [np.asarray(o) for o in f(x, g)]
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(s, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    np.testing.assert_allclose(n, (x - m) / np.sqrt(v + 1e-5) * g[:, None], rtol=1e-4, atol=1e-5)
    print(json.dumps(pw.native_kernel_stats()))
"""


def _stats(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_a_function_run_often_enough_is_compiled_and_a_second_process_finds_it_cached(tmp_path):
    env = {"PATHWAYS_KERNEL_CACHE": str(tmp_path)}
    first = _stats(run_python(PROGRAM, env=env))
    assert first["enabled"] and first["compiled"] >= 1 and first["failed"] == 0, first
    assert list(tmp_path.glob("*.so")), "no library in the cache"
    second = _stats(run_python(PROGRAM, env=env))
    assert second["compiled"] == 0 and second["cache_hits"] >= 1, second


def test_a_corrupted_cache_entry_is_rebuilt(tmp_path):
    env = {"PATHWAYS_KERNEL_CACHE": str(tmp_path)}
    run_python(PROGRAM, env=env)
    for so in tmp_path.glob("*.so"):
        so.write_bytes(b"\x7fELF truncated")
    stats = _stats(run_python(PROGRAM, env=env))
    assert stats["rebuilt"] >= 1 and stats["failed"] == 0, stats


def test_a_function_run_once_is_not_compiled(tmp_path):
    code = """
        import json
        import numpy as np
        import pathways as pw
        tpu = pw.make_virtual_device_set().add_slice(tpu_devices=1).tpus
        f = pw.pmap(lambda a, b: (a * 2 + b) * a - 1, devices=tpu)
        np.asarray(f(np.ones((1, 1000), np.float32), np.ones((1, 1000), np.float32)))
        pw.wait_for_native_kernels()
        print(json.dumps(pw.native_kernel_stats()))
    """
    stats = _stats(run_python(code, env={"PATHWAYS_KERNEL_CACHE": str(tmp_path)}))
    assert stats["compiled"] == 0 and stats["cache_hits"] == 0, stats


def test_native_kernels_off_keeps_the_interpreter(tmp_path):
    out = run_python(PROGRAM, env={"PATHWAYS_KERNEL_CACHE": str(tmp_path),
                                   "PATHWAYS_NATIVE_KERNELS": "0"})
    stats = _stats(out)
    assert not stats["enabled"] and stats["compiled"] == 0, stats
    assert not list(tmp_path.glob("*.so"))


@pytest.mark.parametrize("compiler", ["/nonexistent/c++", "no-such-compiler"])
def test_no_compiler_is_one_warning_and_the_interpreter(tmp_path, compiler):
    proc = run_python_process(PROGRAM, env={"PATHWAYS_KERNEL_CACHE": str(tmp_path),
                                            "PATHWAYS_CXX": compiler})
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "no C++ compiler" in line]
    assert len(warnings) == 1, proc.stderr
    assert compiler in warnings[0]
    stats = _stats(proc.stdout)
    assert stats["compiled"] == 0 and stats["failed"] >= 1, stats


def test_a_compiler_that_fails_leaves_the_interpreter_running(tmp_path):
    # `false` exits 1 on every compile: each function stays interpreted.
    proc = run_python_process(PROGRAM, env={"PATHWAYS_KERNEL_CACHE": str(tmp_path),
                                            "PATHWAYS_CXX": "false"})
    assert proc.returncode == 0, proc.stderr
    stats = _stats(proc.stdout)
    assert stats["compiled"] == 0 and stats["failed"] >= 1, stats
