"""The search space without sockets: grid expansion, seeded random search, and clear errors for bad specs."""

import json

import pytest
from click.testing import CliRunner

from zmqflow.cli.main import main
from zmqflow.jobs.sweep.space import DEFAULTS, SpaceError, describe, grid, load_space, model_options, parse_grid, sample

pytestmark = pytest.mark.unit


def test_grid_expands_every_combination_in_order_with_defaults():
    points = grid(parse_grid("lr=0.001,0.01; hidden=64,128x64 ;optimizer=adam,sgd"))
    assert len(points) == 8
    assert points[0] == {**DEFAULTS, "learning_rate": 0.001, "hidden": [64], "optimizer": "adam"}
    assert points[1]["optimizer"] == "sgd" and points[2]["hidden"] == [128, 64]  # the last axis changes fastest
    assert points[-1] == {**DEFAULTS, "learning_rate": 0.01, "hidden": [128, 64], "optimizer": "sgd"}


def test_aliases_types_and_base_values():
    points = grid(parse_grid("batch=50,200;epochs=2;activation=relu"), base={"epochs": 5, "batch_size": 10})
    assert [p["batch_size"] for p in points] == [50, 200]
    assert all(p["epochs"] == 2 and p["activation"] == "relu" for p in points)  # the space beats the base
    assert grid(parse_grid("lr=0.1"), base={"epochs": 5})[0]["epochs"] == 5


def test_random_search_is_seeded_and_stays_in_its_ranges():
    space = parse_grid("lr=log:1e-4..1e-1;hidden=32,64;batch_size=20..200;optimizer=adam,sgd,momentum")
    first, again, other = sample(space, 20, seed=7), sample(space, 20, seed=7), sample(space, 20, seed=8)
    assert first == again and first != other
    assert all(1e-4 <= p["learning_rate"] <= 1e-1 for p in first)
    assert all(20 <= p["batch_size"] <= 200 and isinstance(p["batch_size"], int) for p in first)
    assert {tuple(p["hidden"]) for p in first} == {(32,), (64,)}
    # log-uniform: about as many draws below 1e-2.5 as above (uniform would put ~97 % above)
    low = sum(p["learning_rate"] < 10 ** -2.5 for p in sample(space, 400, seed=1))
    assert 140 < low < 260


def test_space_file_yaml_and_json(tmp_path):
    yaml_file = tmp_path / "space.yaml"
    yaml_file.write_text("lr: [0.001, 0.01]\nhidden: [64, [128, 64]]\nepochs: 2\n")
    points = grid(load_space(str(yaml_file)))
    assert [p["hidden"] for p in points] == [[64], [128, 64], [64], [128, 64]]
    json_file = tmp_path / "space.json"
    json_file.write_text(json.dumps({"learning_rate": {"log_uniform": [0.0001, 0.1]}, "optimizer": ["sgd"]}))
    assert len(sample(load_space(str(json_file)), 3, seed=0)) == 3


@pytest.mark.parametrize("spec, message", [
    ("", "empty"),
    ("lr", "not NAME=VALUE"),
    ("lr=", "empty value"),
    ("lr=0.1,,0.2", "empty value"),
    ("momentum=0.9", "unknown hyperparameter 'momentum'"),
    ("lr=-1", "positive number"),
    ("lr=fast", "not a number"),
    ("hidden=0", "positive integer"),
    ("hidden=64xa", "positive integer"),
    ("epochs=1.5", "positive integer"),
    ("optimizer=rmsprop", "not one of sgd, momentum, adam, adagrad"),
    ("activation=gelu", "not one of"),
    ("lr=0.1;lr=0.2", "appears twice"),
    ("lr=0.1;learning_rate=0.2", "given twice"),
    ("lr=3..1", "empty"),
    ("lr=log:0..1", "positive"),
    ("lr=a..b", "LOW..HIGH"),
    ("hidden=16..64", "only learning_rate, batch_size and epochs take a range"),
])
def test_bad_grid_specs_are_named(spec, message):
    with pytest.raises(SpaceError, match=message):
        grid(parse_grid(spec))


