"""The minimal pytree utilities behind pmap and program arguments."""

import collections

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
    assert repr(treedef) == "PyTreeDef(*)"


def test_treedef_equality_and_hash():
    t1 = tree_structure({"a": 1, "b": (2, 3)})
    t2 = tree_structure({"b": (5, 6), "a": 4})
    t3 = tree_structure({"a": 1, "b": [2, 3]})
    assert t1 == t2 and hash(t1) == hash(t2)
    assert t1 != t3
    assert tree_structure((1,)) != tree_structure([1])
    assert tree_structure(Point(1, 2)) != tree_structure((1, 2))
    assert {t1: "x"}[t2] == "x"
    assert repr(t1) == "PyTreeDef({'a': *, 'b': (*, *)})"


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


def test_unsortable_dict_keys():
    with pytest.raises(TypeError, match="sortable"):
        pw.tree_flatten({1: "a", "b": 2})


def test_other_objects_are_leaves():
    class Box:
        pass

    box = Box()
    arr = np.arange(3)
    leaves, _ = pw.tree_flatten([box, arr, "s", collections.OrderedDict(a=1)])
    assert leaves[0] is box and leaves[1] is arr and leaves[2] == "s"
    assert isinstance(leaves[3], collections.OrderedDict)


def test_namedtuple_through_pmap(devices_of):
    f = pw.pmap(lambda p: Point(p.y, p.x * 2.0), devices=devices_of(2))
    out = f(Point(np.array([1.0, 2.0]), np.array([3.0, 4.0])))
    assert isinstance(out, Point)
    np.testing.assert_array_equal(np.asarray(out.x), [3.0, 4.0])
    np.testing.assert_array_equal(np.asarray(out.y), [2.0, 4.0])
