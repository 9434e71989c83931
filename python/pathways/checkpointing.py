"""Checkpoints of pytrees of ShardedBuffers, in Orbax's format (`pw.checkpointing`).

    future = pw.checkpointing.save("/ckpt/step_100", {"params": params, "step": 100})
    ...                                   # training goes on while it is written
    future.result()                       # the path, once the checkpoint is complete
    state = pw.checkpointing.restore("/ckpt/step_100", like={"params": params, "step": 0})

A checkpoint is a directory as `orbax.checkpoint` writes it (tensorstore
zarr3 arrays in an OCDBT database; see pathways._checkpoint_io), so
`orbax.checkpoint` and `tensorstore` open a pathways checkpoint, and
`restore` opens theirs. Every shard is written by the host that holds it,
into a database of its own, and restored onto devices by the host that
will hold it, reading its region of the array (in process, the hosts are
this process's). A service's tenant writes and reads from its own process
instead (the hosts are the service's: they write files only for their
owner), fetching and putting its buffers' shards over its own sessions with
the hosts; the checkpoint is the same. The checkpoint is built under PATH + ".orbax-checkpoint-tmp" and renamed to
PATH once complete, so an interrupted save never leaves a checkpoint that
reads as complete.

(`pw.checkpoint` is JAX's rematerialization, not this.)
"""

from __future__ import annotations

import concurrent.futures
import json
import numbers
import os
from typing import Any, Optional, Sequence

import numpy as np

from pathways import _checkpoint_io as io
from pathways import _core, _pytree

__all__ = ["save", "restore"]

_executor: list = []


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    # Its threads are joined at exit: a save in flight finishes first.
    if not _executor:
        _executor.append(concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="pw-checkpoint"))
    return _executor[0]


def _names(path: tuple, where: str) -> tuple:
    """(names, key types) of a leaf's key path, as Orbax records them."""
    names, types = [], []
    for k in path:
        if isinstance(k, _pytree.SequenceKey):
            names.append(str(k.idx))
            types.append(io.KEY_SEQUENCE)
        elif isinstance(k, _pytree.FlattenedIndexKey):
            names.append(str(k.key))
            types.append(io.KEY_SEQUENCE)
        elif isinstance(k, _pytree.GetAttrKey):
            names.append(k.name)
            types.append(io.KEY_DICT)
        else:
            names.append(str(k.key))
            types.append(io.KEY_DICT)
    for n in names:
        if not n or "." in n or "/" in n:
            raise ValueError(f"{where}: the key {n!r} of the leaf at {_pytree.keystr(path)} cannot name an array "
                             "of a checkpoint (keys join with '.' into array names: no '.', '/' or empty key)")
    return tuple(names), tuple(types)


