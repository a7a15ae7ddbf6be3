"""The one reader of the YAML and JSON a user writes (common/spec_files.py): YAML 1.2, one-line errors
naming the file and place, and every spec read through it."""

import os
import re

import pytest

from zmqflow.common.cluster.spec import ClusterSpec
from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.common.spec_files import parse_yaml, read_spec_file
from zmqflow.models.spec import read_spec, with_options

pytestmark = pytest.mark.unit
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_yes_no_on_off_stay_strings_and_numbers_dates_and_booleans_read_as_yaml_1_2(tmp_path):
    text = "classes: [no, yes]\nflags: [on, off, true, false]\nlr: 1e-3\nday: 2024-05-01\nmode: 010\n"
    assert parse_yaml(text, "x") == {"classes": ["no", "yes"], "flags": ["on", "off", True, False], "lr": 0.001,
                                     "day": "2024-05-01", "mode": 10}
    (tmp_path / "spec.yaml").write_text(text)
    (tmp_path / "spec.json").write_text('{"classes": ["no", "yes"]}')
    assert read_spec_file(tmp_path / "spec.yaml")["classes"] == ["no", "yes"]
    assert read_spec_file(tmp_path / "spec.json") == {"classes": ["no", "yes"]}


@pytest.mark.parametrize("name, text, message", [
    ("a.yaml", "lr: [0.1\nseed: 1\n", "data spec {path} is not valid YAML: line 2, column 5: expected ',' or ']'"),
    ("a.yaml", "lr: 1\nlr: 2\n", "data spec {path} is not valid YAML: line 2, column 1: found duplicate key \"lr\""),
    ("a.yaml", "x: !!python/object:os.system ls\n", "data spec {path} is not valid YAML: line 1, column 4: could "
                                                    "not determine a constructor"),
    ("a.json", '{"lr": 1, "lr": 2}', "data spec {path} is not valid JSON: key 'lr' is given twice"),
    ("a.json", '{"lr": }', "data spec {path} is not valid JSON: line 1, column 8: Expecting value"),
])
def test_errors_are_one_line_naming_the_file_line_and_column(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InvalidArgumentError) as error:
        read_spec_file(path, "data spec")
    assert str(error.value).startswith(message.format(path=path)) and "\n" not in str(error.value)
    with pytest.raises(NotFoundError, match=re.escape(f"data spec {tmp_path / 'none.yaml'} does not exist")):
        read_spec_file(tmp_path / "none.yaml", "data spec")


def test_model_specs_options_and_cluster_specs_are_read_by_it(tmp_path):
    assert with_options({"type": "cnn"}, ["padding=no", "filters=[8, 16]"]) == {"type": "cnn", "padding": "no",
                                                                               "filters": [8, 16]}
    (tmp_path / "model.yaml").write_text("type: mlp\nactivation: relu\nlayers: [4, 8, 2]\nlayers: [4, 2]\n")
    with pytest.raises(InvalidArgumentError, match="model spec file .*model.yaml is not valid YAML: line 4"):
        read_spec(str(tmp_path / "model.yaml"))
    (tmp_path / "cluster.yaml").write_text("ps: [localhost:5600]\nworker: [localhost:5601]\nps: [localhost:5602]\n")
    with pytest.raises(InvalidArgumentError, match="cluster spec file .*cluster.yaml is not valid YAML: line 3"):
        ClusterSpec.from_file(tmp_path / "cluster.yaml")


def test_no_module_reads_yaml_any_other_way():
    """PyYAML reads yes/no as booleans: the package reads YAML only through common/spec_files.py (PyYAML
    still writes the Kubernetes manifests, jobs/k8s/render.py)."""
    offenders = []
    for folder in ("common", "models", "inputs", "adapters", "services", "jobs", "cli", "bench", "loadtest", "data"):
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    with open(path, encoding="utf-8") as f:
                        source = f.read()
                    if re.search(r"yaml\.(safe_)?load|YAML\(", source) and not path.endswith("spec_files.py"):
                        offenders.append(os.path.relpath(path, ROOT))
    assert not offenders, f"read YAML with zmqflow.common.spec_files.read_spec_file / parse_yaml: {offenders}"
