"""Pytrees (pw.tree_util, on optree) behind pmap and program arguments."""

import collections
import dataclasses

import numpy as np
import pytest

import pathways as pw
from pathways._pytree import tree_structure

Point = collections.namedtuple("Point", ["x", "y"])


def test_flatten_order_and_roundtrip():
    a = np.zeros(1)
    tree = {"b": [1, (2, None)], "a": a, "c": Point(3, {"z": 4, "y": 5})}
    leaves, treedef = pw.tree_flatten(tree)
    assert leaves[0] is a
    assert leaves[1:] == [1, 2, 3, 5, 4]
    assert treedef.num_leaves == 6
    back = pw.tree_unflatten(treedef, leaves)
    assert back["b"] == [1, (2, None)]
    assert isinstance(back["c"], Point) and back["c"].y == {"y": 5, "z": 4}
    assert back["a"] is a


def test_none_is_an_empty_node():
    leaves, treedef = pw.tree_flatten((None, 1, [None]))
    assert leaves == [1]
    assert pw.tree_unflatten(treedef, [7]) == (None, 7, [None])
    leaves, treedef = pw.tree_flatten(None)
    assert leaves == [] and pw.tree_unflatten(treedef, []) is None


def test_single_leaf():
    leaves, treedef = pw.tree_flatten(5.0)
    assert leaves == [5.0]
    assert pw.tree_unflatten(treedef, ["x"]) == "x"
    assert repr(treedef) == "PyTreeSpec(*)"


def test_treedef_equality_and_hash():
    t1 = tree_structure({"a": 1, "b": (2, 3)})
    t2 = tree_structure({"b": (5, 6), "a": 4})
    t3 = tree_structure({"a": 1, "b": [2, 3]})
    assert t1 == t2 and hash(t1) == hash(t2)
    assert t1 != t3
    assert tree_structure((1,)) != tree_structure([1])
    assert tree_structure(Point(1, 2)) != tree_structure((1, 2))
    assert {t1: "x"}[t2] == "x"
    assert repr(t1) == "PyTreeSpec({'a': *, 'b': (*, *)})"


def test_unflatten_wrong_count():
    _, treedef = pw.tree_flatten((1, 2))
    with pytest.raises(ValueError, match="has 2 leaves, got 3"):
        pw.tree_unflatten(treedef, [1, 2, 3])


def test_tree_map_and_leaves():
    tree = {"a": [1, 2], "b": (3,)}
    assert pw.tree_leaves(tree) == [1, 2, 3]
    assert pw.tree_map(lambda x, y: x + y, tree, {"b": (30,), "a": [10, 20]}) == {
        "a": [11, 22],
        "b": (33,),
    }
    with pytest.raises(ValueError, match="does not match"):
        pw.tree_map(lambda x, y: x, tree, {"a": [1], "b": (3,)})


def test_unsortable_dict_keys_keep_insertion_order():
    leaves, treedef = pw.tree_flatten({1: "a", "b": 2})
    assert leaves == ["a", 2]
    assert pw.tree_unflatten(treedef, [3, 4]) == {1: 3, "b": 4}


def test_other_objects_are_leaves():
    class Box:
        pass

    @dataclasses.dataclass
    class Unregistered:
        a: int

    box, arr, dc = Box(), np.arange(3), Unregistered(1)
    leaves, _ = pw.tree_flatten([box, arr, "s", dc])
    assert leaves[0] is box and leaves[1] is arr and leaves[2] == "s" and leaves[3] is dc


def test_standard_containers_are_nodes():
    od = collections.OrderedDict([("b", 1), ("a", 2)])
    dd = collections.defaultdict(list, {"y": 3, "x": 4})
    dq = collections.deque([5, 6])
    leaves, treedef = pw.tree_flatten([od, dd, dq])
    assert leaves == [1, 2, 4, 3, 5, 6]  # OrderedDict in its order, defaultdict sorted
    back = pw.tree_unflatten(treedef, [10 * x for x in leaves])
    assert type(back[0]) is collections.OrderedDict and list(back[0].items()) == [("b", 10), ("a", 20)]
    assert type(back[1]) is collections.defaultdict and back[1].default_factory is list
    assert back[1] == {"y": 30, "x": 40}
    assert back[2] == collections.deque([50, 60])
    assert tree_structure(od) != tree_structure(dict(od))


def test_is_leaf_stops_the_walk():
    tree = {"w": (1, 2), "b": [3, (4, 5)]}
    is_pair = lambda x: isinstance(x, tuple) and len(x) == 2  # noqa: E731
    leaves, treedef = pw.tree_flatten(tree, is_leaf=is_pair)
    assert leaves == [3, (4, 5), (1, 2)]  # keys sorted: "b" first
    assert pw.tree_util.tree_leaves(tree, is_leaf=is_pair) == [3, (4, 5), (1, 2)]
    assert pw.tree_map(lambda p: p if not is_pair(p) else sum(p), tree, is_leaf=is_pair) == {
        "w": 3, "b": [3, 9]}
    assert pw.tree_unflatten(treedef, leaves) == tree


@dataclasses.dataclass
class Layer:
    w: object
    b: object
    name: str = dataclasses.field(default="dense", metadata={"static": True})


pw.tree_util.register_dataclass(Layer)


class Pair:
    def __init__(self, first, second, tag):
        self.first, self.second, self.tag = first, second, tag


pw.tree_util.register_pytree_node(
    Pair, lambda p: ((p.first, p.second), p.tag), lambda tag, c: Pair(c[0], c[1], tag)
)