def _path_arg(where: str, path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{where}: path must be a str or os.PathLike, got {path!r}")
    path = os.fspath(path)
    if not path:
        raise ValueError(f"{where}: path must not be empty")
    return os.path.abspath(path).rstrip("/")


def _hosts_mode() -> str:
    return _core.topology()["hosts"]


def _hosts_do_io() -> bool:
    """Whether host processes write and read the shards (their owner's), not this process."""
    return _hosts_mode() not in ("in_process", "service")


class _Leaf:
    """One leaf to write: its array name, key path, value type and who writes which part."""

    def __init__(self, names: tuple, types: tuple, value_type: str, compression: Optional[str]):
        self.names, self.types, self.value_type = names, types, value_type
        self.key = ".".join(names)
        self.compression = compression


def save(path: Any, tree: Any, *, compression: Optional[str] = None) -> concurrent.futures.Future:
    """Writes `tree` to a new checkpoint at `path`, in the background.

    Every `ShardedBuffer` is written by the hosts that hold its shards (a
    chunk per run of a host's shards, and a replicated buffer once, by its
    first device's host); numpy arrays and Python or numpy scalars are
    written by this process. The buffers are held until written: the
    caller may go on, delete its handles and dispatch more work. The
    checkpoint is complete (and named `path`) when the future is done.

    Args:
      path: A directory that does not exist yet (its parent may not either).
      tree: A pytree (dicts, lists, tuples, namedtuples, registered nodes) of
        `ShardedBuffer`s, numpy arrays and Python or numpy scalars. Its keys
        name the arrays, joined with "." ("params.w"), as Orbax does.
      compression: None: each chunk's bytes as they are; "zstd": zstd level
        3 (Orbax's default), which costs the CPU time of the save and the
        restore and shrinks float weights little (about 8%). Either way
        `orbax.checkpoint` and `tensorstore` read it (the codecs are in
        each array's zarr.json).

    Returns:
      A `concurrent.futures.Future` whose result is the checkpoint's path;
      its exception is what failed (a buffer's producer, the disk). A save
      that failed leaves no directory named `path`.

    Raises:
      TypeError: For a path that is not one, or a leaf of another type.
      ValueError: For an empty tree, a key that cannot name an array, or
        another `compression`.
      FileExistsError: If `path` exists.
    """
    final = _path_arg("save", path)
    if compression not in io.COMPRESSIONS:
        raise ValueError(f"save: compression must be one of {list(io.COMPRESSIONS)}, got {compression!r}")
    pairs, _ = _pytree.tree_flatten_with_path(tree)
    if not pairs:
        raise ValueError("save: the tree has no leaves: nothing to save")
    if os.path.lexists(final):
        raise FileExistsError(f"save: {final!r} exists: a checkpoint goes to a new directory")
    leaves = []
    seen = set()
    for key_path, value in pairs:
        names, types = _names(key_path, "save")
        if isinstance(value, _core.ShardedBuffer):
            if value.is_deleted():
                raise ValueError(f"save: the buffer at {_pytree.keystr(key_path)} was deleted")
            leaf = _Leaf(names, types, io.VALUE_ARRAY, compression)
            leaf.buffer = _core.another_handle(value)  # held until written
        elif isinstance(value, (np.ndarray, np.generic)) and value.dtype != object:
            leaf = _Leaf(names, types, io.VALUE_NUMPY if isinstance(value, np.ndarray) else io.VALUE_SCALAR,
                         compression)
            leaf.value = np.array(value)  # a copy: the caller may change its array
        elif isinstance(value, (bool, numbers.Integral, numbers.Real)) and not isinstance(value, complex):
            leaf = _Leaf(names, types, io.VALUE_SCALAR, compression)
            leaf.value = np.array(value)
        else:
            raise TypeError(f"save: the leaf at {_pytree.keystr(key_path)} is a {type(value).__name__}: a "
                            "checkpoint holds ShardedBuffers, numpy arrays and scalars")
        if leaf.key in seen:
            raise ValueError(f"save: two leaves are named {leaf.key!r} (keys join with '.')")
        seen.add(leaf.key)
        leaves.append(leaf)
    tmp = final + io.TMP_SUFFIX
    io.remove(tmp)  # an earlier save that did not finish
    os.makedirs(tmp)
    return _pool().submit(_write, tmp, final, leaves)


def _write(tmp: str, final: str, leaves: list) -> str:
    try:
        by_writer: dict = {}  # writer name -> parts
        remote = _hosts_do_io()
        by_host: dict = {}  # host processes: host -> [(buffer, spec_json)]
        for leaf in leaves:
            if leaf.value_type != io.VALUE_ARRAY:
                v = leaf.value
                by_writer.setdefault("client", []).append(
                    {"key": leaf.key, "shape": v.shape, "chunk": v.shape or (), "dtype": v.dtype.name,
                     "compression": leaf.compression, "create": True, "index": (), "value": v})
            elif remote:
                _host_specs(leaf, by_host)
            else:
                _host_parts(leaf, by_writer)
        # Each writer's database at once, the writers in parallel: the host
        # processes write their own shards; in process, the hosts are this
        # process's threads.
        jobs = [(io.write_parts, io.writer_dir(tmp, n), p) for n, p in by_writer.items()]
        jobs += [(lambda d, items, h=h: _core.save_shards(h, d, items), io.writer_dir(tmp, f"h{h}"), items)
                 for h, items in by_host.items()]
        if len(jobs) == 1:
            jobs[0][0](jobs[0][1], jobs[0][2])
        else:
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(jobs))) as pool:
                for f in [pool.submit(fn, d, p) for fn, d, p in jobs]:
                    f.result()
        io.merge(tmp)
        io.write_metadata(tmp, [(leaf.names, leaf.types, leaf.value_type) for leaf in leaves])
        if os.path.lexists(final):
            raise FileExistsError(f"save: {final!r} appeared while the checkpoint was written")
        io.commit(tmp, final)
        return final
    except BaseException:
        io.remove(tmp)
        raise
    finally:
        for leaf in leaves:
            leaf.buffer = None


def _host_specs(leaf: _Leaf, by_host: dict) -> None:
    """What each host process writes of a buffer's leaf (a replicated one: its first device's host)."""
    buf = leaf.buffer
    hosts = [d.host for d in buf.devices]
    dtype = np.dtype(buf.dtype).name
    writers = [hosts[0]] if buf.is_replicated else sorted(set(hosts))
    rows = 1 if buf.is_replicated else io.rows_per_chunk(hosts)
    for h in writers:
        positions = [i for i, x in enumerate(hosts) if x == h]
        by_host.setdefault(h, []).append(
            (buf, io.buffer_spec(leaf.key, buf.shape, dtype, positions, buf.is_replicated, leaf.compression, rows)))


