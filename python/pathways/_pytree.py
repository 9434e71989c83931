"""Pytrees, as `jax.tree_util`, on optree's C++ flattener.

A pytree is a nest of containers whose non-container members are *leaves*.
The containers are those optree knows (the ones JAX knows):

* `tuple`, namedtuples (which keep their type) and `typing.NamedTuple`s,
* `list`, `collections.deque`,
* `dict`, flattened in sorted key order (so `{"b": x, "a": y}` and
  `{"a": y, "b": x}` have the same structure; keys that do not sort keep
  their insertion order), `collections.OrderedDict` and
  `collections.defaultdict` (in their own order),
* `None`, a container with no children (it is never a leaf),

and the node types registered with `register_pytree_node`,
`register_pytree_node_class` or `register_dataclass` (in pathways'
own optree namespace, so registrations made for other libraries do not leak
in and ours do not leak out). Every other object, including numpy arrays,
`ShardedBuffer`s, Python scalars and unregistered dataclasses, is a leaf.

`tree_flatten` returns the leaves in order and a hashable `PyTreeDef` (optree's
`PyTreeSpec`) that `tree_unflatten` uses to rebuild the structure; the treedef
is part of the cache keys of compiled functions and programs. Every function
takes `is_leaf`, a predicate that stops the walk at the subtrees it holds for.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import sys
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import optree

from pathways import _core
from pathways._trace_state import _TracerBase

__all__ = [
    "PyTreeDef",
    "tree_flatten",
    "tree_unflatten",
    "tree_leaves",
    "tree_map",
    "tree_structure",
    "tree_reduce",
    "tree_all",
    "tree_flatten_with_path",
    "tree_leaves_with_path",
    "tree_map_with_path",
    "keystr",
    "DictKey",
    "SequenceKey",
    "GetAttrKey",
    "FlattenedIndexKey",
    "register_pytree_node",
    "register_pytree_node_class",
    "register_dataclass",
]

# Registrations of pathways' users live here; the built-in containers are
# known in every namespace.
NAMESPACE = "pathways"

PyTreeDef = optree.PyTreeSpec

IsLeaf = Optional[Callable[[Any], bool]]


# Leaf types that are never JAX pytree nodes (the check below skips them).
_PLAIN_LEAVES = {int, float, bool, complex, str, bytes, type(None), np.ndarray, np.float32,
                 np.float64, np.int32, np.int64, np.uint32, np.bool_}
_OPTREE_NODES = (tuple, list, dict, collections.deque, type(None))
# Types looked at as leaves (JAX's registry does not flatten them, or they are registered
# here by now); the plain leaves from the start.
_settled: set = set(_PLAIN_LEAVES) | {_core.ShardedBuffer}


def _register_jax_nodes(leaves: Iterable[Any]) -> bool:
    """Registers here, once per type, the node types of JAX's registry among `leaves`.

    Types that flax, equinox, haiku or the user registered with
    `jax.tree_util` (flax structs, equinox Modules ...) are nodes of JAX's
    registry, not of optree's: each flattens here as JAX flattens it one
    level down (its children, and JAX's treedef of that level as the
    metadata). Typed PRNG keys flatten to their key data. Each type is looked
    at once (`_settled`), so a tree of arrays costs one set difference.
    Returns whether any type was registered (the tree is then flattened again).
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    new = set(map(type, leaves)).difference(_settled)
    if not new:
        return False
    added = False
    for leaf in leaves:
        t = type(leaf)
        if t not in new:
            continue
        new.discard(t)
        _settled.add(t)
        if isinstance(leaf, _OPTREE_NODES):
            continue  # (an is_leaf stopped the walk at one of optree's own nodes)
        if _is_key_array(jax, leaf):
            flatten, unflatten = _key_data, _keys_from_data
        else:
            children = jax.tree_util.tree_leaves(leaf, is_leaf=lambda y, x=leaf: y is not x)
            if len(children) == 1 and children[0] is leaf:
                continue  # a leaf to JAX too
            flatten, unflatten = _jax_one_level, _jax_unflatten
        try:
            optree.register_pytree_node(t, flatten, unflatten, namespace=NAMESPACE)
        except ValueError:  # registered here already (an is_leaf stopped the walk at it)
            continue
        added = True
    return added


def is_jax_array(x: Any) -> bool:
    """Whether `x` is a `jax.Array` of numbers (not keys), without importing JAX."""
    jax = sys.modules.get("jax")
    return (jax is not None and type(x) not in _PLAIN_LEAVES and isinstance(x, jax.Array)
            and not _is_key_array(jax, x))


