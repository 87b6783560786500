"""A user's table as the user holds it: csv:, parquet:, hf-disk: and DataFrame datasets, the
column keys (label-column, feature-columns, partition-column), a callable's dataset-args, the
label rules (remap-labels) and every bad input's message (fast: tiny files, in process)."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

import fedcluster_app.families  # noqa: F401
from fedcluster_app.core.config import ConfigError, parse_run_config
from fedcluster_app.core.data import build_scenario
from fedcluster_app.core.data.sources import load_user_data
from fedcluster_app.core.data.tables import ReadOptions, column_names, dataset_args
from fedcluster_app.engine import run_inprocess
from tests.support import ROOT

IRIS = ROOT / "examples" / "data" / "iris_users.csv"
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
SPECIES = ReadOptions(label_column="species", remap_labels=True)
BY_USER = ReadOptions(label_column="species", remap_labels=True, partition_column="user")


@pytest.fixture(autouse=True)
def _repository_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


@pytest.fixture
def iris() -> pd.DataFrame:
    return pd.read_csv(IRIS)


def rows_of(x: np.ndarray) -> set[bytes]:
    return {r.tobytes() for r in np.asarray(x, dtype=np.float32)}


# --------------------------------------------------------------------------- the iris table


def test_iris_csv_trains_with_one_client_per_user(tmp_path, caplog):
    caplog.set_level("INFO", logger="flwr")
    summary = run_inprocess({"strategy": "fedavg", "scenario": "dataset-static",
                             "dataset": f"csv:{IRIS}", "label-column": "species",
                             "partition-column": "user", "remap-labels": True,
                             "rounds-per-step": 3, "num-steps": 3, "progress": False,
                             "plot": False, "out-dir": str(tmp_path / "run")})
    assert summary["status"] == "completed" and summary["final_accuracy"] > 0.8
    assert "'setosa' -> 0, 'versicolor' -> 1, 'virginica' -> 2" in caplog.text


def test_each_user_is_one_client_with_its_own_train_and_test_rows(iris):
    s = build_scenario("dataset-static", dataset=f"csv:{IRIS}", label_column="species",
                       partition_column="user", remap_labels=True, samples_per_step=200,
                       test_samples=100)
    data = load_user_data(f"csv:{IRIS}", read=BY_USER)
    assert s.num_clients == 5 and data.group_names == ("user0", "user1", "user2", "user3",
                                                       "user4")
    assert (s.model, s.input_shape, s.num_classes) == ("mlp", (4,), 3)
    for k, user in enumerate(data.group_names):
        mine = iris[iris.user == user]
        own = rows_of(data.x_train[data.groups_train == k]) | rows_of(
            data.x_test[data.groups_test == k])
        assert len(own) == len(mine.drop_duplicates(FEATURES))
        step = s.step_data(k, 1)
        train, test = rows_of(step.x_train), rows_of(step.x_test)
        assert train <= rows_of(data.x_train[data.groups_train == k])
        assert test <= rows_of(data.x_test[data.groups_test == k]) and not train & test
        assert len(step.y_train) + len(step.y_test) == len(mine)   # every row, once


def test_csv_parquet_hf_disk_and_a_data_frame_read_the_same_table(tmp_path, iris, monkeypatch):
    from datasets import Dataset

    iris.to_parquet(tmp_path / "iris.parquet")
    Dataset.from_pandas(iris).save_to_disk(str(tmp_path / "hf"))
    (tmp_path / "semi.csv").write_text(iris.to_csv(sep=";", index=False))
    specs = [f"csv:{IRIS}", f"parquet:{tmp_path / 'iris.parquet'}", f"hf-disk:{tmp_path / 'hf'}",
             f"csv:{tmp_path / 'semi.csv'}"]
    read = ReadOptions(label_column="species", remap_labels=True,
                       feature_columns=tuple(FEATURES))
    first = load_user_data(specs[0], read=read)
    for spec in specs[1:]:
        other = load_user_data(spec, read=read)
        np.testing.assert_array_equal(other.x_train, first.x_train)
        np.testing.assert_array_equal(other.y_test, first.y_test)
    (tmp_path / "frame.py").write_text(
        "import pandas as pd\n\ndef load(path):\n    return pd.read_csv(path)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    framed = load_user_data("frame:load", read=ReadOptions(
        label_column="species", remap_labels=True, feature_columns=tuple(FEATURES),
        dataset_args=(("path", str(IRIS)),)))
    np.testing.assert_array_equal(framed.x_train, first.x_train)


def test_a_dataset_dict_keeps_its_test_split_per_user(tmp_path, iris):
    from datasets import Dataset, DatasetDict

    test = iris.groupby("user").head(2)
    train = iris.drop(index=test.index)
    DatasetDict(train=Dataset.from_pandas(train, preserve_index=False),
                test=Dataset.from_pandas(test, preserve_index=False)).save_to_disk(
        str(tmp_path / "dd"))
    data = load_user_data(f"hf-disk:{tmp_path / 'dd'}", read=BY_USER)
    assert np.bincount(data.groups_test).tolist() == [2] * 5
    assert np.bincount(data.groups_train).tolist() == (
        train.user.value_counts().sort_index().tolist())
    DatasetDict(train=Dataset.from_pandas(train, preserve_index=False),
                test=Dataset.from_pandas(test[test.user != "user3"], preserve_index=False)
                ).save_to_disk(str(tmp_path / "untested"))
    with pytest.raises(ValueError, match=r"the values \['user3'\] have no rows in the test split"):
        load_user_data(f"hf-disk:{tmp_path / 'untested'}", read=BY_USER)


def test_feature_columns_default_to_every_other_column_and_may_be_named(tmp_path, iris):
    spec = f"csv:{IRIS}"
    every = load_user_data(spec, read=BY_USER)
    assert every.input_shape == (4,)                 # user (partition) and species left out
    two = load_user_data(spec, read=ReadOptions(label_column="species", remap_labels=True,
                                                feature_columns=("petal_width", "sepal_length"),
                                                partition_column="user"))
    assert two.input_shape == (2,)
    x = iris[["petal_width", "sepal_length"]].to_numpy()
    assert np.allclose(np.corrcoef(two.x_train[:, 0], two.x_train[:, 1])[0, 1],
                       np.corrcoef(x[:, 0], x[:, 1])[0, 1], atol=0.1)
    assert column_names(" a, b ,c") == ("a", "b", "c") and column_names("") == ()


def test_integer_labels_and_a_label_named_column_need_no_keys(tmp_path, iris):
    table = iris.drop(columns="user").assign(label=pd.factorize(iris.species, sort=True)[0])
    table.drop(columns="species").to_csv(tmp_path / "t.csv", index=False)
    data = load_user_data(f"csv:{tmp_path / 't.csv'}")
    assert data.input_shape == (4,) and data.num_classes == 3


def test_a_node_reads_its_own_table_file(tmp_path, iris, caplog):
    from flwr.app import Context, RecordDict

    from fedcluster_app.client_app import make_client

    iris[iris.user == "user2"].to_csv(tmp_path / "mine.csv", index=False)
    run_config = {"scenario": "dataset-static", "dataset": f"csv:{IRIS}",
                  "label-column": "species", "partition-column": "user", "remap-labels": True,
                  "num-clients": 5, "num-classes": 3}
    for node_file, client_id, user in ((tmp_path / "mine.csv", 3, "user2"), (IRIS, 2, "user2"),
                                       (IRIS, 4, "user4")):
        context = Context(run_id=1, node_id=1, state=RecordDict(), run_config=run_config,
                          node_config={"client-id": client_id, "data-dir": f"csv:{node_file}"})
        client = make_client(context)
        rows = len(client.train_data(1)[1]) + len(client.test_data(1)[1])
        assert rows == int((iris.user == user).sum())
        assert client.exp.scenario.params["partition"] == ""
    caplog.set_level("INFO", logger="flwr")
    caplog.clear()
    context = Context(run_id=1, node_id=1, state=RecordDict(), run_config=run_config,
                      node_config={"client-id": 4, "data-dir": f"csv:{IRIS}"})
    for _ in range(3):        # three messages to one node: it says what it holds once
        make_client(context)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "'setosa' -> 0" in said[0]
    assert said[1].startswith("small data: samples-per-step = 200, but client 4 holds 5 rows")


# ------------------------------------------------------------------------- dataset-args


def test_a_callable_takes_its_path_from_dataset_args(tmp_path, monkeypatch):
    np.savez(tmp_path / "blobs.npz", x=np.random.default_rng(0).normal(size=(60, 2)),
             y=np.repeat([0, 1, 2], 20))
    (tmp_path / "loader.py").write_text(
        "import numpy as np\n\n"
        "def load(path, rows=60, seed=0):\n"
        "    with np.load(path) as f:\n"
        "        return f['x'][:rows], f['y'][:rows]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = f"path={tmp_path / 'blobs.npz'},rows=45"
    s = build_scenario("dataset-static", dataset="loader:load", dataset_args=spec)
    data = s.realisation.source
    assert len(data.train_pool) + len(data.test_pool) == 45
    assert dataset_args(spec) == (("path", str(tmp_path / "blobs.npz")), ("rows", 45))
    assert dataset_args("cols=a,b, flag=true") == (("cols", "a,b"), ("flag", True))
    with pytest.raises(ValueError, match=r"dataset-args: loader:load has no parameter 'pth' "
                                         r"\(did you mean 'path'\?\); its parameters are "
                                         r"\['path', 'rows'\]"):
        build_scenario("dataset-static", dataset="loader:load", dataset_args="pth=x.npz")
    with pytest.raises(ValueError, match=r"cannot be called with \['seed'\].*missing a required "
                                         r"argument: 'path'"):
        build_scenario("dataset-static", dataset="loader:load")
    with pytest.raises(ValueError, match="dataset-args sets seed"):
        build_scenario("dataset-static", dataset="loader:load", dataset_args="path=a,seed=3")
    with pytest.raises(ValueError, match=r"dataset-args are the keyword arguments of a "
                                         r"package.module:callable"):
        build_scenario("dataset-static", dataset=f"csv:{IRIS}", dataset_args="path=a",
                       label_column="species", remap_labels=True)


# ------------------------------------------------------------------------------- labels


@pytest.fixture
def gaps(tmp_path) -> str:
    x = np.random.default_rng(0).normal(size=(90, 3))
    np.savez(tmp_path / "gaps.npz", x=x, y=np.repeat([0, 2, 5], 30))
    return f"npz:{tmp_path / 'gaps.npz'}"


def test_labels_with_empty_classes_are_refused_or_remapped_as_the_key_says(gaps):
    with pytest.raises(ValueError, match=r"y holds the labels \{0, 2, 5\}, so classes 1, 3, 4 "
                                         r"have no rows.*remap-labels = true.*num-classes = 6"):
        build_scenario("dataset-static", dataset=gaps)
    s = build_scenario("dataset-static", dataset=gaps, remap_labels=True)
    assert s.num_classes == 3
    assert set(s.step_data(0, 1).y_train.tolist()) == {0, 1, 2}
    assert s.data_report()[0].endswith("remap-labels: the 3 distinct labels of y are numbered "
                                       "0..2 in sorted order: 0 -> 0, 2 -> 1, 5 -> 2")
    kept = build_scenario("dataset-static", dataset=gaps, num_classes=6)  # the user's choice
    assert kept.num_classes == 6


def test_text_labels_are_refused_unless_remapped(tmp_path, iris):
    with pytest.raises(ValueError, match=r"label column 'species' holds text labels such as "
                                         r"'setosa'.*remap-labels = true"):
        load_user_data(f"csv:{IRIS}", read=ReadOptions(label_column="species",
                                                       partition_column="user"))
    iris.assign(width=iris.petal_width).to_csv(tmp_path / "w.csv", index=False)
    with pytest.raises(ValueError, match=r"label column 'width' holds the non-integral label "
                                         r"0.2.*not a regression target"):
        load_user_data(f"csv:{tmp_path / 'w.csv'}", read=ReadOptions(
            label_column="width", feature_columns=("sepal_length",)))


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("key, value, message", [
    ("label_column", "specis", r"label-column = 'specis': dataset csv:.* has no such column "
                               r"\(did you mean 'species'\?\); its columns are \['sepal_length'"),
    ("partition_column", "User", r"partition-column = 'User'.*no such column \(did you mean "
                                 r"'user'\?\)"),
    ("feature_columns", "sepal_length,petal_lenght", r"feature-columns = 'petal_lenght'.*did you "
                                                     r"mean 'petal_length'"),
])
def test_a_column_that_does_not_exist_lists_those_that_do(key, value, message):
    kwargs = {"label_column": "species", "remap_labels": True, "partition_column": "user",
              key: value}
    with pytest.raises(ValueError, match=message):
        build_scenario("dataset-static", dataset=f"csv:{IRIS}", **kwargs)


def test_a_partition_column_with_more_values_than_clients_says_how_many():
    with pytest.raises(ValueError, match=r"partition-column 'user': found 5 distinct values "
                                         r"\('user0', .*\) for num-clients = 3.*set num-clients "
                                         r"= 5"):
        build_scenario("dataset-static", dataset=f"csv:{IRIS}", label_column="species",
                       remap_labels=True, partition_column="user", num_clients=3)
    with pytest.raises(ValueError, match=r"partition and disjoint would be ignored"):
        build_scenario("dataset-static", dataset=f"csv:{IRIS}", label_column="species",
                       remap_labels=True, partition_column="user", disjoint=True)
    with pytest.raises(ValueError, match=r"dirichlet-alpha would be ignored"):
        build_scenario("dataset-static", dataset=f"csv:{IRIS}", label_column="species",
                       remap_labels=True, partition_column="user", dirichlet_alpha=0.5)


def test_missing_labels_text_features_and_unknown_label_columns_are_named(tmp_path, iris):
    holes = iris.copy()
    holes.loc[[4, 17], "species"] = None
    holes.to_csv(tmp_path / "holes.csv", index=False)
    with pytest.raises(ValueError, match=r"label column 'species' has 2 missing values \(the "
                                         r"first in row 4\)"):
        load_user_data(f"csv:{tmp_path / 'holes.csv'}", read=BY_USER)
    with pytest.raises(ValueError, match=r"feature column 'user' holds .* values such as "
                                         r"'user2'; expected numbers"):
        load_user_data(f"csv:{IRIS}", read=SPECIES)
    with pytest.raises(ValueError, match=r"cannot tell the label column: no column is named one "
                                         r"of label.*Name it with the run-config key "
                                         r"label-column"):
        load_user_data(f"csv:{IRIS}")


def test_empty_files_are_refused_naming_the_path(tmp_path):
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 3)), y=np.zeros(0, dtype=int))
    with pytest.raises(ValueError, match=r"dataset npz:.*empty\.npz: holds no samples"):
        build_scenario("dataset-static", dataset=f"npz:{tmp_path / 'empty.npz'}")
    (tmp_path / "header.csv").write_text("a,b,label\n")
    with pytest.raises(ValueError, match=r"dataset csv:.*header\.csv: holds no samples"):
        load_user_data(f"csv:{tmp_path / 'header.csv'}")
    (tmp_path / "nothing.csv").write_text("")
    with pytest.raises(ValueError, match=r"dataset csv:.*nothing\.csv: the file is empty"):
        load_user_data(f"csv:{tmp_path / 'nothing.csv'}")


def test_keys_that_would_be_ignored_are_refused(tmp_path, gaps):
    with pytest.raises(ValueError, match=r"name the columns of a table.*npz:.* has none"):
        build_scenario("dataset-static", dataset=gaps, label_column="y")
    with pytest.raises(ValueError, match=r"tests.plugins.my_data:load returned tuple, which has "
                                         r"none"):
        build_scenario("dataset-static", dataset="tests.plugins.my_data:load",
                       label_column="y")
    with pytest.raises(ValueError, match=r"`label-column` says how to read your dataset.*"
                                         r"scenario digits-static"):
        build_scenario("digits-static", label_column="y")
    with pytest.raises(ValueError, match=r"scenario digits-ccfa does not read `remap-labels`"):
        build_scenario("digits-ccfa", remap_labels=True)
    with pytest.raises(ValueError, match=r"scenario mixture-swap generates its data: oversample"):
        build_scenario("mixture-swap", oversample=True)


def test_the_run_config_checks_the_new_keys_formats():
    for key, value, message in (
            ("feature-columns", "a,,b", r"feature-columns = 'a,,b' has an empty name"),
            ("feature-columns", "a,a", r"names \['a'\] twice"),
            ("dataset-args", "path", r"'path' is not key=value"),
            ("dataset-args", "a=1,a=2", r"sets 'a' twice"),
            ("remap-labels", "perhaps", r"remap-labels must be of type bool")):
        with pytest.raises(ConfigError, match=message):
            parse_run_config({key: value})