def test_a_range_needs_random_search_and_bad_files_are_named(tmp_path):
    with pytest.raises(SpaceError, match="use --random N"):
        grid(parse_grid("lr=log:1e-4..1e-1"))
    with pytest.raises(SpaceError, match="does not exist"):
        load_space(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [0.1\n")
    with pytest.raises(SpaceError, match="not valid YAML"):
        load_space(str(bad))
    bad.write_text("[1, 2]\n")
    with pytest.raises(SpaceError, match="mapping"):
        load_space(str(bad))
    bad.write_text("lr: {normal: [0, 1]}\n")
    with pytest.raises(SpaceError, match="uniform"):
        load_space(str(bad))


def test_cli_reports_bad_specs_and_lists_runs():
    runner = CliRunner()
    result = runner.invoke(main, ["sweep", "--grid", "lr=0.1;foo=2"])
    assert result.exit_code == 2 and "Invalid value for --grid: unknown hyperparameter 'foo'" in result.output
    result = runner.invoke(main, ["sweep"])
    assert result.exit_code == 2 and "--grid" in result.output and "--space" in result.output
    result = runner.invoke(main, ["sweep", "--grid", "lr=0.1", "--space", "x.yaml"])
    assert result.exit_code == 2 and "not both" in result.output
    result = runner.invoke(main, ["sweep", "--grid", "lr=log:1e-3..1e-1;hidden=8,16", "--random", "3", "--seed", "4",
                                  "--dry-run"])
    assert result.exit_code == 0 and result.output.count("run-00") == 3, result.output
    assert result.output == runner.invoke(main, ["sweep", "--grid", "lr=log:1e-3..1e-1;hidden=8,16", "--random", "3",
                                                 "--seed", "4", "--dry-run"]).output


def test_help_documents_every_option():
    output = CliRunner().invoke(main, ["sweep", "--help"]).output
    for option in ("--grid", "--space", "--random", "--seed", "--parallel", "--epochs", "--batch-size", "--out",
                   "--keep-best", "--input", "--validation-fraction", "--split-seed", "--backend", "--run-timeout-secs",
                   "--dry-run", "--json"):
        assert option in output


def test_model_option_axes_read_values_as_yaml_and_keep_brackets_whole():
    space = parse_grid("lr=0.01;model.filters=[8,16],[16, 32];model.dropout=0,0.25;model.name=wide")
    assert space["model.filters"] == [[8, 16], [16, 32]] and space["model.dropout"] == [0, 0.25]
    points = grid(space)
    assert len(points) == 4 and points[0]["model.name"] == "wide"
    assert model_options(points[1]) == {"filters": [8, 16], "dropout": 0.25, "name": "wide"}
    assert describe(points[1], mlp=False) == ("lr=0.01 adam bs=100 ep=3 model.filters=[8, 16] model.dropout=0.25 "
                                              "model.name=wide")
    with pytest.raises(SpaceError, match="a model option axis is model.NAME"):
        parse_grid("model.=3")
    with pytest.raises(SpaceError, match=r"model.filters: '\[8,' is not valid YAML"):
        parse_grid("model.filters=[8,")


def test_cli_checks_every_runs_model_before_starting():
    runner = CliRunner()
    listed = runner.invoke(main, ["sweep", "--model", "cnn", "--model-opt", "dense=32", "--grid",
                                  "model.filters=[4,8],[8,16]", "--dry-run"])
    assert listed.exit_code == 0 and "run-002  lr=0.002 adam bs=100 ep=3 model.filters=[8, 16]" in listed.output
    unknown = runner.invoke(main, ["sweep", "--model", "cnn", "--grid", "model.width=3", "--dry-run"])
    assert unknown.exit_code == 2 and "model spec field 'width' is not known for type 'cnn'" in unknown.output
    shaped = runner.invoke(main, ["sweep", "--model", "cnn", "--grid", "hidden=64", "--dry-run"])
    assert shaped.exit_code == 2 and "hidden shapes the built-in MLP; cnn takes model.<option> axes" in shaped.output


def test_a_space_file_is_read_as_yaml_1_2(tmp_path):
    """yes/no stay the strings written (YAML 1.1 made them booleans), 1e-3 is a number, a key twice is an error."""
    space = tmp_path / "space.yaml"
    space.write_text("lr: [1e-3, 0.01]\nmodel.padding: [no, yes]\nmodel.use_bias: [true]\n")
    points = grid(load_space(str(space)))
    assert [p["learning_rate"] for p in points] == [0.001, 0.001, 0.01, 0.01]
    assert [model_options(p) for p in points[:2]] == [{"padding": "no", "use_bias": True},
                                                       {"padding": "yes", "use_bias": True}]
    assert model_options(grid(parse_grid("model.padding=no,on"))[1]) == {"padding": "on"}
    space.write_text("lr: [0.1]\nlr: [0.2]\n")
    with pytest.raises(SpaceError, match=r"space\.yaml is not valid YAML: line 2, column 1: found duplicate key"):
        load_space(str(space))