@pw.tree_util.register_pytree_node_class
class Scaled:
    def __init__(self, value, scale):
        self.value, self.scale = value, scale

    def tree_flatten(self):
        return (self.value,), self.scale

    @classmethod
    def tree_unflatten(cls, scale, children):
        return cls(children[0], scale)


def test_custom_nodes():
    leaves, treedef = pw.tree_flatten(Layer(np.ones(2), 0.5, "out"))
    assert len(leaves) == 2 and leaves[1] == 0.5
    back = pw.tree_unflatten(treedef, [1, 2])
    assert back == Layer(1, 2, "out")
    # Static fields are part of the structure (of cache keys).
    assert tree_structure(Layer(1, 2, "a")) != tree_structure(Layer(1, 2, "b"))

    p = pw.tree_map(lambda x: x * 2, Pair(1, [2, 3], "t"))
    assert (p.first, p.second, p.tag) == (2, [4, 6], "t")
    s = pw.tree_map(lambda x: x + 1, Scaled(1, 10))
    assert (s.value, s.scale) == (2, 10)

    # Paths name the fields and indices leading to each leaf, in JAX's key types.
    tu = pw.tree_util
    paths = [path for path, _ in tu.tree_flatten_with_path({"l": Layer(5, 6)})[0]]
    assert paths == [(tu.DictKey("l"), tu.GetAttrKey("w")), (tu.DictKey("l"), tu.GetAttrKey("b"))]


def test_register_dataclass_errors():
    class Plain:
        pass

    with pytest.raises(TypeError, match="not a dataclass"):
        pw.tree_util.register_dataclass(Plain)

    @dataclasses.dataclass
    class Two:
        a: int
        b: int

    with pytest.raises(ValueError, match="each init field"):
        pw.tree_util.register_dataclass(Two, data_fields=["a"], meta_fields=[])
    with pytest.raises(ValueError):
        pw.tree_util.register_dataclass(Layer)  # already registered


def test_custom_nodes_through_pmap_and_grad(devices_of):
    f = pw.pmap(lambda layer, x: Layer(layer.w * x, layer.b + 1.0, layer.name),
                devices=devices_of(2))
    out = f(Layer(np.array([1.0, 2.0]), np.array([3.0, 4.0]), "h"), np.array([5.0, 6.0]))
    assert isinstance(out, Layer) and out.name == "h"
    np.testing.assert_array_equal(np.asarray(out.w), [5.0, 12.0])
    np.testing.assert_array_equal(np.asarray(out.b), [4.0, 5.0])

    g = pw.pmap(pw.grad(lambda layer, x: (layer.w * x + layer.b).sum()), devices=devices_of(2))
    grads = g(Layer(np.ones((2, 3)), np.ones((2, 3))), np.full((2, 3), 2.0))
    assert isinstance(grads, Layer)
    np.testing.assert_array_equal(np.asarray(grads.w), np.full((2, 3), 2.0))
    np.testing.assert_array_equal(np.asarray(grads.b), np.ones((2, 3)))

    od = collections.OrderedDict([("z", np.array([1.0, 2.0])), ("a", np.array([3.0, 4.0]))])
    out = pw.pmap(lambda d: collections.OrderedDict((k, v * 2) for k, v in d.items()),
                  devices=devices_of(2))(od)
    assert list(out) == ["z", "a"]
    np.testing.assert_array_equal(np.asarray(out["z"]), [2.0, 4.0])


def test_namedtuple_through_pmap(devices_of):
    f = pw.pmap(lambda p: Point(p.y, p.x * 2.0), devices=devices_of(2))
    out = f(Point(np.array([1.0, 2.0]), np.array([3.0, 4.0])))
    assert isinstance(out, Point)
    np.testing.assert_array_equal(np.asarray(out.x), [3.0, 4.0])
    np.testing.assert_array_equal(np.asarray(out.y), [2.0, 4.0])


def test_paths_are_jaxs_keys():
    # What jax.tree_util.tree_flatten_with_path and keystr give for the same tree
    # (jax 0.10), written out: dict keys, sequence indices, namedtuple fields,
    # registered dataclass fields and the children of flatten-function nodes.
    tu = pw.tree_util
    Pair = collections.namedtuple("Pair", "a b")

    class Node:
        def __init__(self, x, y):
            self.x, self.y = x, y

    tu.register_pytree_node(Node, lambda n: ((n.x, n.y), None), lambda _, ch: Node(*ch))
    tree = {"x": [1, (2, 3)], "y": Pair(4, 5), "l": Layer(6, 7), "n": Node(8, 9),
            "o": collections.OrderedDict(z=10)}
    flat = tu.tree_flatten_with_path(tree)[0]
    assert [tu.keystr(p) for p, _ in flat] == [
        "['l'].w", "['l'].b", "['n'][<flat index 0>]", "['n'][<flat index 1>]", "['o']['z']",
        "['x'][0]", "['x'][1][0]", "['x'][1][1]", "['y'].a", "['y'].b",
    ]
    assert [leaf for _, leaf in flat] == [6, 7, 8, 9, 10, 1, 2, 3, 4, 5]
    assert [tu.keystr(p, simple=True, separator="/") for p, _ in flat][:3] == ["l/w", "l/b", "n/0"]
    path = flat[6][0]
    assert path == (tu.DictKey("x"), tu.SequenceKey(1), tu.SequenceKey(0))
    assert (path[0].key, path[1].idx) == ("x", 1) and flat[8][0][1].name == "a"
    assert tu.tree_leaves_with_path(tree) == flat
    # The idiom of optimizer masks: a function of the last key.
    masked = tu.tree_map_with_path(lambda p, x: p[-1].name != "b", {"l": Layer(1.0, 2.0)})
    assert (masked["l"].w, masked["l"].b) == (True, False)
