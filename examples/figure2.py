# %% [markdown]
# # Figure 2 of the Pathways paper
#
# Three compiled functions, each placed on its own virtual slice of two TPU
# devices, combined by the program tracer into one sharded dataflow program.
# The resource manager spreads the slices over the two islands of the default
# simulated cluster, so the program moves data over ICI (within an island)
# and DCN (across islands). This is the paper's code with `pw.pmap` in place
# of `jax.pmap`; nothing else changed but imports.

# %%
import numpy
import pathways as pw

def get_devices(n):
    """Allocates `n` virtual TPU devices on an island."""
    device_set = pw.make_virtual_device_set()
    return device_set.add_slice(tpu_devices=n).tpus
a = pw.pmap(lambda x: x * 2., devices=get_devices(2))
b = pw.pmap(lambda x: x + 1., devices=get_devices(2))
c = pw.pmap(lambda x: x / 2., devices=get_devices(2))

@pw.program # Program tracing (optional)
def f(v):
    x = a(v)
    y = b(x)
    z = a(c(x))
    return (y, z)

print(f(numpy.array([1., 2.])))
# output: (array([3., 5.]), array([2., 4.]))

# %% [markdown]
# Where it ran. By default every host is a thread of this process; with
# `PATHWAYS_TOPOLOGY=hosts=local_processes` each host is a process of its own
# (pid and loopback address below), and the program's nodes ran there.

# %%
for h in pw.hosts():
    where = f"process {h.pid} at {h.address}" if h.address else "this process"
    print(f"host {h.id} (island {h.island}): {where}")
