"""DeviceSpec and device scopes, checked against TensorFlow's device_spec_test / ops_test."""

import threading

import pytest

from zmqflow.common.cluster.device import DeviceSpec, DeviceStack, Op, current_device, device_scope
from zmqflow.common.errors import InvalidArgumentError

pytestmark = pytest.mark.unit


def spec(s):
    return DeviceSpec.from_string(s)


@pytest.mark.parametrize("text, canonical, fields", [
    ("/job:ps/task:0/cpu:0", "/job:ps/task:0/device:CPU:0", ("ps", None, 0, "CPU", 0)),
    ("/job:worker/replica:0/task:1/device:GPU:0", "/job:worker/replica:0/task:1/device:GPU:0",
     ("worker", 0, 1, "GPU", 0)),
    ("/gpu:1", "/device:GPU:1", (None, None, None, "GPU", 1)),
    ("/device:CPU:*", "/device:CPU:*", (None, None, None, "CPU", None)),
    ("", "", (None,) * 5),
    ("/job:ps", "/job:ps", ("ps", None, None, None, None)),
    ("cpu:0", "/device:CPU:0", (None, None, None, "CPU", 0)),
    ("/replica:1/task:0/cpu:0", "/replica:1/task:0/device:CPU:0", (None, 1, 0, "CPU", 0)),
    ("/job:muu/device:GPU:2", "/job:muu/device:GPU:2", ("muu", None, None, "GPU", 2)),
    ("/device:gpu:3", "/device:GPU:3", (None, None, None, "GPU", 3)),
    ("/GPU:*", "/device:GPU:*", (None, None, None, "GPU", None)),
    ("/device:GPU", "/device:GPU:*", (None, None, None, "GPU", None)),
    ("job:ps/task:2", "/job:ps/task:2", ("ps", None, 2, None, None)),
])
def test_from_string_parses_full_and_partial_specs(text, canonical, fields):
    d = spec(text)
    assert (d.job, d.replica, d.task, d.device_type, d.device_index) == fields
    assert d.to_string() == canonical
    assert spec(canonical) == d


def test_none_parses_as_empty_spec():
    assert DeviceSpec.from_string(None) == DeviceSpec()


def test_to_string_is_canonical_as_tf():
    assert DeviceSpec("j", 0, 1, "CPU", 2).to_string() == "/job:j/replica:0/task:1/device:CPU:2"
    assert DeviceSpec(device_type="GPU", device_index=0).to_string() == "/device:GPU:0"
    assert DeviceSpec(job="foo", replica=12, task=3, device_type="GPU").to_string() == \
        "/job:foo/replica:12/task:3/device:GPU:*"
    # As TF: an index without a type is not printed.
    assert DeviceSpec(device_index=1).to_string() == ""


def test_replace_and_mutation_as_tf():
    d = DeviceSpec().replace(job="foo").replace(task=3)
    assert d.to_string() == "/job:foo/task:3"
    d = d.replace(task=None, replica=12, device_type="cpu", device_index=1)
    assert d.to_string() == "/job:foo/replica:12/device:CPU:1"
    d.device_type, d.device_index = None, None
    assert d.to_string() == "/job:foo/replica:12"


@pytest.mark.parametrize("text, bad_part", [
    ("/job:ps/tsk:0", "tsk:0"),
    ("/job:ps/task:x", "'x'"),
    ("/task:-1", "'-1'"),
    ("/replica:1.5", "'1.5'"),
    ("/device:TPU:0", "'TPU'"),
    ("/device:GPU:a", "'a'"),
    ("/job:my-job", "'my-job'"),
    ("/job:", "''"),
    ("/cpu:0:1", "cpu:0:1"),
    ("/device:GPU:0/cpu:0", "cpu:0"),
    ("/job:a/job:b", "job:b"),
])
def test_bad_device_string_names_string_and_part(text, bad_part):
    with pytest.raises(InvalidArgumentError) as info:
        DeviceSpec.from_string(text)
    assert repr(text) in str(info.value)
    assert bad_part in str(info.value)


def test_bad_field_in_constructor():
    with pytest.raises(InvalidArgumentError, match="task"):
        DeviceSpec(task=-1)
    with pytest.raises(InvalidArgumentError, match="device type"):
        DeviceSpec(device_type="XPU")
    with pytest.raises(AttributeError):
        DeviceSpec().colour = "red"


def test_merge_from_overrides_set_fields_in_place():
    d = spec("/job:muu/task:1/device:GPU:2")
    d.merge_from(spec("/task:2"))
    assert d.to_string() == "/job:muu/task:2/device:GPU:2"
    d.merge_from(spec("/job:foo"))
    assert d.to_string() == "/job:foo/task:2/device:GPU:2"
    d.merge_from(spec("/device:CPU:*"))  # field-wise, as TF: the index stays
    assert d.to_string() == "/job:foo/task:2/device:CPU:2"
    d.merge_from(spec(""))
    assert d.to_string() == "/job:foo/task:2/device:CPU:2"


def test_make_merged_spec_returns_new_spec():
    first = DeviceSpec(job="ps", device_type="CPU")
    combined = first.make_merged_spec(DeviceSpec(device_type="GPU"))
    assert combined == DeviceSpec(job="ps", device_type="GPU")
    assert first.to_string() == "/job:ps/device:CPU:*"


def test_nested_scopes_merge_inner_over_outer():
    # TF ops_test testNestingWithDeviceStrings
    with device_scope("/device:GPU:0"):
        assert current_device().to_string() == "/device:GPU:0"
        with device_scope("/job:worker"):
            assert current_device().to_string() == "/job:worker/device:GPU:0"
            with device_scope("/device:CPU:0"):
                assert current_device().to_string() == "/job:worker/device:CPU:0"
                with device_scope("/job:ps"):
                    assert current_device().to_string() == "/job:ps/device:CPU:0"
                    with device_scope(""):
                        assert current_device().to_string() == "/job:ps/device:CPU:0"
    assert current_device() == DeviceSpec()


