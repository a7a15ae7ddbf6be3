"""Placement: replica_device_setter's round-robin order, greedy balance, row partitioning, errors, CLI."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.common.variables import VariableSpec
from zmqflow.models.registry import model_variables
from zmqflow.models.spec import MNIST_MLP
from zmqflow.common.cluster.placement import Piece, place, row_blocks
from zmqflow.cli.placement import placement as placement_command

pytestmark = pytest.mark.unit

MNIST_VARS = model_variables(MNIST_MLP)  # hidden/weights, hidden/biases, softmax/weights, softmax/biases


def shards(placement):
    return {p.key: p.shard for p in placement}


@pytest.mark.parametrize("num_ps, expected", [
    # replica_device_setter(ps_tasks=n): the i-th variable created goes to /job:ps/task:(i % n)
    (1, [0, 0, 0, 0]),
    (2, [0, 1, 0, 1]),
    (3, [0, 1, 2, 0]),
])
def test_round_robin_matches_replica_device_setter(num_ps, expected):
    placed = place(MNIST_VARS, num_ps)
    assert [p.variable for p in placed] == ["hidden/weights", "hidden/biases", "softmax/weights", "softmax/biases"]
    assert [p.shard for p in placed] == expected
    assert all(p.num_parts == 1 and p.key == p.variable for p in placed)


def test_greedy_puts_each_variable_on_the_lightest_shard():
    variables = [VariableSpec("a", (100,)), VariableSpec("b", (10,)), VariableSpec("c", (50,)),
                 VariableSpec("d", (50,)), VariableSpec("e", (5,))]
    placed = place(variables, 3, "greedy")
    # loads (bytes/4): a->0 [100,0,0]; b->1 [100,10,0]; c->2 [100,10,50]; d->1 [100,60,50]; e->2 (least)
    assert shards(placed) == {"a": 0, "b": 1, "c": 2, "d": 1, "e": 2}
    assert placed.shard_bytes() == [400, 240, 220]


def test_greedy_ties_go_to_the_lowest_index():
    placed = place([VariableSpec(n, (4,)) for n in "abcd"], 2, "greedy")
    assert [p.shard for p in placed] == [0, 1, 0, 1]


def test_greedy_balances_better_than_round_robin_on_mnist():
    rr, greedy = place(MNIST_VARS, 2).shard_bytes(), place(MNIST_VARS, 2, "greedy").shard_bytes()
    assert sum(rr) == sum(greedy) == 4 * (784 * 100 + 100 + 100 * 10 + 10)
    assert greedy == [313600, 4440] and min(greedy) > min(rr)


def test_row_blocks_split_like_tensorflow_partitioned_variables():
    var = VariableSpec("emb", (10, 4))  # 160 bytes
    assert row_blocks(var, None) == [(0, 10)]
    assert row_blocks(var, 160) == [(0, 10)]
    assert row_blocks(var, 50) == [(0, 3), (3, 6), (6, 8), (8, 10)]  # 4 parts, the first 10 % 4 get a row more
    assert row_blocks(var, 1) == [(i, i + 1) for i in range(10)]  # never more parts than rows
    assert row_blocks(VariableSpec("s", ()), 1) == [(0, 1)]  # scalars are not split


def test_partitioned_pieces_go_round_robin_from_where_the_strategy_is():
    variables = [VariableSpec("bias", (3,)), VariableSpec("emb", (10, 4)), VariableSpec("out", (4,))]
    placed = place(variables, 3, max_shard_bytes=64)
    assert [(p.key, p.row_start, p.row_end, p.shape, p.shard) for p in placed] == [
        ("bias", 0, 3, (3,), 0),
        ("emb/part_0", 0, 4, (4, 4), 1),
        ("emb/part_1", 4, 7, (3, 4), 2),
        ("emb/part_2", 7, 10, (3, 4), 0),
        ("out", 0, 4, (4,), 1),
    ]
    assert placed.shape_of("emb") == (10, 4)
    assert [p.key for p in placed.for_shard(0)] == ["bias", "emb/part_2"]
    assert placed.variables() == ["bias", "emb", "out"]
    assert placed.pieces_of("emb")[1] == Piece("emb", 1, 3, 4, 7, (3, 4), "float32", 2)
    assert placed.pieces_of("emb")[1].nbytes == 48


def test_greedy_places_each_block_on_the_lightest_shard():
    placed = place([VariableSpec("big", (8, 2)), VariableSpec("small", (2,))], 2, "greedy", max_shard_bytes=16)
    assert shards(placed) == {"big/part_0": 0, "big/part_1": 1, "big/part_2": 0, "big/part_3": 1, "small": 0}


def test_split_and_assemble_round_trip():
    placed = place([VariableSpec("emb", (10, 4), "float64"), VariableSpec("b", (4,), "float64")], 2,
                   max_shard_bytes=100)
    value = np.arange(40, dtype=np.float64).reshape(10, 4)
    parts = placed.split("emb", value)
    assert list(parts) == ["emb/part_0", "emb/part_1", "emb/part_2", "emb/part_3"]
    assert all(np.shares_memory(part, value) for part in parts.values())  # views: no copy for gradients
    np.testing.assert_array_equal(placed.assemble("emb", parts), value)
    bias = np.ones(4)
    assert placed.assemble("b", placed.split("b", bias)) is bias
    with pytest.raises(InvalidArgumentError, match="emb/part_2"):
        placed.assemble("emb", {k: v for k, v in parts.items() if k != "emb/part_2"})
    with pytest.raises(InvalidArgumentError, match="shape"):
        placed.split("emb", np.zeros((9, 4)))
    with pytest.raises(NotFoundError):
        placed.split("nope", value)


def test_every_task_computes_the_same_placement():
    variables = MNIST_VARS + [VariableSpec("emb", (1000, 16))]
    for strategy in ("round_robin", "greedy"):
        first = place(variables, 3, strategy, 10000)
        assert all(place(list(variables), 3, strategy, 10000) == first for _ in range(3))
        assert first.as_rows() == place(variables, 3, strategy, 10000).as_rows()


def test_table_lists_every_piece():
    table = place(MNIST_VARS, 2, max_shard_bytes=200000).table()
    lines = table.splitlines()
    assert lines[0].split() == ["variable", "part", "rows", "shape", "dtype", "bytes", "shard"]
    assert lines[1].split() == ["hidden/weights", "0/2", "0:392", "392x100", "float32", "156800", "ps:0"]
    assert lines[-2:] == ["ps:0 holds 3 pieces, 157240 bytes", "ps:1 holds 2 pieces, 160800 bytes"]


@pytest.mark.parametrize("args, message", [
    ((MNIST_VARS, 0), "num_ps"),
    ((MNIST_VARS, 2, "random"), "strategy"),
    ((MNIST_VARS, 2, "greedy", 0), "max_shard_bytes"),
    (([VariableSpec("a", (2,)), VariableSpec("a", (3,))], 2), "'a' appears twice"),
    (([VariableSpec("e", (4, 4)), VariableSpec("e/part_1", (2,))], 2, "round_robin", 16), "used twice"),
])
def test_bad_arguments_are_invalid(args, message):
    with pytest.raises(InvalidArgumentError, match=message):
        place(*args)


def test_for_shard_out_of_range():
    with pytest.raises(InvalidArgumentError):
        place(MNIST_VARS, 2).for_shard(2)


def test_cli_prints_the_table_and_json(tmp_path):
    runner = CliRunner()
    result = runner.invoke(placement_command, ["--num-ps", "3"])
    assert result.exit_code == 0, result.output
    assert [line.split()[-1] for line in result.output.splitlines()[1:5]] == ["ps:0", "ps:1", "ps:2", "ps:0"]

    spec = tmp_path / "model.json"
    spec.write_text(json.dumps({"type": "mlp", "layers": [20, 8, 3]}))
    result = runner.invoke(placement_command, ["--model", str(spec), "--num-ps", "2", "--placement", "greedy",
                                               "--max-shard-bytes", "200", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [p["key"] for p in out["pieces"]][:3] == ["hidden/weights/part_0", "hidden/weights/part_1",
                                                     "hidden/weights/part_2"]
    assert sum(out["shard_bytes"]) == 4 * (20 * 8 + 8 + 8 * 3 + 3)

    inline = runner.invoke(placement_command, ["--model", '{"type": "mlp", "layers": [4, 2]}', "--num-ps", "1"])
    assert inline.exit_code == 0 and "softmax/weights" in inline.output


def test_cli_reports_errors_and_is_registered():
    from zmqflow.cli.main import main
    result = CliRunner().invoke(main, ["placement", "--num-ps", "0"])
    assert result.exit_code == 2 and "InvalidArgumentError" in result.output