def _host_parts(leaf: _Leaf, by_writer: dict) -> None:
    """Written by this process: the parts each host's writer takes of a buffer's leaf.

    In process, views of the buffer's memory, not copies: it does not change
    once the buffer is ready, and the view holds the buffer until it is
    written. A service's tenant fetches the value from the hosts.
    """
    value = np.asarray(leaf.buffer) if _hosts_mode() == "service" else _core.value_view(leaf.buffer)
    specs: dict = {}
    _host_specs(leaf, specs)
    for h, items in specs.items():
        for _, spec_json in items:
            by_writer.setdefault(f"h{h}", []).extend(io.parts_of(json.loads(spec_json), value, whole=True))


def restore(path: Any, like: Any = None, devices: Optional[Sequence[Any]] = None) -> Any:
    """Reads the checkpoint at `path` (a pathways one, or Orbax's).

    Args:
      path: The checkpoint's directory.
      like: A pytree giving the structure, shapes and placement to restore
        into (its keys name the arrays): a `ShardedBuffer` leaf comes back
        on the same devices, split or replicated as it is (from any layout
        the checkpoint was written in: it reshards); a numpy array (or
        anything with `shape` and `dtype`, such as `jax.ShapeDtypeStruct`)
        as a numpy array of its dtype; a Python or numpy scalar as one of its
        type. Only the arrays `like` names are read. None: the checkpoint's
        own tree, of numpy arrays and scalars (on `devices` if given).
      devices: With `like=None`, put every array on these devices: split
        over them when its leading axis is their number, else replicated
        on each.

    With host processes, each host reads its own shards of the arrays that
    go onto devices (a replicated array whole, by each of its hosts): no
    shard passes through this process, which only reads the metadata, and
    the arrays restored as numpy or scalars.

    Returns:
      The restored pytree, once every array is read.

    Raises:
      FileNotFoundError: If there is no checkpoint at `path`.
      ValueError: If the checkpoint is interrupted or malformed, lacks an
        array `like` names, an array's shape differs from `like`'s, or an
        array cannot be read (a missing or corrupt chunk: the message names
        the array and, for host processes, the host).
      TypeError: For a `like` leaf of another type, or an array of a dtype
        devices do not hold.
    """
    src = _path_arg("restore", path)
    meta = io.read_metadata(src)
    zarr3 = bool(meta.get("use_zarr3", False))
    tree_meta = meta["tree_metadata"]
    if like is None:
        targets, treedef = _own_tree(tree_meta)
        if devices is not None:
            devices = list(devices)
            if not devices:
                raise ValueError("restore: devices must not be empty")
    else:
        if devices is not None:
            raise ValueError("restore: give like= or devices=, not both (like's buffers say their devices)")
        pairs, treedef = _pytree.tree_flatten_with_path(like)
        targets = []
        for key_path, target in pairs:
            names, _ = _names(key_path, "restore")
            if io.metadata_key(names) not in tree_meta:
                raise ValueError(f"restore: the checkpoint at {src!r} has no array {'.'.join(names)!r} "
                                 f"(for the leaf at {_pytree.keystr(key_path)} of like)")
            targets.append((names, target))
    remote = _hosts_do_io()
    out: list = [None] * len(targets)
    loads: list = []  # host processes: (index in out, _core.load_shards' item)
    reads: list = []  # read here: (index in out, key, value type, the read's future)
    ctx = io.context()  # this restore's: its arrays share what they read of the database
    keys = [".".join(names) for names, _ in targets]
    stores = io.open_arrays(src, keys, zarr3, ctx)  # every array's metadata at once: no data is read yet
    for i, ((names, target), key, store) in enumerate(zip(targets, keys, stores)):
        value_type = tree_meta[io.metadata_key(names)]["value_metadata"].get("value_type", io.VALUE_NUMPY)
        on_devices = isinstance(target, _core.ShardedBuffer) or (
            target is None and devices is not None and value_type != io.VALUE_SCALAR)
        if remote and on_devices:
            loads.append((i, _host_load(key, store, target, devices, zarr3)))
        else:
            reads.append((i, key, value_type, store.read()))  # all at once: tensorstore reads in parallel
    for i, key, value_type, reading in reads:
        try:
            value = np.asarray(reading.result())
        except Exception as e:  # noqa: BLE001 (tensorstore's errors: a missing or corrupt chunk)
            raise ValueError(f"restore: cannot read the array {key!r} of the checkpoint at {src!r}: {e}") from None
        out[i] = _place(key, value, value_type, targets[i][1], devices)
    if loads:
        # Each host reads its own shards; the client only sends the plan.
        buffers = _core.load_shards(src, [item for _, item in loads])
        error = None
        for buf in buffers:  # each, even after an error: nothing is left reading once this returns
            try:
                buf.block_until_ready()  # the hosts' error names the array and the host
            except Exception as e:  # noqa: BLE001
                error = error or e
        if error is not None:
            buffers = buf = None  # a failed restore holds no device memory, even while its error lives
            raise error
        for (i, _), buf in zip(loads, buffers):
            out[i] = buf
    return _pytree.tree_unflatten(treedef, out)