def test_nested_scopes_inner_overrides_and_outer_returns():
    # TF ops_test testNesting / testNestingOverrideGpuCpu
    with device_scope("/job:worker/replica:2/device:CPU:1"):
        with device_scope("/job:worker/replica:3/task:0"):
            assert str(current_device()) == "/job:worker/replica:3/task:0/device:CPU:1"
        with device_scope("/job:worker/replica:2/device:GPU:2"):
            assert str(current_device()) == "/job:worker/replica:2/device:GPU:2"
        assert str(current_device()) == "/job:worker/replica:2/device:CPU:1"


def test_nested_wildcard_index_inherits():
    # TF ops_test testNestingWithDeviceStringWildcard
    with device_scope("/device:GPU:7"), device_scope("/device:GPU:*"):
        assert str(current_device()) == "/device:GPU:7"
    with device_scope("/device:CPU:*"):
        assert str(current_device()) == "/device:CPU:*"
        with device_scope("/device:CPU:5"):
            assert str(current_device()) == "/device:CPU:5"


def test_none_clears_outer_scopes():
    # TF ops_test testNoneClearsDefault / testNoneIgnoresOuterDeviceFunction
    with device_scope("/job:worker/replica:2/device:CPU:1"):
        with device_scope(None):
            assert current_device() == DeviceSpec()
            with device_scope("/job:ps"):
                assert str(current_device()) == "/job:ps"
        assert str(current_device()) == "/job:worker/replica:2/device:CPU:1"
    with device_scope(lambda op: "/job:worker/replica:2/device:CPU:1"):
        with device_scope(None):
            assert current_device() == DeviceSpec()


def test_device_function_overrides_inner_strings():
    # TF ops_test testOverwritingBehavior: an outer function decides outright.
    with device_scope(lambda op: "/job:overwrite"):
        assert str(current_device()) == "/job:overwrite"
        with device_scope("/job:ps"):
            assert str(current_device()) == "/job:overwrite"
        with device_scope(None), device_scope("/job:ps"):
            assert str(current_device()) == "/job:ps"


def test_device_function_sees_op_and_inner_device():
    seen = []

    def ps_for_variables(op):
        seen.append((op.name, op.type, op.device, getattr(op, "size", None)))
        if op.type == "Variable":
            return spec("/job:ps/task:0").make_merged_spec(spec(op.device))
        return spec("/job:worker").make_merged_spec(spec(op.device))

    class Var:
        name, type, size, device = "w", "Variable", 400, ""

    with device_scope(ps_for_variables):
        with device_scope("/cpu:0"):
            assert str(current_device(Var())) == "/job:ps/task:0/device:CPU:0"
            assert str(current_device(Op("a", "Add"))) == "/job:worker/device:CPU:0"
        assert str(current_device("loss")) == "/job:worker"
    assert seen == [("w", "Variable", "/device:CPU:0", 400), ("a", "Add", "/device:CPU:0", None),
                    ("loss", "", "", None)]


def test_device_function_returning_spec_or_none():
    with device_scope(lambda op: DeviceSpec(job="ps", task=1)):
        assert str(current_device()) == "/job:ps/task:1"
    with device_scope("/job:ps"), device_scope(lambda op: None):
        assert str(current_device()) == "/job:ps"  # None means "no device" from the function...
    with device_scope(lambda op: None), device_scope("/job:ps"):
        assert current_device() == DeviceSpec()  # ...and replaces what inner scopes chose


def test_device_function_returning_garbage():
    with device_scope(lambda op: 42):
        with pytest.raises(InvalidArgumentError, match="returned 42"):
            current_device()
    with device_scope(lambda op: "/job:ps/bogus:1"):
        with pytest.raises(InvalidArgumentError, match="bogus:1"):
            current_device()


def test_op_device_is_innermost():
    with device_scope("/job:worker/cpu:0"):
        assert str(current_device(Op("x", device="/gpu:1"))) == "/job:worker/device:GPU:1"


def test_bad_scope_fails_when_scope_opens():
    with pytest.raises(InvalidArgumentError, match="tsk:0"):
        with device_scope("/job:ps/tsk:0"):
            pass
    with pytest.raises(InvalidArgumentError):
        with device_scope(3):
            pass
    assert current_device() == DeviceSpec()


def test_scope_spec_is_copied():
    d = spec("/job:ps")
    with device_scope(d):
        d.job = "worker"
        assert str(current_device()) == "/job:ps"


def test_explicit_device_stack():
    stack = DeviceStack()
    with stack.scope("/job:worker/task:1"):
        stack.push("/gpu:0")
        assert str(stack.resolve()) == "/job:worker/task:1/device:GPU:0"
        stack.pop()
        assert str(stack.resolve()) == "/job:worker/task:1"
    assert stack.resolve() == DeviceSpec()
    assert current_device() == DeviceSpec()  # independent of the ambient scopes


def test_scopes_are_per_thread():
    inside = threading.Event()
    release = threading.Event()
    seen = {}

    def other():
        seen["start"] = current_device().to_string()
        with device_scope("/job:ps"):
            inside.set()
            release.wait(5)
            seen["end"] = current_device().to_string()

    with device_scope("/job:worker"):
        t = threading.Thread(target=other)
        t.start()
        inside.wait(5)
        assert str(current_device()) == "/job:worker"
        release.set()
        t.join(5)
    assert seen == {"start": "", "end": "/job:ps"}
