"""Elastic re-mapping (paper §4.1) and data-parallel jobs that outlive a host (`pw.elastic`).

    try:
        state = step(state, batch)
    except pw.DeviceFailedError as e:          # pw.HostLostError is one
        print(e.failed_devices, e.lost_slices)  # device ids, slice ids
        pw.elastic.remap()                      # lost slices onto spare devices, if any

A virtual slice maps its virtual devices onto physical ones. When devices
fail (a host process dies: `pw.HostLostError`; or `pw.testing`), `remap`
moves the slice's virtual devices that sit on failed devices onto healthy
devices of its island that it does not use, the least-loaded first (or the
whole slice to another island when its own is short). Functions placed on
the slice keep working: their programs re-lower at their next run (the
compiled kernels are kept; a remap costs a re-lowering, not a compile).
Buffers do not move with a remap: those on failed devices are lost (reading
one raises `pw.DeviceFailedError`); `lost_leaves(tree)` names them.

`Replicas` is the helper for data parallelism: one replica of the state per
slice. After a failure it remaps the lost replicas onto spare devices where
there are any and drops the rest (`recover`), copies the state from a surviving
replica device to device (`replicate`), and splits the global batch over
the replicas left (`split`, `weights`), so the job goes on with the same
global batch, without a checkpoint. `grow` adds a replica back.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import numpy as np

from pathways import _autodiff, _collectives, _core, _devices
from pathways._pmap import pmap
from pathways._program import program
from pathways._pytree import keystr, tree_flatten, tree_flatten_with_path, tree_map, tree_unflatten

__all__ = ["remap", "replace_host", "lost_slices", "lost_leaves", "is_lost", "Replicas", "DataParallel"]


def _slice(x: Any, where: str) -> Any:
    if isinstance(x, _devices.VirtualSlice):
        return x
    raise TypeError(f"{where}: expected a pw.VirtualSlice (from add_slice), got {type(x).__name__}")


def remap(*slices: Any, share: bool = False) -> dict:
    """Re-maps slices off failed devices (paper §4.1).

    Each virtual device on a failed device moves to a spare device of the
    slice's island (one no live slice uses), the least-loaded first; if its
    island has too few, the whole slice moves to another island.

    Args:
      *slices: `pw.VirtualSlice`s; none: every live slice with a virtual
        device on a failed device.
      share: Also take devices other slices use (the resource manager then
        time-shares them, as it does for `add_slice`), least-loaded first.

    Returns:
      `{slice: [indices of its virtual devices that moved]}` for each slice
      (an empty list: nothing of it had failed).

    Raises:
      TypeError: For something that is not a `VirtualSlice`.
      ResourceExhaustedError: When no island has enough spare devices (with
        `share`: healthy ones) for a slice; the message names it and what
        each island has. Slices remapped before it stay remapped; it is
        unchanged.
    """
    targets = [_slice(s, "pw.elastic.remap") for s in slices] if slices else lost_slices()
    return {s: list(_core.remap_slice(s._slice, bool(share))) for s in targets}


def replace_host(host: int, address: Optional[str] = None) -> None:
    """A new host process takes the place of lost host `host` (hosts as processes).

    The new process serves the lost host's devices, which are healthy again
    once this returns: new slices may use them, and a slice on them (a
    replica `Replicas.recover` dropped, say) works again there; `grow` adds
    such a replica back. Buffers that were on the lost process stay lost
    (`is_lost`; reading one raises `pw.HostLostError`). The other hosts keep
    running throughout; no program is recompiled.

    Args:
      host: The lost host's id (`pw.hosts()`, or the `HostLostError`).
      address: Where a host process you started listens (`pathways-host`
        with the cluster's secret); None starts one as the runtime started
        its hosts (hosts="local_processes": on this machine; "ray": on a
        Ray node).

    Raises:
      TypeError: For a host id that is not an int.
      ValueError: For a host id not in the cluster.
      RuntimeError: With hosts in process (there is no process to replace),
        for a service's tenant, for a host that is not lost, or when None
        was given and the runtime did not start its hosts.
      HostLostError: When the new process or another host failed during the
        join (the host stays lost; the started process is stopped).
    """
    if isinstance(host, bool) or not isinstance(host, (int, np.integer)):
        raise TypeError(f"pw.elastic.replace_host: host must be an int, got {type(host).__name__}")
    if address is not None and not isinstance(address, str):
        raise TypeError(f"pw.elastic.replace_host: address must be a str, got {type(address).__name__}")
    host = int(host)
    if _core.topology()["hosts"] == "in_process":
        raise RuntimeError("pw.elastic.replace_host: hosts='in_process' has no host process to replace")
    infos = {h["id"]: h for h in _core.hosts()}
    if host not in infos:
        raise ValueError(f"pw.elastic.replace_host: host {host} is not in the cluster (of {len(infos)} hosts)")
    if infos[host]["alive"]:
        raise RuntimeError(f"pw.elastic.replace_host: host {host} is not lost: only a lost host's place can be "
                           "taken by a new process")
    stop = None
    if address is None:
        from pathways import _hosts

        address, stop = _hosts.launch_replacement()
    try:
        _core.replace_host(host, address)
    except BaseException:
        if stop is not None:
            stop()
        raise


def lost_slices() -> list:
    """The live `VirtualSlice`s (made by `add_slice`) with a virtual device on a failed device, by id."""
    ids = {s.id for s in _core.slices_on_failed_devices()}
    return [s for s in _devices.live_slices() if s.id in ids]


def is_lost(x: Any) -> bool:
    """Whether a `ShardedBuffer` can no longer be read: a shard of it is on a
    failed device, or was on a host process that a new one replaced since
    (`replace_host`)."""
    return isinstance(x, _core.ShardedBuffer) and _core.buffer_lost(x)


def lost_leaves(tree: Any) -> list:
    """The key paths (`pw.tree_util.keystr`) of the `ShardedBuffer` leaves of `tree` on failed devices."""
    return [keystr(path) for path, leaf in tree_flatten_with_path(tree)[0] if is_lost(leaf)]


def _identity(tree: Any) -> Any:
    return tree


class Replicas:
    """The replicas of a data-parallel job: one slice each, the whole state on each.

    Attributes:
      slices: The replicas' `VirtualSlice`s, in order (all of one size).
      dropped: Slices dropped by `recover` (no spare devices for them).
    """

    def __init__(self, slices: Sequence[Any]):
        slices = [_slice(s, "pw.elastic.Replicas") for s in slices]
        if not slices:
            raise ValueError("pw.elastic.Replicas: slices is empty; a job needs at least one replica")
        sizes = {s.size for s in slices}
        if len(sizes) != 1:
            raise ValueError(f"pw.elastic.Replicas: the slices must be of one size, got sizes {sorted(sizes)}")
        self.slices: list = slices
        self.dropped: list = []
        self._copies: dict = {}  # slice id -> pmap'd identity onto it

    @property
    def devices_per_replica(self) -> int:
        return self.slices[0].size

    def healthy(self) -> list:
        """The replicas none of whose devices has failed."""
        return [s for s in self.slices if not any(d.physical.failed for d in s.devices)]

    def replicate(self, tree: Any, onto: Optional[Sequence[Any]] = None) -> list:
        """The state on every replica: one pytree per slice, in the order of `slices`.

        Args:
          tree: The state: a pytree of numpy arrays (each replica gets every
            leaf whole on each of its devices), or one replica's state as
            `replicate` returned it (`ShardedBuffer` leaves), which is copied
            device to device onto every replica (over ICI or DCN, never
            through this process). Pick an intact one with `intact`.
          onto: Only these slices (e.g. the one `grow` added), in this order.

        Raises:
          DeviceFailedError: When a leaf of `tree` is on a failed device.
        """
        targets = self.slices if onto is None else [_slice(s, "pw.elastic.Replicas.replicate") for s in onto]
        leaves, treedef = tree_flatten(tree)
        if not any(isinstance(x, _core.ShardedBuffer) for x in leaves):
            n = self.devices_per_replica
            host = [np.ascontiguousarray(np.stack([np.asarray(x)] * n)) for x in leaves]
            return [tree_unflatten(treedef, [_core.device_put(h, s.devices, None) for h in host])
                    for s in targets]
        out = []
        for s in targets:
            copy = self._copies.get(s.id)
            if copy is None:
                copy = self._copies[s.id] = pmap(_identity, devices=s.devices)
            out.append(copy(tree))
        return out

    def intact(self, states: Sequence[Any]) -> Any:
        """The first of `states` (one pytree per replica) none of whose buffers is lost.

        Raises:
          ValueError: When every one has a buffer on a failed device (then
            only a checkpoint can bring the state back).
        """
        for state in states:
            if not lost_leaves(state):
                return state
        raise ValueError(f"pw.elastic.Replicas.intact: every one of the {len(states)} states has a buffer "
                         "on a failed device; restore from a checkpoint (pw.checkpointing)")

    def recover(self, remap_onto_spares: bool = True) -> dict:
        """After a failure: remaps each lost replica onto spare devices, or drops it.

        Args:
          remap_onto_spares: False drops every lost replica.

        Returns:
          `{"remapped": [slices], "dropped": [slices]}`. Then copy the state
          onto the replicas (`replicate(intact(states))`) and split the
          batch anew (`split`).

        Raises:
          ResourceExhaustedError: When every replica would be dropped (none
            is changed then).
        """
        lost = [s for s in self.slices if any(d.physical.failed for d in s.devices)]
        if len(lost) == len(self.slices) and not remap_onto_spares:
            raise _core.ResourceExhaustedError(
                f"pw.elastic.Replicas.recover: all {len(lost)} replicas are on failed devices; restore "
                "from a checkpoint")
        remapped, dropped = [], []
        for s in lost:
            if remap_onto_spares:
                try:
                    _core.remap_slice(s._slice)
                    remapped.append(s)
                    continue
                except _core.ResourceExhaustedError:
                    pass
            dropped.append(s)
        if len(dropped) == len(self.slices):
            raise _core.ResourceExhaustedError(
                f"pw.elastic.Replicas.recover: all {len(dropped)} replicas are on failed devices and no "
                "island has spare devices for them; restore from a checkpoint")
        self.slices = [s for s in self.slices if s not in dropped]
        self.dropped.extend(dropped)
        return {"remapped": remapped, "dropped": dropped}

    def grow(self, vslice: Any = None) -> Any:
        """Adds a replica: `vslice`, or a dropped one remapped onto healthy devices, or a new slice.

        Returns the slice added. Copy the state onto it with `replicate`.

        Raises:
          ResourceExhaustedError: When there are no healthy devices for it.
        """
        if vslice is None and self.dropped:
            vslice = self.dropped[0]
            _core.remap_slice(vslice._slice)  # raises if there is still no room for it
            self.dropped.pop(0)
        elif vslice is None:
            vslice = _devices.make_virtual_device_set().add_slice(
                **{f"{self.slices[0].kind}_devices": self.devices_per_replica})
        vslice = _slice(vslice, "pw.elastic.Replicas.grow")
        if vslice.size != self.devices_per_replica:
            raise ValueError(f"pw.elastic.Replicas.grow: the slice has {vslice.size} devices; the replicas "
                             f"have {self.devices_per_replica}")
        self.slices.append(vslice)
        return vslice

    def shares(self, global_batch: int) -> list:
        """Examples per replica for a global batch: as even as each replica's devices allow.

        Each replica's share is a multiple of its devices; the first replicas
        take the remainder. ValueError if `global_batch` is not a multiple of
        the devices per replica.
        """
        n = self.devices_per_replica
        if global_batch % n:
            raise ValueError(f"pw.elastic.Replicas: a global batch of {global_batch} does not split over "
                             f"replicas of {n} devices; use a multiple of {n}")
        units, r = global_batch // n, len(self.slices)
        return [n * (units // r + (1 if i < units % r else 0)) for i in range(r)]

    def split(self, batch: Any) -> list:
        """The global batch split over the replicas (`shares`), each `(devices, per device, ...)`."""
        batch = np.asarray(batch)
        out, start = [], 0
        n = self.devices_per_replica
        for share in self.shares(batch.shape[0]):
            out.append(batch[start:start + share].reshape((n, share // n) + batch.shape[1:]))
            start += share
        return out

    def weights(self, global_batch: int) -> list:
        """Each replica's share of a global batch as a fraction: the weights of its mean gradient."""
        return [s / global_batch for s in self.shares(global_batch)]


class DataParallel:
    """Data-parallel training that goes on through the loss of replicas, without a checkpoint.

        job = pw.elastic.DataParallel(loss_fn, update, slices, params, opt_state, global_batch=32)
        for batch in batches:
            loss = job.step(batch)       # the global batch's mean loss

    Each replica (one slice) holds the whole state and takes the loss and
    gradients of its share of the global batch (`loss_fn(params, shard)`,
    averaged over its devices with `pw.pmean`); every replica then adds all
    replicas' gradients, weighted by their shares (the runtime moves them
    between slices: ICI inside an island, DCN across), and applies
    `update(params, opt_state, grads) -> (params, opt_state)`. One
    `@pw.program` per step.

    When a step fails because devices failed (`pw.DeviceFailedError`, e.g. a
    host process died), the survivors' state is intact (the failed step
    changed none of it: buffers are immutable), so `step` recovers
    (`Replicas.recover`: the lost replicas are remapped onto spare devices,
    their state copied there device to device from a survivor, or dropped),
    splits the same global batch over the replicas it has, and runs the step
    again: no step is lost and the loss stays on its curve. `grow` adds a
    replica back. `events` is the timeline: `(seconds since the job began,
    what happened)`.

    Args:
      loss_fn: `(params, batch_shard) -> scalar`, traced per device.
      update: `(params, opt_state, grads) -> (params, opt_state)`.
      slices: The replicas' `VirtualSlice`s, all of one size.
      params, opt_state: Pytrees of numpy arrays (unreplicated).
      global_batch: Examples per step (a multiple of the devices per replica).
      remap_onto_spares: False drops every lost replica instead.
      recover: False: `step` raises the failure instead of recovering (a job
        that restarts from its checkpoints).
      on_event: Called with each new event's text (e.g. `print`).

    Raises:
      ResourceExhaustedError: From `step`, when every replica is lost and
        none can be remapped (restore from a checkpoint then).
      DeviceFailedError: From `step`, when it failed but no replica is
        lost (e.g. a buffer of the batch's on a failed device).
    """

    def __init__(self, loss_fn: Any, update: Any, slices: Sequence[Any], params: Any, opt_state: Any, *,
                 global_batch: int, remap_onto_spares: bool = True, recover: bool = True,
                 on_event: Any = None):
        self._start = time.perf_counter()
        self.replicas = Replicas(slices)
        self.replicas.shares(global_batch)  # checks that it splits
        self.global_batch = int(global_batch)
        self.remap_onto_spares = bool(remap_onto_spares)
        self.recover_failures = bool(recover)
        self.events: list = []
        self._on_event = on_event
        self._loss_fn, self._update = loss_fn, update
        self._grads: dict = {}  # slice id -> pmap'd loss and gradients, kept across remaps
        self._steps: dict = {}  # (slice ids, weights) -> (program, weights)
        self._without_state: set = set()  # slice ids of replicas whose state copy is still to be made
        self.states = dict(zip([s.id for s in self.replicas.slices],
                               zip(self.replicas.replicate(params), self.replicas.replicate(opt_state))))

    def note(self, what: str) -> None:
        """Adds an event to the timeline."""
        self.events.append((time.perf_counter() - self._start, what))
        if self._on_event is not None:
            self._on_event(f"{self.events[-1][0]:8.3f} s  {what}")

    def _grads_on(self, s: Any) -> Any:
        if s.id not in self._grads:
            loss_fn = self._loss_fn

            def replica_grads(p, batch):
                loss, g = _autodiff.value_and_grad(loss_fn)(p, batch)
                return _collectives.pmean(loss, "replica"), tree_map(lambda x: _collectives.pmean(x, "replica"), g)

            self._grads[s.id] = pmap(replica_grads, devices=s.devices, axis_name="replica")
        return self._grads[s.id]

    def _program(self) -> tuple:
        weights = self.replicas.weights(self.global_batch)
        key = (tuple(s.id for s in self.replicas.slices), tuple(weights))
        if key not in self._steps:
            update = self._update

            def combine_and_update(p, state, *grads):
                total = tree_map(lambda *g: sum(w * x for w, x in zip(weights, g)), *grads)
                return update(p, state, total)

            grads = [self._grads_on(s) for s in self.replicas.slices]
            updates = [pmap(combine_and_update, devices=s.devices, axis_name="replica")
                       for s in self.replicas.slices]

            @program
            def dp_step(states, shards):
                outs = [g(st[0], b) for g, st, b in zip(grads, states, shards)]
                new = [u(st[0], st[1], *[gr for _, gr in outs]) for u, st in zip(updates, states)]
                return new, [loss for loss, _ in outs]

            self._steps[key] = (dp_step, weights)
        return self._steps[key]

    def step(self, batch: Any, after_dispatch: Any = None) -> float:
        """One training step on the global batch; returns its mean loss.

        `after_dispatch()`, if given, is called once the step's program is
        dispatched and before its results are awaited (tests and benchmarks
        inject failures there).
        """
        batch = np.asarray(batch)
        if batch.shape[0] != self.global_batch:
            raise ValueError(f"pw.elastic.DataParallel.step: a batch of {batch.shape[0]}; the global batch "
                             f"is {self.global_batch}")
        while True:
            program_, weights = self._program()
            try:
                new, losses = program_([self.states[s.id] for s in self.replicas.slices],
                                       self.replicas.split(batch))
                if after_dispatch is not None:
                    after_dispatch()
                    after_dispatch = None
                loss = sum(w * float(np.asarray(l).reshape(-1)[0]) for w, l in zip(weights, losses))
            except _core.DeviceFailedError as e:
                self.note(f"{type(e).__name__}: failed devices {getattr(e, 'failed_devices', '?')}, lost "
                          f"slices {getattr(e, 'lost_slices', '?')}")
                if not self.recover_failures:
                    raise
                if not self._recover_through_failures():
                    raise  # not a replica's loss: nothing to recover from here
                continue
            for s, st in zip(self.replicas.slices, new):
                self.states[s.id] = tuple(st)
            return loss

    def recover(self) -> dict:
        """Remaps or drops the lost replicas and copies the state onto the remapped ones (see `step`).

        Waits for the copies: a failure while they run (the replica they
        copy from is lost too) raises `DeviceFailedError`, and the replicas
        still without their state get it at the next `recover`.
        """
        what = self.replicas.recover(self.remap_onto_spares)
        for s in what["dropped"]:
            self.states.pop(s.id, None)
            self._without_state.discard(s.id)
        self._without_state.update(s.id for s in what["remapped"])
        self.note(f"remapped slices {[s.id for s in what['remapped']]}, dropped {[s.id for s in what['dropped']]}; "
                  f"{len(self.replicas.slices)} replicas, the global batch split "
                  f"{self.replicas.shares(self.global_batch)}")
        targets = [s for s in self.replicas.slices if s.id in self._without_state]
        if targets:
            self._copy_onto(targets)
            what = dict(what, copied=targets)
        return what

    def _recover_through_failures(self) -> bool:
        """recover(), again as long as a failure interrupts it; whether it found anything to do."""
        did = False
        for _ in range(len(_core.devices())):  # each failure in between fails a device more
            try:
                what = self.recover()
            except _core.DeviceFailedError as e:  # during the copies
                self.note(f"{type(e).__name__} during the recovery: failed devices "
                          f"{getattr(e, 'failed_devices', '?')}")
                did = True
                continue
            return did or bool(what["remapped"] or what["dropped"] or what.get("copied"))
        return self.recover() is not None  # the last failure's error, if it fails again

    def _copy_onto(self, targets: list) -> None:
        """Copies an intact replica's state onto `targets` and waits for it (see `recover`)."""
        self._without_state.update(s.id for s in targets)
        ids = {s.id for s in targets}
        source = self.replicas.intact([self.states[s.id] for s in self.replicas.slices if s.id not in ids])
        params = self.replicas.replicate(source[0], onto=targets)
        opt = self.replicas.replicate(source[1], onto=targets)
        for s, p, o in zip(targets, params, opt):
            for leaf in tree_flatten((p, o))[0]:
                leaf.block_until_ready()  # raises if the copy failed
            self.states[s.id] = (p, o)
            self._without_state.discard(s.id)

    def grow(self, vslice: Any = None) -> Any:
        """Adds a replica (see `Replicas.grow`) and copies the state onto it; returns its slice."""
        added = self.replicas.grow(vslice)
        self._copy_onto([added])
        self.note(f"slice {added.id} joined on devices {[d.id for d in added.physical_devices]}; "
                  f"{len(self.replicas.slices)} replicas")
        return added
