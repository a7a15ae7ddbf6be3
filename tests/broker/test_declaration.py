"""QueueDeclaration against docs/queue-semantics.md §1: validity, attach compatibility and its order, wire form."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.services.broker.queues import QueueDeclaration

pytestmark = pytest.mark.unit


def decl(kind="FIFOQueue", capacity=10, dtypes=("float32",), shapes=None, **kw):
    return QueueDeclaration(kind, capacity, list(dtypes), shapes, **kw)


def invalid(d, match=None):
    with pytest.raises(InvalidArgumentError, match=match):
        d.validate()


# ------------------------------------------------ validity


@pytest.mark.parametrize("d", [
    decl(), decl(capacity=-1), decl(capacity=0), decl(shapes=[[2, 3]]), decl(dtypes=["int32", "string"], shapes=[[], [4]]),
    decl("PaddingFIFOQueue", shapes=[[None, 3]]), decl("PaddingFIFOQueue", shapes=[[]]),
    decl("RandomShuffleQueue", min_after_dequeue=9, seed=-5), decl("RandomShuffleQueue", capacity=-1, min_after_dequeue=10 ** 6),
    decl(dtypes=["bfloat16", "bool", "uint16", "int8", "float16", "float64"], names=["a", "b", "c", "d", "e", "f"]),
])
def test_valid_declarations(d):
    d.validate()


def test_shape_count_must_equal_dtype_count():
    invalid(decl(dtypes=["int32", "int32"], shapes=[[1]]), "same length")
    invalid(decl(shapes=[]))


@pytest.mark.parametrize("kind", ["FIFOQueue", "RandomShuffleQueue"])
def test_fifo_and_shuffle_queues_refuse_partial_shapes(kind):
    invalid(decl(kind, shapes=[[None, 3]]), "fully defined")
    invalid(decl(kind, shapes=[None]))


def test_padding_queue_requires_shapes_of_known_rank():
    invalid(decl("PaddingFIFOQueue"), "known rank")
    invalid(decl("PaddingFIFOQueue", shapes=[None]), "unknown rank")


@pytest.mark.parametrize("m,capacity,message", [(3, 3, "min_after_dequeue 3 must be < capacity 3"),
                                                (-1, 10, "min_after_dequeue -1 must be >= 0"),
                                                (0, 0, "must be < capacity 0")])
def test_shuffle_queue_needs_min_after_dequeue_in_0_to_capacity(m, capacity, message):
    invalid(decl("RandomShuffleQueue", capacity=capacity, min_after_dequeue=m), message)


@pytest.mark.parametrize("kw", [{"min_after_dequeue": 1}, {"seed": 3}])
def test_shuffle_options_on_other_kinds_are_invalid(kw):
    invalid(decl(**kw))


@pytest.mark.parametrize("dtypes", [[], ["float"], ["complex64"], [7], [None], "float32"])
def test_bad_dtypes(dtypes):
    invalid(QueueDeclaration("FIFOQueue", 10, dtypes))


@pytest.mark.parametrize("shape", [[-1], [2, -3], [1.0], [True], ["2"], [2 ** 40, 2 ** 40], [1] * 33, "ab", 3])
def test_bad_dims(shape):
    invalid(decl("PaddingFIFOQueue", shapes=[shape]))


@pytest.mark.parametrize("names", [["a", "b"], [], [1], "a", [None]])
def test_bad_names(names):
    invalid(decl(dtypes=["int32"], names=names))


def test_duplicate_names():
    invalid(decl(dtypes=["int32", "int32"], names=["a", "a"]), "unique")


@pytest.mark.parametrize("field,bad", [
    ("kind", "Queue"), ("kind", None), ("capacity", 1.5), ("capacity", True), ("capacity", "10"),
    ("shared_name", 3), ("container", None), ("min_after_dequeue", "0"), ("seed", 2 ** 64), ("seed", 1.0),
])
def test_bad_field_types(field, bad):
    d = decl("RandomShuffleQueue")
    setattr(d, field, bad)
    invalid(d)


# ------------------------------------------------ attaching: compatibility and its order


def test_identical_declarations_are_compatible_and_names_do_not_matter():
    decl(shapes=[[2]], names=["x"], shared_name="q").check_compatible(decl(shapes=[[2]], names=["y"], shared_name="q"))


def test_all_negative_capacities_are_equal():
    decl(capacity=-1).check_compatible(decl(capacity=-7))
    with pytest.raises(InvalidArgumentError, match="capacity"):
        decl(capacity=-1).check_compatible(decl(capacity=10))


@pytest.mark.parametrize("new,match", [
    (decl("PaddingFIFOQueue", capacity=15, dtypes=["int32"], shapes=[[None]]), "expected FIFOQueue, found PaddingFIFOQueue"),
    (decl(capacity=15, dtypes=["int32"], shapes=[[3]]), "has capacity 10 but requested capacity was 15"),
    (decl(dtypes=["int32", "int32"], shapes=[[3], [3]]), "component types"),
    (decl(dtypes=["float64"], shapes=[[3]]), "component types"),
    (decl(shapes=[[3]]), "component shapes"),
    (decl(shapes=[[2, 1]]), "component shapes"),
])
def test_attach_checks_kind_capacity_types_shapes_in_that_order(new, match):
    existing = decl(shared_name="q")
    with pytest.raises(InvalidArgumentError, match=match):
        new.check_compatible(existing)


def rsq(capacity=10, m=2, seed=None, dtypes=("float32",)):
    return decl("RandomShuffleQueue", capacity=capacity, dtypes=dtypes, min_after_dequeue=m, seed=seed)


@pytest.mark.parametrize("new,match", [
    (rsq(capacity=11, m=3, seed=9, dtypes=["int32"]), "capacity"),
    (rsq(m=3, seed=9, dtypes=["int32"]), "min_after_dequeue 2 but requested min_after_dequeue was 3"),
    (rsq(seed=9, dtypes=["int32"]), "random seeds"),
    (rsq(seed=5, dtypes=["int32"]), "component types"),
    (rsq(dtypes=["int32"]), "component types"),  # an unseeded declaration attaches to any seed
])
def test_shuffle_attach_checks_min_after_dequeue_then_seed_then_types(new, match):
    with pytest.raises(InvalidArgumentError, match=match):
        new.check_compatible(rsq(seed=5))


def test_seeded_declaration_does_not_attach_to_an_unseeded_queue():
    rsq().check_compatible(rsq())
    rsq().check_compatible(rsq(seed=4))
    rsq(seed=4).check_compatible(rsq(seed=4))
    with pytest.raises(InvalidArgumentError, match="random seeds"):
        rsq(seed=4).check_compatible(rsq())


def test_unspecified_shapes_differ_from_specified():
    with pytest.raises(InvalidArgumentError, match="component shapes"):
        decl(shapes=None).check_compatible(decl(shapes=[[1]]))
    with pytest.raises(InvalidArgumentError, match="component shapes"):
        decl(shapes=[[1]]).check_compatible(decl(shapes=None))


# ------------------------------------------------ wire form


def test_round_trip_through_a_dict():
    d = decl("RandomShuffleQueue", dtypes=["int32", "string"], shapes=[[2], []], names=["a", "b"], shared_name="s",
             container="c", min_after_dequeue=3, seed=11)
    assert QueueDeclaration.from_dict(d.to_dict()) == d


def test_from_dict_fills_defaults_and_normalizes_tuples():
    d = QueueDeclaration.from_dict({"kind": "PaddingFIFOQueue", "capacity": -1, "dtypes": ("int32",),
                                    "shapes": [(None, 2)], "shared_name": None})
    assert d.shapes == [[None, 2]] and d.dtypes == ["int32"] and d.shared_name == "" and d.container == ""


@pytest.mark.parametrize("d", [None, [], "x", {"kind": "FIFOQueue", "capacity": 1},
                               {"kind": "FIFOQueue", "capacity": 1, "dtypes": ["int32"], "colour": "red"},
                               {"kind": "FIFOQueue", "capacity": 1, "dtypes": ["int32"], "shapes": [[{}]]},
                               {"kind": ["FIFOQueue"], "capacity": 1, "dtypes": [["int32"]]}])
def test_from_dict_refuses_malformed_input(d):
    with pytest.raises(InvalidArgumentError):
        QueueDeclaration.from_dict(d)


values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 64 - 1), st.floats(),
                                st.text(max_size=5), st.binary(max_size=5)),
                      lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner,
                                                                                           max_size=3)), max_leaves=8)
fields = st.fixed_dictionaries({}, optional={
    "kind": st.one_of(st.sampled_from(["FIFOQueue", "RandomShuffleQueue", "PaddingFIFOQueue"]), values),
    "capacity": st.one_of(st.integers(-3, 5), values), "dtypes": st.one_of(st.just(["int32"]), values),
    "shapes": st.one_of(st.just([[None]]), st.just([[2]]), values), "names": values, "shared_name": values,
    "container": values, "min_after_dequeue": st.one_of(st.integers(-1, 5), values), "seed": values, "x": values})


@settings(max_examples=300, deadline=None)
@given(d=st.one_of(fields, values))
def test_hostile_declarations_give_only_invalid_argument(d):
    try:
        QueueDeclaration.from_dict(d).validate()
    except InvalidArgumentError:
        pass
