"""A user's own dataset as a drifting federated scenario: sources, scenarios, partitions and the
node-config override (fast: tiny files under tmp_path, no Ray)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import fedcluster_app.families  # noqa: F401  (the registered scenarios, e.g. digits-ccfa)
from fedcluster_app.core.config import ConfigError, parse_run_config
from fedcluster_app.core.data import build_scenario
from fedcluster_app.core.data.catalogue import METADATA_ONLY
from fedcluster_app.core.data.sources import load_user_data
from tests.support import ROOT

SWAP = (0, 2, 1, 3, 4, 5, 6, 7)  # FedCCFA's group-1 swap 1<->2 on 8 classes


@pytest.fixture(autouse=True)
def _repository_on_path(monkeypatch):
    """``tests.plugins.my_data`` is imported by path, as from the repository root."""
    monkeypatch.syspath_prepend(str(ROOT))


def blobs(classes: int = 8, per_class: int = 40, dim: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(classes), per_class)
    centres = rng.normal(0.0, 5.0, size=(classes, dim))
    return (centres[y] + rng.normal(size=(len(y), dim))).astype(np.float32) * 3 + 7, y


def write_npz(path: Path, **arrays) -> str:
    np.savez(path, **arrays)
    return f"npz:{path}"


def rows_to_labels(x: np.ndarray, y: np.ndarray) -> dict[bytes, int]:
    return {row.tobytes(): int(label) for row, label in zip(x, y)}


def rows_to_index(x: np.ndarray) -> dict[bytes, int]:
    return {row.tobytes(): i for i, row in enumerate(x)}


# ------------------------------------------------------------------------------------- sources


def test_npz_images_get_channels_and_stay_in_unit_range(tmp_path):
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 12)
    nhw = write_npz(tmp_path / "gray.npz", x=rng.integers(0, 256, (36, 6, 6), dtype=np.uint8), y=y)
    data = load_user_data(nhw)
    assert data.image and data.input_shape == (1, 6, 6) and data.num_classes == 3
    assert data.max_value == 255.0 and len(data.y_train) + len(data.y_test) == 36
    nhwc = write_npz(tmp_path / "rgb.npz", x=rng.integers(0, 256, (36, 5, 7, 3), dtype=np.uint8),
                     y=y)
    assert load_user_data(nhwc).input_shape == (3, 5, 7)   # channels-last is transposed
    s = build_scenario("dataset-noise", dataset=nhwc, samples_per_step=20, test_samples=5)
    d = s.step_data(0, 4)                                    # client 0: noisy from step 3
    assert (s.model, s.input_shape) == ("cnn", (3, 5, 7))
    assert d.x_train.shape == (20, 3, 5, 7) and 0.0 <= d.x_train.min() <= d.x_train.max() <= 1.0


def test_npz_features_are_standardised_and_split_stratified(tmp_path):
    x, y = blobs(classes=4, per_class=40)
    data = load_user_data(write_npz(tmp_path / "t.npz", x=x, y=y), seed=3, test_fraction=0.25)
    assert not data.image and data.input_shape == (4,) and data.num_classes == 4
    np.testing.assert_allclose(data.x_train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(data.x_train.std(axis=0), 1.0, atol=1e-4)
    assert np.bincount(data.y_test).tolist() == [10, 10, 10, 10]
    assert not data.x_train.flags.writeable
    given = write_npz(tmp_path / "split.npz", x=x[:100], y=y[:100], x_test=x[100:], y_test=y[100:])
    kept = load_user_data(given)
    assert len(kept.y_train) == 100 and len(kept.y_test) == 60   # a given test split is kept


def _png(path: Path, size: tuple[int, int], value: int, mode: str = "L") -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value if mode == "L" else (value, 0, 0)).save(path)


def test_imagefolder_train_test_and_one_folder_split(tmp_path):
    for split, n in (("train", 4), ("test", 2)):
        for c, name in enumerate(("cat", "dog", "eel")):
            for i in range(n):
                _png(tmp_path / "tree" / split / name / f"{i}.png", (8, 6), 40 * c + i)
    data = load_user_data(f"imagefolder:{tmp_path / 'tree'}")
    assert data.input_shape == (1, 6, 8) and data.num_classes == 3
    assert (len(data.y_train), len(data.y_test)) == (12, 6)
    assert sorted(np.bincount(data.y_test)) == [2, 2, 2]
    for c in range(2):
        for i in range(4):
            _png(tmp_path / "flat" / f"c{c}" / f"{i}.png", (5, 5), 100, mode="RGB")
    flat = load_user_data(f"imagefolder:{tmp_path / 'flat'}", test_fraction=0.25)
    assert flat.input_shape == (3, 5, 5) and (len(flat.y_train), len(flat.y_test)) == (6, 2)


def test_imagefolder_images_of_another_size_are_named(tmp_path):
    _png(tmp_path / "a" / "0.png", (6, 6), 1)
    _png(tmp_path / "b" / "odd.png", (7, 6), 1)
    with pytest.raises(ValueError, match=r"dataset imagefolder:.*odd\.png.*7x6.*same size"):
        load_user_data(f"imagefolder:{tmp_path}")


def test_hf_disk_dataset_dict_and_ambiguous_columns(tmp_path):
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image
    from PIL import Image as PILImage

    images = [PILImage.new("L", (6, 6), 10 * i) for i in range(12)]
    feats = Features({"img": Image(), "label": ClassLabel(num_classes=3)})
    ds = Dataset.from_dict({"img": images, "label": [i % 3 for i in range(12)]}, features=feats)
    DatasetDict(train=ds, test=ds.select(range(6))).save_to_disk(str(tmp_path / "dd"))
    data = load_user_data(f"hf-disk:{tmp_path / 'dd'}")
    assert data.input_shape == (1, 6, 6) and data.num_classes == 3
    assert (len(data.y_train), len(data.y_test)) == (12, 6)
    x, y = blobs(classes=2, per_class=6, dim=3)
    Dataset.from_dict({"x": x.tolist(), "features": x.tolist(), "y": y}).save_to_disk(
        str(tmp_path / "two"))
    with pytest.raises(ValueError, match=r"dataset hf-disk:.*input column.*\['x', 'features', 'y'\]"):
        load_user_data(f"hf-disk:{tmp_path / 'two'}")


def test_module_callable_gets_the_seed_and_may_return_a_torch_dataset():
    data = load_user_data("tests.plugins.my_data:load", seed=5)
    assert data.input_shape == (2,) and data.num_classes == 3 and len(data.y_test) == 45
    again = load_user_data("tests.plugins.my_data:load", seed=6)
    assert not np.array_equal(data.x_train, again.x_train)           # seed = the data seed
    pairs = load_user_data("tests.plugins.my_data:load_torch")
    assert pairs.input_shape == (2,) and pairs.num_classes == 3
    s = build_scenario("dataset-permute", dataset="tests.plugins.my_data:load")
    assert (s.model, s.hidden, s.num_classes) == ("mlp", 16, 3)


def test_module_errors_name_the_key_and_what_was_expected():
    with pytest.raises(ValueError, match=r"dataset: cannot import module 'tests.plugins.nope'"):
        load_user_data("tests.plugins.nope:load")
    with pytest.raises(ValueError, match=r"dataset: tests.plugins.my_data:load_wrong returned str; "
                                         r"expected \(x, y\) arrays"):
        load_user_data("tests.plugins.my_data:load_wrong")


@pytest.mark.parametrize("labels, message", [
    (np.array([0.0, 1.5] * 10), "non-integral label 1.5"),
    (np.array([0, -1] * 10), "negative label -1"),
    (np.array(["cat", "dog"] * 10), "labels such as 'cat'.*map class names"),
])
def test_bad_labels_are_refused_with_the_path(tmp_path, labels, message):
    spec = write_npz(tmp_path / "bad.npz", x=np.zeros((20, 3), np.float32), y=labels)
    with pytest.raises(ValueError, match=rf"dataset npz:.*bad\.npz: y holds .*{message}"):
        load_user_data(spec)


def test_missing_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dataset: npz:.*missing\.npz: no such file.*x and y"):
        load_user_data(f"npz:{tmp_path / 'missing.npz'}")
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(ValueError, match=r"dataset npz:.*junk\.npz: cannot read it as a \.npz"):
        load_user_data(f"npz:{tmp_path / 'junk.npz'}")
    spec = write_npz(tmp_path / "nolabel.npz", x=np.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"has arrays \['x'\], missing \['y'\]"):
        load_user_data(spec)
    with pytest.raises(ValueError, match=r"dataset: 'csv-file:data' is not a dataset spec; "
                                         r"expected npz:PATH"):
        load_user_data("csv-file:data")
    with pytest.raises(ValueError, match=r"river:Elec2 is not a classification table bundled"):
        load_user_data("river:Elec2")


# ----------------------------------------------------------------------------------- scenarios


def test_dataset_swap_drifts_and_swaps_the_labels_of_drifting_clients(tmp_path):
    x, y = blobs()
    spec = write_npz(tmp_path / "eight.npz", x=x, y=y)
    s = build_scenario("dataset-swap", dataset=spec, samples_per_step=120,
                       dirichlet_alpha=math.inf)
    m = s.concept_matrix()
    assert (s.model, s.num_classes, s.input_shape) == ("mlp", 8, (4,))
    assert m[1, 0] == 0 and m[2, 0] == 1 and (3, 0, 0, 1) in s.drift_events()
    data = load_user_data(spec)
    truth = rows_to_labels(data.x_train, data.y_train)
    before, after = s.step_data(0, 2), s.step_data(0, 3)
    y_true = np.array([truth[r.tobytes()] for r in before.x_train])
    np.testing.assert_array_equal(before.y_train, y_true)
    y_true = np.array([truth[r.tobytes()] for r in after.x_train])
    assert {1, 2} <= set(y_true.tolist())
    np.testing.assert_array_equal(after.y_train, np.asarray(SWAP)[y_true])


def test_which_scenarios_read_which_keys(tmp_path):
    x, y = blobs(classes=3, per_class=20)
    spec = write_npz(tmp_path / "three.npz", x=x, y=y)
    with pytest.raises(ValueError, match="set the run-config key `dataset`"):
        build_scenario("dataset-swap")
    with pytest.raises(ValueError, match=r"does not read the run-config key `dataset`.*dataset-swap"):
        build_scenario("digits-swap", dataset=spec)
    with pytest.raises(ValueError, match=r"does not read the run-config key `dataset`.*dataset-"):
        build_scenario("digits-ccfa", dataset=spec)
    with pytest.raises(ValueError, match="scenario circle2 has no data pool"):
        build_scenario("circle2", partition="iid")
    with pytest.raises(ValueError, match="need at least 7 classes.*use dataset-permute"):
        build_scenario("dataset-swap", dataset=spec)
    with pytest.raises(ValueError, match="rotation needs image data.*tabular"):
        build_scenario("dataset-rotate", dataset=spec)
    with pytest.raises(ValueError, match=r"classes-per-client must be in 1\.\.3"):
        build_scenario("dataset-static", dataset=spec, partition="pathological",
                       classes_per_client=4)
    with pytest.raises(ValueError, match="unknown partition 'half'"):
        build_scenario("digits-static", partition="half")


def test_default_partition_keeps_the_existing_data():
    base = build_scenario("digits-swap", seed=1)
    same = build_scenario("digits-swap", seed=1, partition="dirichlet", disjoint=False,
                          classes_per_client=2, test_fraction=0.25)
    a, b = base.step_data(3, 4), same.step_data(3, 4)
    for field in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    prior = build_scenario("digits-prior")
    heavy = prior.realisation.class_prior(1, 0)
    assert heavy[:5].sum() > 0.5 and prior.concept_matrix()[2, 0] == 1


def test_disjoint_shards_are_disjoint_and_clients_draw_only_from_theirs(tmp_path):
    x, y = blobs(classes=5, per_class=60)
    spec = write_npz(tmp_path / "five.npz", x=x, y=y)
    s = build_scenario("dataset-static", dataset=spec, num_clients=5, partition="dirichlet",
                       dirichlet_alpha=0.5, disjoint=True, samples_per_step=50)
    real = s.realisation
    n_train = len(load_user_data(spec).y_train)
    union = np.concatenate(real.shards)
    assert len(union) == len(set(union.tolist())) and union.max() < n_train
    index = rows_to_index(load_user_data(spec).x_train)
    for client in range(5):
        drawn = {index[r.tobytes()] for r in s.step_data(client, 2).x_train}
        assert drawn <= set(real.shards[client].tolist())


@pytest.mark.parametrize("disjoint", [False, True])
def test_pathological_clients_see_exactly_k_classes(tmp_path, disjoint):
    x, y = blobs(classes=6, per_class=40)
    spec = write_npz(tmp_path / "six.npz", x=x, y=y)
    s = build_scenario("dataset-static", dataset=spec, num_clients=6, partition="pathological",
                       classes_per_client=2, disjoint=disjoint, samples_per_step=200)
    for client in range(6):
        assert len(set(s.step_data(client, 1).y_train.tolist())) == 2
        assert len(set(s.step_data(client, 1).y_test.tolist())) <= 2


@pytest.mark.parametrize("disjoint", [False, True])
def test_dirichlet_with_small_alpha_is_skewed(tmp_path, disjoint):
    x, y = blobs(classes=8, per_class=50)
    spec = write_npz(tmp_path / "skew.npz", x=x, y=y)

    def top_share(**kwargs) -> float:
        s = build_scenario("digits-static" if kwargs.pop("digits", False) else "dataset-static",
                           num_clients=5, samples_per_step=200, disjoint=disjoint, **kwargs)
        ys = [s.step_data(k, 1).y_train for k in range(5)]   # a shard may hold < 200 rows
        shares = [np.bincount(y, minlength=s.num_classes).max() / len(y) for y in ys]
        return float(np.mean(shares))

    skewed = top_share(dataset=spec, partition="dirichlet", dirichlet_alpha=0.05)
    flat = top_share(dataset=spec, partition="iid")
    assert skewed > 0.5 and flat < 0.25
    assert top_share(digits=True, partition="iid") < 0.25   # every pool family takes the keys


def test_river_table_scenario_has_standardised_features():
    s = build_scenario("imagesegments-swap", samples_per_step=50)
    assert (s.model, s.num_classes, s.input_shape, s.hidden) == ("mlp", 7, (18,), 36)
    pool = s.realisation.source.train_pool
    np.testing.assert_allclose(pool.images.mean(axis=0), 0.0, atol=1e-4)
    assert s.step_data(0, 3).x_train.shape == (50, 18) and s.concept_matrix()[2, 0] == 1
    assert build_scenario("phishing-prior").num_classes == 2
    assert build_scenario("shuttle-permute", partition="iid").num_classes == 2


# ---------------------------------------------------------------------------------- deployment


def test_server_without_the_file_takes_num_classes_and_input_shape(tmp_path):
    from fedcluster_app.core.experiment import load_experiment

    missing = f"npz:{tmp_path / 'on-the-devices.npz'}"
    cfg = {"scenario": "dataset-permute", "dataset": missing, "num-classes": 10,
           "input-shape": "1,28,28"}
    exp = load_experiment(cfg, server=True)
    assert (exp.spec.kind, exp.spec.num_classes, exp.spec.input_shape) == ("cnn", 10, (1, 28, 28))
    with pytest.raises(ValueError, match="cannot read dataset.*set the run-config keys num-classes "
                                         "and input-shape"):
        build_scenario("dataset-permute", dataset=missing, data_dir=METADATA_ONLY)


def test_node_config_data_dir_spec_replaces_the_run_config_dataset(tmp_path):
    from flwr.app import Context, RecordDict

    from fedcluster_app.client_app import make_client

    x, y = blobs(classes=3, per_class=20)
    node_file = write_npz(tmp_path / "node.npz", x=x, y=y)
    run_config = {"scenario": "dataset-permute", "dataset": f"npz:{tmp_path / 'elsewhere.npz'}",
                  "num-classes": 3, "partition": "dirichlet", "disjoint": True}
    context = Context(run_id=1, node_id=1, node_config={"client-id": 0, "data-dir": node_file},
                      state=RecordDict(), run_config=run_config)
    client = make_client(context)
    scenario = client.exp.scenario
    assert scenario.params["dataset"] == node_file and scenario.params["disjoint"] is False
    rows = rows_to_labels(load_user_data(node_file).x_train, load_user_data(node_file).y_train)
    assert all(r.tobytes() in rows for r in scenario.step_data(0, 1).x_train)
    context.run_config["scenario"] = "digits-swap"
    with pytest.raises(ValueError, match="only the dataset-\\* scenarios read"):
        make_client(context)


def test_run_config_checks_the_data_keys():
    for key, value, message in (("partition", "half", "partition must be"),
                                ("test-fraction", 1.5, r"test-fraction must be in \(0, 1\)"),
                                ("input-shape", "1,28", "input-shape must be"),
                                ("classes-per-client", 0,
                                 r"classes-per-client must be an integer in \[1, 10,000\]"),
                                ("dataset", "nonsense", "is not a dataset spec")):
        with pytest.raises(ConfigError, match=message):
            parse_run_config({key: value})