def _host_load(key: str, store: Any, target: Any, devices: Optional[list], zarr3: bool) -> tuple:
    """_core.load_shards' item for an array the host processes read onto devices (checked here first)."""
    shape = tuple(store.shape)
    if target is None:
        dtype = np.dtype(store.dtype.numpy_dtype)
        replicated = not (len(shape) >= 1 and shape[0] == len(devices))
        on = devices
    else:
        if target.is_deleted():
            raise ValueError(f"restore: like's buffer for {key!r} was deleted: it says where to restore")
        _check_shape(key, shape, target.shape)
        dtype = np.dtype(target.dtype)
        replicated = target.is_replicated
        on = list(target.devices)
    spec = io.load_spec(key, shape, dtype.name, replicated, zarr3)
    return (key, dtype, shape, on, replicated, spec)


def _own_tree(tree_meta: dict) -> tuple:
    """(targets, treedef) of the checkpoint's own tree: nested dicts and lists."""
    root: dict = {}
    order = []
    for entry in tree_meta.values():
        keys = entry["key_metadata"]
        names = tuple(k["key"] for k in keys)
        node: Any = root
        for k in keys[:-1]:
            node = node.setdefault((k["key"], k["key_type"]), {})
        node[(keys[-1]["key"], keys[-1]["key_type"])] = names
        order.append(names)

    def build(node: dict) -> Any:
        items = sorted(node.items(), key=lambda kv: (int(kv[0][0]) if kv[0][1] == io.KEY_SEQUENCE else 0, kv[0][0]))
        is_list = bool(items) and all(k[1] == io.KEY_SEQUENCE for k, _ in items)
        built = [(k[0], build(v) if isinstance(v, dict) else v) for k, v in items]
        return [v for _, v in built] if is_list else {k: v for k, v in built}

    skeleton = build(root)
    pairs, treedef = _pytree.tree_flatten_with_path(skeleton, is_leaf=lambda x: isinstance(x, tuple))
    return [(leaf, None) for _, leaf in pairs], treedef


def _place(key: str, value: np.ndarray, value_type: str, target: Any, devices: Optional[list]) -> Any:
    if target is None:
        if value_type == io.VALUE_SCALAR:
            return value.item()
        if devices is None:
            return value
        if value.ndim >= 1 and value.shape[0] == len(devices):
            return _core.device_put(np.ascontiguousarray(value), devices, None)
        return _replicated(value, devices)
    if isinstance(target, _core.ShardedBuffer):
        if target.is_deleted():
            raise ValueError(f"restore: like's buffer for {key!r} was deleted: it says where to restore")
        _check_shape(key, value.shape, target.shape)
        value = value.astype(target.dtype, copy=False)
        if target.is_replicated:
            return _replicated(value, list(target.devices))
        return _core.device_put(np.ascontiguousarray(value), list(target.devices), None)
    if isinstance(target, (bool, numbers.Number)) and not isinstance(target, np.generic):
        _check_shape(key, value.shape, ())
        return type(target)(value.item())
    if isinstance(target, np.generic):
        _check_shape(key, value.shape, ())
        return target.dtype.type(value.item())
    if hasattr(target, "shape") and hasattr(target, "dtype"):
        _check_shape(key, value.shape, tuple(target.shape))
        return value.astype(np.dtype(target.dtype), copy=False)
    raise TypeError(f"restore: like's leaf for {key!r} is a {type(target).__name__}: like holds ShardedBuffers, "
                    "arrays (or objects with shape and dtype) and scalars")


def _check_shape(key: str, saved: tuple, shape: tuple) -> None:
    if tuple(saved) != tuple(shape):
        raise ValueError(f"restore: the array {key!r} has shape {tuple(saved)} in the checkpoint, "
                         f"like's is {tuple(shape)}")


def _replicated(value: np.ndarray, devices: list) -> Any:
    """`value` whole on every device of `devices` (a replicated buffer)."""
    stacked = np.ascontiguousarray(np.broadcast_to(value, (len(devices),) + value.shape))
    return _core.replicated_view(_core.device_put(stacked, devices, None))