class TracedKeys:
    """JAX PRNG keys (`jax.random.key`) inside a traced function: their key data, a traced
    value, and the PRNG implementation (pathways._jax_frontend gives JAX key-typed values
    for them). A pytree node whose one leaf is the key data."""

    __slots__ = ("data", "impl")

    def __init__(self, data: Any, impl: Any):
        self.data = data
        self.impl = impl

    def __repr__(self) -> str:
        return f"TracedKeys({self.data!r}, impl={self.impl})"


def _is_key_array(jax: Any, x: Any) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _key_data(keys: Any) -> tuple:
    if type(keys) is TracedKeys:
        return [keys.data], keys.impl
    import jax

    return [jax.random.key_data(keys)], jax.random.key_impl(keys)


def _keys_from_data(impl: Any, children: Any) -> Any:
    """Key arrays again: of a traced value, `TracedKeys`; of an array or buffer, JAX's."""
    (data,) = children
    if isinstance(data, _TracerBase) or not (hasattr(data, "__array__") and getattr(data, "ndim", 0)):
        return TracedKeys(data, impl)  # (or a dummy leaf of a structure being walked, not keys)
    import jax

    return jax.random.wrap_key_data(jax.numpy.asarray(data), impl=impl)


optree.register_pytree_node(TracedKeys, _key_data, _keys_from_data, namespace=NAMESPACE)


def _jax_one_level(x: Any) -> tuple:
    import jax

    children, treedef = jax.tree_util.tree_flatten(x, is_leaf=lambda y: y is not x)
    return children, treedef


def _jax_unflatten(treedef: Any, children: Any) -> Any:
    return treedef.unflatten(list(children))


def tree_flatten(tree: Any, is_leaf: IsLeaf = None) -> tuple[list[Any], PyTreeDef]:
    """Flattens a pytree into its leaves and its structure.

    Args:
      tree: A pytree.
      is_leaf: If given, a subtree for which it returns True is a leaf.

    Returns:
      `(leaves, treedef)`: the leaves in order and the structure, which
      `tree_unflatten` inverts.
    """
    leaves, treedef = optree.tree_flatten(tree, is_leaf, namespace=NAMESPACE)
    while _register_jax_nodes(leaves):  # again: the new nodes' children may be JAX nodes too
        leaves, treedef = optree.tree_flatten(tree, is_leaf, namespace=NAMESPACE)
    return leaves, treedef


_FLAT_TUPLES: dict = {}


def flat_tuple_treedef(n: int) -> PyTreeDef:
    """The treedef of a tuple of `n` leaves (cached; for argument tuples on hot paths)."""
    treedef = _FLAT_TUPLES.get(n)
    if treedef is None:
        treedef = _FLAT_TUPLES.setdefault(n, tree_structure((0,) * n))
    return treedef


def tree_unflatten(treedef: PyTreeDef, leaves: Iterable[Any]) -> Any:
    """Rebuilds a pytree from its structure and leaves.

    Args:
      treedef: A structure from `tree_flatten`.
      leaves: Exactly `treedef.num_leaves` leaves, in flattening order.

    Returns:
      The pytree.

    Raises:
      ValueError: If the number of leaves does not match the structure.
    """
    if type(leaves) is not list:
        leaves = list(leaves)
    if len(leaves) != treedef.num_leaves:
        raise ValueError(
            f"tree_unflatten: {treedef} has {treedef.num_leaves} leaves, got {len(leaves)}"
        )
    return treedef.unflatten(leaves)


def tree_leaves(tree: Any, is_leaf: IsLeaf = None) -> list[Any]:
    """The leaves of a pytree in flattening order."""
    leaves = optree.tree_leaves(tree, is_leaf, namespace=NAMESPACE)
    while _register_jax_nodes(leaves):
        leaves = optree.tree_leaves(tree, is_leaf, namespace=NAMESPACE)
    return leaves


def tree_structure(tree: Any, is_leaf: IsLeaf = None) -> PyTreeDef:
    """The structure (`PyTreeDef`) of a pytree."""
    return tree_flatten(tree, is_leaf)[1]


def _leaves_like(treedef: PyTreeDef, other: Any, where: str, is_leaf: IsLeaf) -> list:
    """The leaves of `other` at the leaves of `treedef`; ValueError if `other` has another structure."""
    leaves, other_def = tree_flatten(other, is_leaf)
    if other_def != treedef:
        raise ValueError(f"{where}: structure {other_def} does not match {treedef}")
    return leaves


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any, is_leaf: IsLeaf = None) -> Any:
    """Applies `fn` to every leaf of `tree` (and the matching leaves of `rest`).

    Args:
      fn: A function of `1 + len(rest)` leaves.
      tree: A pytree.
      *rest: Pytrees with the same structure as `tree`.
      is_leaf: As for `tree_flatten`, applied to `tree` and `rest`.

    Returns:
      A pytree with the structure of `tree` and leaves `fn(leaf, *rest_leaves)`.

    Raises:
      ValueError: If a tree in `rest` has a different structure.
    """
    leaves, treedef = tree_flatten(tree, is_leaf)
    others = [_leaves_like(treedef, r, "tree_map", is_leaf) for r in rest]
    return treedef.unflatten([fn(*xs) for xs in zip(leaves, *others)])


