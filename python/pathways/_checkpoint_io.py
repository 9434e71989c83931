"""The on-disk format of pathways checkpoints: Orbax's, with tensorstore.

A checkpoint is a directory as `orbax.checkpoint` writes it with
`use_ocdbt=True, use_zarr3=True` (orbax-checkpoint 0.12):

    PATH/_METADATA            the tree: each leaf's key path and value type (JSON)
    PATH/_CHECKPOINT_METADATA timestamps (JSON)
    PATH/manifest.ocdbt, d/   the OCDBT database every array is read from
    PATH/ocdbt.process_<w>/   one OCDBT database per writer; the root one refers to their data files
    PATH/commit_success.txt

Each leaf is a zarr3 array under the key of its path joined by "." ("params.w",
"layers.0.b"); a scalar is a 0-d array. Every writer (a host, or the client
for the leaves it holds) writes its shards into a database of its own, in
chunks of its shards (rows_per_chunk), so that no chunk has two writers;
the zarr.json of an array is written by one of them. Then the per-writer
databases are merged into the root one (only their B-tree entries move:
the data stays in their files), the metadata is written, and the
directory, built under PATH + ".orbax-checkpoint-tmp", is renamed to PATH:
a checkpoint whose writing was interrupted never has the final name
(Orbax's rule on a local file system). Orbax and tensorstore open a
pathways checkpoint, and pathways opens theirs (zarr v2 too: Orbax's
StandardCheckpointer writes it).

tensorstore only, no pathways runtime: the hosts run these functions too.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from typing import Any, Optional, Sequence

import numpy as np

TMP_SUFFIX = ".orbax-checkpoint-tmp"
METADATA = "_METADATA"
CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
COMMIT_FILE = "commit_success.txt"
WRITER_PREFIX = "ocdbt.process_"

# _METADATA's key types (orbax.checkpoint's KeyType) and value types.
KEY_SEQUENCE = 1
KEY_DICT = 2
VALUE_ARRAY = "jax.Array"
VALUE_NUMPY = "np.ndarray"
VALUE_SCALAR = "scalar"


def tensorstore() -> Any:
    """The tensorstore module; ImportError saying how to install it."""
    try:
        import tensorstore as ts
    except ImportError as e:
        raise ImportError("pathways checkpoints need tensorstore: pip install 'pathways[checkpoint]' "
                          f"(or pip install tensorstore): {e}") from None
    return ts


def context() -> Any:
    """A fresh tensorstore context (the resources the OCDBT specs name), for one save or restore.

    Fresh each time: a context caches what it read (manifests, B-tree nodes,
    metadata, which the opens do not recheck), and a checkpoint's directory
    may be replaced between two saves or restores of one process (a host
    lives as long as its client).
    """
    ts = tensorstore()
    return ts.Context({"file_io_concurrency": {"limit": 128},
                       "cache_pool#ocdbt": {"total_bytes_limit": 100_000_000}})


def ocdbt(directory: str, write: bool = False, path: Optional[str] = None) -> dict:
    """The kvstore spec of the OCDBT database in `directory` (as Orbax opens it)."""
    d = os.path.abspath(directory).rstrip("/") + "/"
    kv: dict = {"driver": "ocdbt", "base": {"driver": "file", "path": d, "file_io_locking": {"mode": "non_atomic"}},
                "manifest": {"driver": "file", "path": d}, "cache_pool": "cache_pool#ocdbt"}
    if write:
        kv.update(target_data_file_size=2**31, assume_config=True,
                  config={"max_inline_value_bytes": 1024, "max_decoded_node_bytes": 100_000_000,
                          "manifest_kind": "single"})
    if path is not None:
        kv["path"] = path
    return kv


COMPRESSIONS = (None, "zstd")


def zarr3_metadata(shape: Sequence[int], chunk: Sequence[int], compression: Optional[str] = None) -> dict:
    """zarr3 metadata of an array of `shape` written in chunks of `chunk` (Orbax's codecs).

    `compression`: None (the chunks' bytes as they are) or "zstd" (level 3,
    Orbax's default). Readers take either: the codecs are in zarr.json.
    """
    codecs: list = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if compression == "zstd":
        codecs.append({"name": "zstd", "configuration": {"level": 3}})
    return {"shape": list(shape),
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk)}},
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": list(chunk),
                "codecs": codecs,
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": "end"}}]}


def writer_dir(tmp: str, writer: str) -> str:
    """The directory of writer `writer`'s database ([A-Za-z0-9]+, as Orbax's process names)."""
    if not writer.isalnum():
        raise ValueError(f"a checkpoint writer's name is letters and digits, got {writer!r}")
    return os.path.join(tmp, WRITER_PREFIX + writer)


def write_parts(database: str, parts: Sequence[dict]) -> None:
    """Writes `parts` into the OCDBT database in `database`, at once.

    Each part: {"key": the array's key, "shape", "chunk", "dtype" (a numpy
    dtype name), "compression" (COMPRESSIONS; default None), "create":
    whether this writer writes its zarr.json, "index": a tuple of slices of
    the array, "value": the numpy array there}. Parts of one array must
    cover whole chunks. Every array is opened at once, then every part
    written at once: tensorstore batches them into few commits of the
    database (opened one by one, each array's creation is a commit and its
    fsyncs).
    """
    ts = tensorstore()
    ctx = context()
    os.makedirs(database, exist_ok=True)
    opening: dict = {}
    for part in parts:
        key = part["key"]
        if key not in opening:
            spec = {"driver": "zarr3", "kvstore": ocdbt(database, write=True, path=key + "/"),
                    "metadata": zarr3_metadata(part["shape"], part["chunk"], part.get("compression")),
                    "dtype": part["dtype"], "recheck_cached_data": False, "recheck_cached_metadata": False,
                    "store_data_equal_to_fill_value": True}
            if part["create"]:
                opening[key] = ts.open(spec, create=True, open=True, context=ctx)
            else:
                opening[key] = ts.open(spec, open=True, assume_metadata=True, context=ctx)
    stores = {key: f.result() for key, f in opening.items()}
    # The values never change while written (a ready buffer's memory, a
    # copy of the caller's array, the bytes a host was handed), so
    # tensorstore may keep them for the chunks they cover instead of copying
    # them into its cache first, and encode each chunk in place (see
    # rows_per_chunk).
    writes = [stores[part["key"]][part["index"]].write(part["value"], can_reference_source_data_indefinitely=True)
              for part in parts]
    for w in writes:
        w.result()


def buffer_spec(key: str, shape: Sequence[int], dtype: str, positions: Sequence[int], replicated: bool,
                compression: Optional[str] = None, rows: int = 1) -> str:
    """What a host needs to write its shards of one buffer (wire::ShardsToSave.spec_json).

    A split buffer's shard i is row i of the array, written in chunks of
    `rows` shards (each chunk the shards of one host: rows_per_chunk), and
    the host of shard 0 writes the array's zarr.json; a replicated one is
    written whole by one host. `positions`: the host's shards' places in the
    buffer's device list, in order.
    """
    return json.dumps({"key": key, "shape": list(shape), "dtype": dtype, "positions": list(positions),
                       "replicated": bool(replicated), "compression": compression, "rows": rows})


def rows_per_chunk(hosts: Sequence[Any]) -> int:
    """The shards in a chunk of a buffer split over devices of `hosts` (each device's host, in order).

    The most that keeps every chunk one host's: a host's shards come in runs
    of consecutive devices, and chunks of g rows have one writer each when g
    divides every run's length (2 hosts of 4 devices: 4; hosts taking turns
    device by device: 1, a chunk per shard). Not one chunk per shard
    always: tensorstore copies a chunk of one row before writing it (it
    gives an axis of extent 1 no stride, so it does not see a contiguous
    array to encode in place), and a restore onto the same layout reads
    whole chunks either way; a host that restores one shard of a chunk
    (another layout) reads the chunk.
    """
    g = 0
    start = 0
    for i in range(1, len(hosts) + 1):
        if i == len(hosts) or hosts[i] != hosts[start]:
            g = math.gcd(g, i - start)
            start = i
    return max(g, 1)


def parts_of(spec: dict, shards: np.ndarray, whole: bool = False) -> list:
    """write_parts' parts of one buffer's shards on a writer.

    `shards`: a row per position of the spec's positions, in order; with
    `whole`, the buffer's whole value instead (a row per device). The
    parts' values are views of it: no shard is copied to be written.
    """
    shape = tuple(spec["shape"])
    compression = spec.get("compression")
    if spec["replicated"]:
        return [{"key": spec["key"], "shape": shape, "chunk": shape, "dtype": spec["dtype"], "create": True,
                 "compression": compression, "index": (), "value": shards if whole else shards[0]}]
    g = spec.get("rows", 1)
    chunk = (g,) + shape[1:]
    # A chunk's shards are this writer's positions p..p+g-1, from a p that g divides.
    return [{"key": spec["key"], "shape": shape, "chunk": chunk, "dtype": spec["dtype"], "create": p == 0,
             "compression": compression, "index": (slice(p, p + g),),
             "value": shards[p:p + g] if whole else shards[j:j + g]}
            for j, p in enumerate(spec["positions"]) if p % g == 0]


def host_write_shards(database: str, items: Sequence[tuple]) -> None:
    """A host process's shard writer (host/shard_writer.h): (spec_json, its shards' bytes) pairs.

    The bytes (a read-only array that owns them, or bytes) are written from
    where they are: the parts are views of them.
    """
    import ml_dtypes  # noqa: F401 (bfloat16 for np.dtype)

    parts = []
    for spec_json, data in items:
        spec = json.loads(spec_json)
        dtype = np.dtype(spec["dtype"])
        shard = tuple(spec["shape"]) if spec["replicated"] else tuple(spec["shape"][1:])
        local = np.frombuffer(data, dtype).reshape((len(spec["positions"]),) + shard)
        parts.extend(parts_of(spec, local))
    write_parts(database, parts)


def load_spec(key: str, shape: Sequence[int], dtype: str, replicated: bool, zarr3: bool) -> str:
    """What a host needs to read its shards of one buffer (wire::ShardsToLoad.spec_json).

    A split buffer's shard at position p is the array's [p]; each shard of a
    replicated one is the whole array. `shape`: the array's; `dtype`: the
    buffer's (a numpy dtype name: the array's values are converted to it).
    """
    return json.dumps({"key": key, "shape": list(shape), "dtype": dtype, "replicated": bool(replicated),
                       "zarr3": bool(zarr3)})


def _runs(positions: Sequence[int]) -> list:
    """(first position, count, first local index) of each run of consecutive positions."""
    runs: list = []
    for j, p in enumerate(positions):
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1][1] += 1
        else:
            runs.append([p, 1, j])
    return runs


def host_read_shards(database: str, items: Sequence[tuple]) -> None:
    """A host process's shard reader (host/shard_reader.h): (spec_json, positions, memory) triples.

    Reads each buffer's shards at `positions` from the checkpoint in
    `database` straight into `memory` (writable, the shards one after
    another), with tensorstore: any region of an array, however it was
    chunked when written, so a buffer may be restored in another layout
    than it was saved in. A replicated buffer's array is read once and
    copied to this host's other shards. Returns once every read has ended,
    failed or not: the memory is the caller's again then.

    Raises:
      ValueError: Naming the array and the checkpoint, for anything that
        cannot be read as the spec says (a missing or corrupt array, another
        shape).
    """
    import ml_dtypes  # noqa: F401 (bfloat16 for np.dtype)

    ts = tensorstore()
    ctx = context()  # this call's: the checkpoint's arrays share what they read of its database
    reads = []  # (key, future)
    copies = []  # replicated: shard 0 to the others, once read
    error: Optional[BaseException] = None
    for spec_json, positions, memory in items:
        key = "?"
        try:
            spec = json.loads(spec_json)
            key = spec["key"]
            dtype = np.dtype(spec["dtype"])
            shape = tuple(spec["shape"])
            shard = shape if spec["replicated"] else shape[1:]
            want = len(positions) * math.prod(shard) * dtype.itemsize
            if memory.nbytes != want:
                raise ValueError(f"this host has {memory.nbytes} bytes for its {len(positions)} shards of shape "
                                 f"{shard} and dtype {dtype}, which take {want}")
            if not positions:
                continue
            local = np.frombuffer(memory, dtype).reshape((len(positions),) + shard)
            store = open_array(database, key, spec.get("zarr3", True), ctx)
            if tuple(store.shape) != shape:
                raise ValueError(f"it has shape {tuple(store.shape)} in the checkpoint, the buffer's is {shape}")
            src = store if store.dtype.numpy_dtype == dtype else ts.cast(store, dtype)
            if spec["replicated"]:
                reads.append((key, ts.array(local[0:1].reshape(shard), copy=False, write=True).write(src)))
                copies.append(local)
                continue
            for first, count, j in _runs(positions):
                if first + count > shape[0]:
                    raise ValueError(f"shard {first + count - 1} is past its leading axis of {shape[0]}")
                dst = ts.array(local[j:j + count], copy=False, write=True)
                reads.append((key, dst.write(src[first:first + count])))
        except Exception as e:  # noqa: BLE001 (every failure becomes the ValueError naming the array)
            error = error or ValueError(f"restore: cannot read the array {key!r} of the checkpoint at {database!r}: {e}")
            break
    for key, read in reads:  # every read ends before this returns, failed or not
        try:
            read.result()
        except Exception as e:  # noqa: BLE001
            error = error or ValueError(f"restore: cannot read the array {key!r} of the checkpoint at {database!r}: "
                                        f"{e}")
    if error is None:
        for local in copies:
            local[1:] = local[0]
    # No array on the memory may outlive this call: the error's traceback
    # keeps this frame, and so its locals, alive.
    local = dst = src = store = None
    reads.clear()
    copies.clear()
    if error is not None:
        raise error


def merge(tmp: str) -> None:
    """Merges every writer's database in `tmp` into its root database (one atomic transaction)."""
    ts = tensorstore()
    ctx = context()
    writers = sorted(d for d in os.listdir(tmp) if d.startswith(WRITER_PREFIX))
    parent = ts.KvStore.open(ocdbt(tmp, write=True), context=ctx).result()
    txn = ts.Transaction(atomic=True)
    for w in writers:
        child = ts.KvStore.open(ocdbt(os.path.join(tmp, w)), context=ctx).result()
        child.experimental_copy_range_to(parent.with_transaction(txn)).result()
    txn.commit_async().result()


