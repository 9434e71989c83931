"""Minimal pytrees: nested tuples, lists, dicts and None, like `jax.tree_util`.

A pytree is a nest of containers whose non-container members are *leaves*.
The containers are:

* `tuple` (and namedtuples, which keep their type),
* `list`,
* `dict`, flattened in sorted key order (so `{"b": x, "a": y}` and
  `{"a": y, "b": x}` have the same structure),
* `None`, a container with no children (it is never a leaf).

Every other object, including numpy arrays, `ShardedBuffer`s and Python
scalars, is a leaf. `tree_flatten` returns the leaves in order and a hashable
`PyTreeDef` that `tree_unflatten` uses to rebuild the structure; the treedef is
part of the cache keys of compiled functions and programs.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

__all__ = [
    "PyTreeDef",
    "tree_flatten",
    "tree_unflatten",
    "tree_leaves",
    "tree_map",
    "tree_structure",
]

# Node encoding (kept as plain tuples so that treedefs hash and compare fast):
#   _LEAF                          a leaf
#   (_NONE,)                       None
#   (_TUPLE, children)             tuple
#   (_LIST, children)              list
#   (_DICT, keys, children)        dict, keys sorted
#   (_NAMEDTUPLE, type, children)  namedtuple of that type
_LEAF = "*"
_NONE = 0
_TUPLE = 1
_LIST = 2
_DICT = 3
_NAMEDTUPLE = 4

_NONE_NODE = (_NONE,)


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _flatten_into(x: Any, leaves: list) -> Any:
    t = type(x)
    if t is tuple:
        return (_TUPLE, tuple([_flatten_into(c, leaves) for c in x]))
    if t is list:
        return (_LIST, tuple([_flatten_into(c, leaves) for c in x]))
    if t is dict:
        try:
            keys = tuple(sorted(x))
        except TypeError as e:
            raise TypeError(
                f"pytree dict keys must be sortable, got keys {list(x)!r}: {e}"
            ) from None
        return (_DICT, keys, tuple([_flatten_into(x[k], leaves) for k in keys]))
    if x is None:
        return _NONE_NODE
    if isinstance(x, tuple) and hasattr(t, "_fields"):
        return (_NAMEDTUPLE, t, tuple([_flatten_into(c, leaves) for c in x]))
    leaves.append(x)
    return _LEAF


def _count_leaves(node: Any) -> int:
    if node is _LEAF:
        return 1
    kind = node[0]
    if kind == _NONE:
        return 0
    return sum(_count_leaves(c) for c in node[-1])


def _node_str(node: Any) -> str:
    if node is _LEAF:
        return "*"
    kind = node[0]
    if kind == _NONE:
        return "None"
    children = [_node_str(c) for c in node[-1]]
    if kind == _TUPLE:
        return "(" + ", ".join(children) + ("," if len(children) == 1 else "") + ")"
    if kind == _LIST:
        return "[" + ", ".join(children) + "]"
    if kind == _DICT:
        return "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(node[1], children)) + "}"
    return f"{node[1].__name__}(" + ", ".join(children) + ")"


def _build(node: Any, it: Iterator[Any]) -> Any:
    if node is _LEAF:
        return next(it)
    kind = node[0]
    if kind == _TUPLE:
        return tuple([_build(c, it) for c in node[1]])
    if kind == _LIST:
        return [_build(c, it) for c in node[1]]
    if kind == _DICT:
        return {k: _build(c, it) for k, c in zip(node[1], node[2])}
    if kind == _NONE:
        return None
    return node[1](*[_build(c, it) for c in node[2]])


class PyTreeDef:
    """The structure of a pytree, without its leaves.

    Hashable and comparable, so it can be part of a cache key.

    Attributes:
      num_leaves: The number of leaves of trees with this structure.
    """

    __slots__ = ("_node", "num_leaves", "_hash")

    def __init__(self, node: Any):
        self._node = node
        self.num_leaves = _count_leaves(node)
        self._hash = hash(node)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PyTreeDef) and (self is other or self._node == other._node)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"PyTreeDef({_node_str(self._node)})"

    def unflatten(self, leaves: Iterable[Any]) -> Any:
        """Same as `tree_unflatten(self, leaves)`."""
        return tree_unflatten(self, leaves)


def tree_flatten(tree: Any) -> tuple[list[Any], PyTreeDef]:
    """Flattens a pytree into its leaves and its structure.

    Args:
      tree: A nest of tuples, lists, dicts and None; anything else is a leaf.

    Returns:
      `(leaves, treedef)`: the leaves in order (dicts in sorted key order) and
      the structure, which `tree_unflatten` inverts.

    Raises:
      TypeError: If a dict's keys cannot be sorted.
    """
    leaves: list[Any] = []
    node = _flatten_into(tree, leaves)
    return leaves, PyTreeDef(node)


_FLAT_TUPLES: dict = {}


def flat_tuple_treedef(n: int) -> PyTreeDef:
    """The treedef of a tuple of `n` leaves (cached; for argument tuples on hot paths)."""
    treedef = _FLAT_TUPLES.get(n)
    if treedef is None:
        treedef = _FLAT_TUPLES.setdefault(n, PyTreeDef((_TUPLE, (_LEAF,) * n)))
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
    if treedef._node is _LEAF:
        return leaves[0]
    return _build(treedef._node, iter(leaves))


def tree_leaves(tree: Any) -> list[Any]:
    """Returns the leaves of a pytree in flattening order.

    Args:
      tree: A pytree.

    Returns:
      The list of leaves.
    """
    leaves: list[Any] = []
    _flatten_into(tree, leaves)
    return leaves


def tree_structure(tree: Any) -> PyTreeDef:
    """Returns the structure of a pytree.

    Args:
      tree: A pytree.

    Returns:
      Its `PyTreeDef`.
    """
    return tree_flatten(tree)[1]


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    """Applies `fn` to every leaf of `tree` (and the matching leaves of `rest`).

    Args:
      fn: A function of `1 + len(rest)` leaves.
      tree: A pytree.
      *rest: Pytrees with the same structure as `tree`.

    Returns:
      A pytree with the structure of `tree` and leaves `fn(leaf, *rest_leaves)`.

    Raises:
      ValueError: If a tree in `rest` has a different structure.
    """
    leaves, treedef = tree_flatten(tree)
    others = []
    for r in rest:
        r_leaves, r_def = tree_flatten(r)
        if r_def != treedef:
            raise ValueError(f"tree_map: structure {r_def} does not match {treedef}")
        others.append(r_leaves)
    return tree_unflatten(treedef, [fn(*xs) for xs in zip(leaves, *others)])