_NO_INITIALIZER = object()


def tree_reduce(
    fn: Callable[[Any, Any], Any], tree: Any, initializer: Any = _NO_INITIALIZER,
    is_leaf: IsLeaf = None,
) -> Any:
    """`functools.reduce(fn, tree_leaves(tree)[, initializer])`, as `jax.tree_util.tree_reduce`."""
    leaves = tree_leaves(tree, is_leaf)
    if initializer is _NO_INITIALIZER:
        return functools.reduce(fn, leaves)
    return functools.reduce(fn, leaves, initializer)


def tree_all(tree: Any, is_leaf: IsLeaf = None) -> bool:
    """Whether every leaf is true (`all(tree_leaves(tree))`)."""
    return all(tree_leaves(tree, is_leaf))


# --- Paths: JAX's key types -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DictKey:
    """The key of a dict entry on a path (`jax.tree_util.DictKey`)."""

    key: Any

    def __str__(self) -> str:
        return f"[{self.key!r}]"


@dataclasses.dataclass(frozen=True)
class SequenceKey:
    """The index of a list, tuple or deque entry on a path (`jax.tree_util.SequenceKey`)."""

    idx: int

    def __str__(self) -> str:
        return f"[{self.idx}]"


@dataclasses.dataclass(frozen=True)
class GetAttrKey:
    """The field of a namedtuple or registered dataclass on a path (`jax.tree_util.GetAttrKey`)."""

    name: str

    def __str__(self) -> str:
        return f".{self.name}"


@dataclasses.dataclass(frozen=True)
class FlattenedIndexKey:
    """The position among the children of a node registered with flatten and unflatten
    functions (`jax.tree_util.FlattenedIndexKey`)."""

    key: int

    def __str__(self) -> str:
        return f"[<flat index {self.key}>]"


def _key_of(entry: Any) -> Any:
    """JAX's key for one of optree's path entries."""
    if isinstance(entry, (optree.NamedTupleEntry, optree.StructSequenceEntry)):
        return GetAttrKey(entry.field)
    if isinstance(entry, optree.GetAttrEntry):
        return GetAttrKey(entry.name)
    if isinstance(entry, optree.MappingEntry):
        return DictKey(entry.entry)
    if isinstance(entry, optree.SequenceEntry):
        return SequenceKey(entry.entry)
    return FlattenedIndexKey(entry.entry)


def _paths(tree: Any, is_leaf: IsLeaf) -> tuple:
    accessors, leaves, treedef = optree.tree_flatten_with_accessor(
        tree, is_leaf, namespace=NAMESPACE
    )
    return [tuple(_key_of(e) for e in a) for a in accessors], leaves, treedef


def keystr(keys: Sequence[Any], *, simple: bool = False, separator: str = "") -> str:
    """A path as text, as `jax.tree_util.keystr`: `"['a'][0].w"`; `simple=True` gives the
    bare keys joined by `separator` (`"a/0/w"` with `separator="/"`)."""
    if not simple:
        return separator.join(str(k) for k in keys)

    def bare(k: Any) -> str:
        for field in ("key", "idx", "name"):
            if hasattr(k, field):
                return str(getattr(k, field))
        return str(k)

    return separator.join(bare(k) for k in keys)


def tree_flatten_with_path(tree: Any, is_leaf: IsLeaf = None) -> tuple[list, PyTreeDef]:
    """`([(path, leaf), ...], treedef)`, as `jax.tree_util.tree_flatten_with_path`.

    A path is the tuple of keys leading to the leaf, JAX's types: `DictKey`
    (`.key`), `SequenceKey` (`.idx`), `GetAttrKey` (`.name`: namedtuple and
    registered dataclass fields) and `FlattenedIndexKey` (`.key`: children of
    nodes registered with flatten functions); `keystr` prints one.
    """
    paths, leaves, treedef = _paths(tree, is_leaf)
    return list(zip(paths, leaves)), treedef


def tree_leaves_with_path(tree: Any, is_leaf: IsLeaf = None) -> list:
    """`[(path, leaf), ...]`, as `jax.tree_util.tree_leaves_with_path`."""
    return tree_flatten_with_path(tree, is_leaf)[0]


def tree_map_with_path(
    fn: Callable[..., Any], tree: Any, *rest: Any, is_leaf: IsLeaf = None
) -> Any:
    """As `tree_map`, with `fn(path, leaf, *rest_leaves)` (paths as `tree_flatten_with_path`)."""
    paths, leaves, treedef = _paths(tree, is_leaf)
    others = [_leaves_like(treedef, r, "tree_map_with_path", is_leaf) for r in rest]
    return treedef.unflatten([fn(p, *xs) for p, *xs in zip(paths, leaves, *others)])