def metadata_key(names: Sequence[str]) -> str:
    """_METADATA's key of a leaf: the str of its key path's tuple, "('a', 'b')"."""
    return str(tuple(names))


def write_metadata(tmp: str, leaves: Sequence[tuple]) -> None:
    """_METADATA and _CHECKPOINT_METADATA: `leaves` are (names, key types, value type)."""
    tree = {}
    for names, key_types, value_type in leaves:
        tree[metadata_key(names)] = {
            "key_metadata": [{"key": n, "key_type": t} for n, t in zip(names, key_types)],
            "value_metadata": {"value_type": value_type, "skip_deserialize": False}}
    _write_json(os.path.join(tmp, METADATA), {"tree_metadata": tree, "use_ocdbt": True, "use_zarr3": True,
                                              "store_array_data_equal_to_fill_value": True,
                                              "custom_metadata": None})
    now = time.time_ns()
    _write_json(os.path.join(tmp, CHECKPOINT_METADATA), {
        "item_handlers": "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler",
        "metrics": {}, "performance_metrics": {}, "init_timestamp_nsecs": now, "commit_timestamp_nsecs": now,
        "custom_metadata": {}})


def commit(tmp: str, final: str) -> None:
    """Marks `tmp` complete and renames it `final` (which must not exist).

    Everything in `tmp` is on disk before the rename: the databases' files
    (tensorstore fsyncs each file it writes, then its directory; a commit of
    a database ends with its manifest, whose directory's fsync also keeps
    the entry of d/), the metadata files, and the entries of `tmp` itself
    (fsynced here).
    """
    _write_text(os.path.join(tmp, COMMIT_FILE), f"Checkpoint commit was successful to {final}")
    _fsync_dir(tmp)
    os.rename(tmp, final)
    _fsync_dir(os.path.dirname(final) or ".")


def remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def read_metadata(path: str) -> dict:
    """The _METADATA of the complete checkpoint at `path`.

    Raises:
      ValueError: If `path` is an interrupted checkpoint, or not one.
    """
    if path.rstrip("/").endswith(TMP_SUFFIX):
        raise ValueError(f"restore: {path!r} is a checkpoint whose writing did not finish "
                         f"(its name ends in {TMP_SUFFIX!r})")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"restore: no checkpoint at {path!r}")
    try:
        with open(os.path.join(path, METADATA), encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"restore: {path!r} is not a complete checkpoint: it has no {METADATA}") from None
    except ValueError as e:
        raise ValueError(f"restore: {path!r} has a malformed {METADATA}: {e}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("tree_metadata"), dict):
        raise ValueError(f"restore: {path!r} has a malformed {METADATA} (no tree_metadata)")
    if not meta.get("use_ocdbt", True):
        raise ValueError(f"restore: {path!r} was written without OCDBT (use_ocdbt=False), which pathways "
                         "does not read")
    return meta


def open_array(path: str, key: str, zarr3: bool, ctx: Any = None) -> Any:
    """The array `key` of the checkpoint at `path`, opened to read in `ctx` (None: a fresh context)."""
    return open_arrays(path, [key], zarr3, ctx)[0]


def open_arrays(path: str, keys: Sequence[str], zarr3: bool, ctx: Any = None) -> list:
    """The arrays `keys` of the checkpoint at `path`, opened at once to read in `ctx`."""
    ts = tensorstore()
    ctx = ctx if ctx is not None else context()
    opening = [ts.open({"driver": "zarr3" if zarr3 else "zarr", "kvstore": ocdbt(path, path=key + "/"),
                        "recheck_cached_data": False, "recheck_cached_metadata": False,
                        "fill_missing_data_reads": False}, open=True, read=True, context=ctx) for key in keys]
    return [f.result() for f in opening]


def _write_json(path: str, value: Any) -> None:
    _write_text(path, json.dumps(value))


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