def broadcast_prefix(prefix: Any, tree: Any, where: str, what: str) -> list:
    """One entry of `prefix` per leaf of `tree`, as JAX broadcasts `in_axes` over arguments.

    `prefix` is a pytree whose structure is a prefix of `tree`'s: each of its
    leaves (None included, which is a leaf here) stands for the whole subtree
    of `tree` at its place.

    Raises:
      ValueError: Naming `where` and `what` if `prefix` is not a prefix of `tree`.
    """
    try:
        return _broadcast(prefix, tree)
    except ValueError as e:
        raise ValueError(
            f"{where}: {what} {prefix!r} is not a prefix of the arguments' structure "
            f"{tree_structure(tree)}: {e}"
        ) from None


def _broadcast(prefix: Any, tree: Any) -> list:
    # A prefix leaf (None counts as a leaf) covers its whole subtree; nodes of the
    # prefix must match the tree's node for node.
    prefix_leaves, prefix_def = optree.tree_flatten(prefix, none_is_leaf=True, namespace=NAMESPACE)
    subtrees = prefix_def.flatten_up_to(tree)
    out = []
    for p, sub in zip(prefix_leaves, subtrees):
        out.extend([p] * tree_structure(sub).num_leaves)
    return out


def register_pytree_node(
    nodetype: type,
    flatten_func: Callable[[Any], tuple[Sequence[Any], Any]],
    unflatten_func: Callable[[Any, Sequence[Any]], Any],
) -> type:
    """Makes `nodetype` a pytree node, as `jax.tree_util.register_pytree_node`.

    Args:
      nodetype: The class.
      flatten_func: `x -> (children, aux_data)`; `aux_data` must be hashable
        and comparable (it is part of the treedef, hence of cache keys).
      unflatten_func: `(aux_data, children) -> x`.

    Returns:
      `nodetype`.

    Raises:
      ValueError: If `nodetype` is already registered.
    """
    return optree.register_pytree_node(
        nodetype, flatten_func, unflatten_func, namespace=NAMESPACE
    )


def register_pytree_node_class(cls: type) -> type:
    """Class decorator: `cls.tree_flatten()` and `cls.tree_unflatten(aux, children)` make it a node."""
    return register_pytree_node(
        cls, lambda x: x.tree_flatten(), lambda aux, children: cls.tree_unflatten(aux, children)
    )


def register_dataclass(
    nodetype: type,
    data_fields: Optional[Sequence[str]] = None,
    meta_fields: Optional[Sequence[str]] = None,
) -> type:
    """Makes a dataclass a pytree node, as `jax.tree_util.register_dataclass`.

    The `data_fields` are its children; the `meta_fields` are static (part of
    the treedef, so they must be hashable). Without both lists, they are
    inferred from the dataclass's fields: a field declared with
    `dataclasses.field(metadata={"static": True})` is a meta field, every
    other field a data field. Usable as a decorator.

    Raises:
      TypeError: If `nodetype` is not a dataclass and the fields are not given.
      ValueError: If the fields given are not exactly the class's init fields.
    """
    if data_fields is None and meta_fields is None:
        if not dataclasses.is_dataclass(nodetype):
            raise TypeError(
                f"register_dataclass: {nodetype!r} is not a dataclass; pass data_fields "
                "and meta_fields"
            )
        fields = [f for f in dataclasses.fields(nodetype) if f.init]
        meta_fields = [f.name for f in fields if f.metadata.get("static", False)]
        data_fields = [f.name for f in fields if not f.metadata.get("static", False)]
    data_fields, meta_fields = list(data_fields or ()), list(meta_fields or ())
    if dataclasses.is_dataclass(nodetype):
        init = {f.name for f in dataclasses.fields(nodetype) if f.init}
        given = set(data_fields) | set(meta_fields)
        if given != init or len(given) != len(data_fields) + len(meta_fields):
            raise ValueError(
                f"register_dataclass: data_fields {data_fields} and meta_fields {meta_fields} "
                f"must name each init field of {nodetype.__name__} once: {sorted(init)}"
            )

    def flatten(x: Any) -> tuple:
        return (
            [getattr(x, n) for n in data_fields],
            tuple(getattr(x, n) for n in meta_fields),
            data_fields,
        )

    def unflatten(meta: tuple, children: Sequence[Any]) -> Any:
        return nodetype(**dict(zip(data_fields, children)), **dict(zip(meta_fields, meta)))

    optree.register_pytree_node(
        nodetype, flatten, unflatten, path_entry_type=optree.GetAttrEntry, namespace=NAMESPACE
    )
    return nodetype
