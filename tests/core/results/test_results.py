"""Tests of fedcluster_app.core.results: the results contract (metrics.jsonl, summary.json, plot.png)."""

from __future__ import annotations

import io
import json
import math
import os
import re
import sys

import numpy as np
import pytest

from fedcluster_app.core import results
from fedcluster_app.core.results import (
    RunRecorder,
    compare_runs,
    format_round_line,
    load_run,
    plot_run,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CONFIG = {"strategy": "ifca", "rounds-per-step": 2, "lr": 0.01}


def rec(rnd, acc, *, step=None, k=2, ari=None, up=0, down=0, fail=0, drift=0, t=0.1, **extra):
    r = {
        "round": rnd,
        "time_step": step if step is not None else (rnd - 1) // 2,
        "accuracy": acc,
        "num_clusters": k,
        "bytes_up": up,
        "bytes_down": down,
        "failures": fail,
        "drifted_clients": drift,
        "round_time_s": t,
    }
    if ari is not None:
        r["ari"] = ari
    r.update(extra)
    return r


def strict_loads(line):
    """json.loads that rejects NaN/Infinity tokens."""

    def bad(name):
        raise AssertionError(f"non-standard JSON constant {name} written")

    return json.loads(line, parse_constant=bad)


def read_lines(path):
    return [strict_loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def assert_png(path):
    assert path.is_file()
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 1000
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def make_run(out_dir, strategy, scenario, seed, accs, *, drift_at=None, ari=None):
    r = RunRecorder(out_dir, strategy=strategy, scenario=scenario, seed=seed, config=CONFIG)
    for i, a in enumerate(accs, start=1):
        r.log_round(rec(i, a, up=1_000_000, down=2_000_000, drift=3 if i == drift_at else 0,
                        ari=ari))
    return r.finish(plot=False)


# --------------------------------------------------------------------------------------------
# summary computation
# --------------------------------------------------------------------------------------------


def test_summary_fields_computed_from_rounds(tmp_path):
    r = RunRecorder(tmp_path / "run", strategy="ifca", scenario="circle2", seed=3, config=CONFIG)
    r.log_round(rec(1, 0.5, k=1, ari=0.0, up=100, down=200, fail=1))
    r.log_round(rec(2, None, k=2, up=100, down=200))  # not evaluated
    r.log_round(rec(3, 0.7, k=2, ari=0.5, up=100, down=200, drift=4, step=1))
    r.log_round(rec(4, None, k=2, up=100, down=200, fail=2, step=1))
    r.log_round(rec(5, 0.9, k=3, ari=1.0, up=100, down=250, step=2, drift=1))
    r.log_round(rec(6, None, k=3, up=50, down=50, step=2))
    summary = r.finish(plot=False, extra={"note": "x", "similarity": np.eye(2)})

    assert summary["strategy"] == "ifca"
    assert summary["scenario"] == "circle2"
    assert summary["seed"] == 3
    assert summary["rounds"] == 6
    assert summary["mean_accuracy"] == pytest.approx((0.5 + 0.7 + 0.9) / 3)
    assert summary["final_accuracy"] == pytest.approx(0.9)  # last evaluated round
    # from round 3 (first round with drifted_clients > 0) on, evaluated rounds only
    assert summary["mean_accuracy_after_drift"] == pytest.approx((0.7 + 0.9) / 2)
    assert summary["ari_final"] == pytest.approx(1.0)
    assert summary["bytes_up"] == 550 and isinstance(summary["bytes_up"], int)
    assert summary["bytes_down"] == 1100
    assert summary["failures"] == 3
    assert summary["num_clusters_final"] == 3
    assert summary["status"] == "completed"
    assert summary["error"] is None
    assert summary["config"] == CONFIG
    assert summary["wall_time_s"] >= 0
    assert summary["note"] == "x"
    assert summary["similarity"] == [[1.0, 0.0], [0.0, 1.0]]

    on_disk = strict_loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk == summary
    for key in results.REQUIRED_SUMMARY_KEYS:
        assert key in on_disk


def test_summary_without_drift_ground_truth_or_evaluation(tmp_path):
    r = RunRecorder(tmp_path, strategy="fedavg", scenario="s", seed=0, config={})
    r.log_round({"round": 1, "time_step": 0, "accuracy": None, "num_clusters": 1})
    r.log_round({"round": 2, "time_step": 0, "accuracy": None, "num_clusters": 1})
    s = r.finish(status="failed", error="boom", plot=False)
    assert s["mean_accuracy"] is None
    assert s["final_accuracy"] is None
    assert s["mean_accuracy_after_drift"] is None
    assert s["ari_final"] is None
    assert s["bytes_up"] == 0 and s["bytes_down"] == 0 and s["failures"] == 0
    assert s["num_clusters_final"] == 1
    assert s["status"] == "failed" and s["error"] == "boom"


def test_summary_of_run_without_rounds(tmp_path):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    s = r.finish(status="failed", error="crashed before round 1")
    assert s["rounds"] == 0
    assert s["mean_accuracy"] is None and s["num_clusters_final"] is None
    assert_png(tmp_path / "plot.png")
    summary, records = load_run(tmp_path)
    assert records == [] and summary["status"] == "failed"


def test_drift_without_later_evaluation_gives_null(tmp_path):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    r.log_round(rec(1, 0.8))
    r.log_round(rec(2, None, drift=2))
    s = r.finish(plot=False)
    assert s["mean_accuracy"] == pytest.approx(0.8)
    assert s["mean_accuracy_after_drift"] is None


def test_finish_rejects_bad_status(tmp_path):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    with pytest.raises(ValueError, match="status"):
        r.finish(status="done")


# --------------------------------------------------------------------------------------------
# log_round: validation, conversion, flushing
# --------------------------------------------------------------------------------------------


def test_log_round_flushes_each_line(tmp_path):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    r.log_round(rec(1, 0.5))
    assert read_lines(tmp_path / "metrics.jsonl")[0]["round"] == 1
    r.log_round(rec(2, 0.6))
    assert [x["round"] for x in read_lines(tmp_path / "metrics.jsonl")] == [1, 2]
    assert [x["round"] for x in r.rounds] == [1, 2]


def test_log_round_converts_numpy_and_nan(tmp_path):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={"p": tmp_path})
    r.log_round({
        "round": np.int64(1),
        "time_step": np.int32(0),
        "accuracy": np.float32(0.75),
        "num_clusters": np.int64(2),
        "ari": float("nan"),
        "bytes_up": np.int64(1234),
        "bytes_down": 5.0e3,
        "round_time_s": np.float64(0.5),
        "assignments": np.array([0, 1, 1]),
        "sims": np.array([[1.0, np.nan], [np.inf, 0.5]]),
        "sizes": {np.int64(0): np.int64(1), 1: 2},
        "flags": (np.bool_(True), False),
        "loss": float("inf"),
    })
    (line,) = read_lines(tmp_path / "metrics.jsonl")
    assert line["round"] == 1 and isinstance(line["round"], int)
    assert line["accuracy"] == pytest.approx(0.75)
    assert line["ari"] is None
    assert line["bytes_up"] == 1234
    assert line["bytes_down"] == 5000 and isinstance(line["bytes_down"], int)
    assert line["assignments"] == [0, 1, 1]
    assert line["sims"] == [[1.0, None], [None, 0.5]]
    assert line["sizes"] == {"0": 1, "1": 2}
    assert line["flags"] == [True, False]
    assert line["loss"] is None
    assert r.rounds == [line]
    s = r.finish(plot=False)
    assert s["config"] == {"p": str(tmp_path)}
    assert s["ari_final"] is None


def test_nan_accuracy_is_written_as_null(tmp_path):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    r.log_round(rec(1, float("nan")))
    assert read_lines(tmp_path / "metrics.jsonl")[0]["accuracy"] is None


@pytest.mark.parametrize(
    "change, match",
    [
        ({"round": None}, "round"),
        ({"accuracy": 1.5}, "accuracy"),
        ({"accuracy": -0.1}, "accuracy"),
        ({"num_clusters": -1}, "num_clusters"),
        ({"time_step": 1.5}, "time_step"),
        ({"bytes_up": -3}, "bytes_up"),
        ({"ari": 2.0}, "ari"),
        ({"accuracy": "0.9"}, "accuracy"),
        ({"train_loss": "0.3"}, "train_loss"),
    ],
)
def test_log_round_rejects_bad_values(tmp_path, change, match):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    bad = rec(1, 0.5)
    bad.update(change)
    with pytest.raises(ValueError, match=match):
        r.log_round(bad)
    assert (tmp_path / "metrics.jsonl").read_text() == ""  # nothing written
    assert r.rounds == []


@pytest.mark.parametrize("key", results.REQUIRED_ROUND_KEYS)
def test_log_round_requires_keys(tmp_path, key):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    bad = rec(1, 0.5)
    del bad[key]
    with pytest.raises(ValueError, match=key):
        r.log_round(bad)


def test_log_round_rejects_non_increasing_round_and_unserialisable(tmp_path):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    r.log_round(rec(2, 0.5))
    with pytest.raises(ValueError, match="does not follow"):
        r.log_round(rec(2, 0.6))
    with pytest.raises(ValueError, match="does not follow"):
        r.log_round(rec(1, 0.6))
    with pytest.raises(TypeError, match="record.model"):
        r.log_round(rec(3, 0.6, model=object()))
    assert [x["round"] for x in read_lines(tmp_path / "metrics.jsonl")] == [2]


# --------------------------------------------------------------------------------------------
# atomic writes
# --------------------------------------------------------------------------------------------


def test_finish_leaves_no_temp_files(tmp_path):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    r.log_round(rec(1, 0.5, drift=2))
    r.finish()
    r.finish()  # a second call (e.g. from a finally block) just rewrites
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "plot.png", "summary.json"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_result_files_get_the_users_usual_permissions(fast_config, umask):
    """Every result file is created as open() creates files: 0o666 less the umask (the temp
    file of an atomic write was 0600 before, and the rename kept it)."""
    from fedcluster_app.engine import run_inprocess

    old = os.umask(umask)
    try:
        summary = run_inprocess(fast_config(strategy="fedavg", plot=True, **{
            "num-steps": 2, "checkpoint-every": 1}))
    finally:
        os.umask(old)
    out = summary["out_dir"]
    modes = {name: os.stat(os.path.join(out, name)).st_mode & 0o777 for name in os.listdir(out)}
    assert modes == {name: 0o666 & ~umask for name in
                     ("checkpoint.npz", "metrics.jsonl", "plot.png", "summary.json",
                      ".fedcluster.lock")}


def test_failed_replace_keeps_old_summary_and_no_temp(tmp_path, monkeypatch):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    r.log_round(rec(1, 0.5))
    first = r.finish(plot=False)
    r.log_round(rec(2, 0.9))

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        r.finish(plot=False)
    monkeypatch.undo()
    assert strict_loads((tmp_path / "summary.json").read_text()) == first
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "summary.json"]


def test_plot_failure_does_not_lose_summary(tmp_path, monkeypatch):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    r.log_round(rec(1, 0.5))

    def broken_plot(*args, **kwargs):
        raise RuntimeError("no fonts")

    from fedcluster_app.core.results import recorder

    monkeypatch.setattr(recorder, "plot_history", broken_plot)
    s = r.finish()
    assert "no fonts" in s["plot_error"]
    assert load_run(tmp_path)[0]["plot_error"] == s["plot_error"]


# --------------------------------------------------------------------------------------------
# load_run
# --------------------------------------------------------------------------------------------


def test_load_run_round_trip(tmp_path):
    r = RunRecorder(tmp_path / "r", strategy="fedavg", scenario="sea", seed=7, config=CONFIG)
    for i in range(1, 6):
        r.log_round(rec(i, 0.1 * i if i % 2 else None, ari=0.2, up=10, down=20,
                        extra_key={"cluster_sizes": [3, 2]}))
    s = r.finish(plot=False, extra={"checkpoint": "ckpt.pt"})
    summary, records = load_run(tmp_path / "r")
    assert summary == s
    assert records == r.rounds
    assert records[0]["extra_key"] == {"cluster_sizes": [3, 2]}
    assert records[1]["accuracy"] is None


def test_load_run_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_run(tmp_path / "nope")
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(FileNotFoundError, match="summary.json"):
        load_run(run)
    r = RunRecorder(run, strategy="a", scenario="b", seed=1, config={})
    r.finish(plot=False)
    (run / "metrics.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        load_run(run)


def test_load_run_malformed_metrics_names_file_and_line(tmp_path):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    r.log_round(rec(1, 0.5))
    r.log_round(rec(2, 0.6))
    r.finish(plot=False)
    path = tmp_path / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + lines[1][:-5] + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 2: malformed JSON"):
        load_run(tmp_path)

    path.write_text(lines[0] + "\n" + json.dumps({"round": 2, "time_step": 0}) + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 2: missing .*accuracy"):
        load_run(tmp_path)

    path.write_text(lines[0] + "\n\n" + lines[0].replace("0.5", "NaN") + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 3"):
        load_run(tmp_path)

    path.write_text(lines[1] + "\n" + lines[0] + "\n")
    with pytest.raises(ValueError, match=r"line 2: round 1 does not follow round 2"):
        load_run(tmp_path)


def test_load_run_malformed_summary_names_file(tmp_path):
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    r.finish(plot=False)
    (tmp_path / "summary.json").write_text("{not json")
    with pytest.raises(ValueError, match="summary.json"):
        load_run(tmp_path)
    (tmp_path / "summary.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="summary.json"):
        load_run(tmp_path)
    (tmp_path / "summary.json").write_text('{"strategy": "a"}')
    with pytest.raises(ValueError, match="summary.json: missing required key"):
        load_run(tmp_path)


# --------------------------------------------------------------------------------------------
# resume
# --------------------------------------------------------------------------------------------


def _five_rounds(path):
    r = RunRecorder(path, strategy="a", scenario="b", seed=1, config={})
    for i in range(1, 6):
        r.log_round(rec(i, 0.1 * i, up=10))
    return r


def test_resume_truncates_rounds_from_resumed_round(tmp_path):
    _five_rounds(tmp_path)  # crashed after round 5, no summary
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={}, resume=True)
    assert [x["round"] for x in r.rounds] == [1, 2, 3, 4, 5]  # nothing dropped yet
    assert len(read_lines(tmp_path / "metrics.jsonl")) == 5
    r.log_round(rec(4, 0.99, up=10))  # resumed from the checkpoint after round 3
    assert [x["round"] for x in read_lines(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    assert r.rounds[-1]["accuracy"] == pytest.approx(0.99)
    r.log_round(rec(5, 0.98, up=10))
    s = r.finish(plot=False)
    assert s["rounds"] == 5
    assert s["bytes_up"] == 50
    assert s["mean_accuracy"] == pytest.approx((0.1 + 0.2 + 0.3 + 0.99 + 0.98) / 5)
    assert [x["round"] for x in load_run(tmp_path)[1]] == [1, 2, 3, 4, 5]
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "summary.json"]


def test_resume_after_last_round_keeps_everything(tmp_path):
    _five_rounds(tmp_path)
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={}, resume=True)
    r.log_round(rec(6, 0.6))
    assert [x["round"] for x in read_lines(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]


def test_resume_drops_partial_last_line(tmp_path):
    _five_rounds(tmp_path)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"round": 6, "time_st')  # crash mid-write
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={}, resume=True)
    assert len(r.rounds) == 5
    r.log_round(rec(6, 0.6))
    assert [x["round"] for x in read_lines(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]


def test_resume_then_finish_without_new_rounds_cleans_partial_line(tmp_path):
    _five_rounds(tmp_path)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"round": 6, "ti')
    r = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={}, resume=True)
    s = r.finish(plot=False)
    assert s["rounds"] == 5
    assert len(load_run(tmp_path)[1]) == 5


def test_resume_rejects_malformed_middle_line(tmp_path):
    _five_rounds(tmp_path)
    path = tmp_path / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = "garbage"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 2"):
        RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={}, resume=True)


def test_resume_without_existing_metrics_starts_empty(tmp_path):
    r = RunRecorder(tmp_path / "new", strategy="a", scenario="b", seed=1, config={}, resume=True)
    assert r.rounds == []
    r.log_round(rec(1, 0.5))
    assert len(read_lines(tmp_path / "new" / "metrics.jsonl")) == 1


def test_fresh_start_discards_previous_run(tmp_path):
    r = _five_rounds(tmp_path)
    r.finish()
    r2 = RunRecorder(tmp_path, strategy="a", scenario="b", seed=1, config={})
    assert r2.rounds == []
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert not (tmp_path / "summary.json").exists()
    assert not (tmp_path / "plot.png").exists()


# --------------------------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------------------------


def test_finish_writes_png_and_plot_run(tmp_path):
    r = RunRecorder(tmp_path / "run", strategy="ifca", scenario="circle2", seed=0, config={})
    for i in range(1, 9):
        r.log_round(rec(i, None if i % 3 == 0 else 0.5 + 0.05 * i, k=1 + (i > 4), ari=0.5,
                        drift=2 if i == 5 else 0))
    r.finish()
    assert_png(tmp_path / "run" / "plot.png")
    (tmp_path / "run" / "plot.png").unlink()
    assert plot_run(tmp_path / "run") == tmp_path / "run" / "plot.png"
    assert_png(tmp_path / "run" / "plot.png")
    out = plot_run(tmp_path / "run", tmp_path / "elsewhere" / "p.png")
    assert out == tmp_path / "elsewhere" / "p.png"
    assert_png(out)
    assert not [n for n in os.listdir(tmp_path / "run") if n.endswith(".tmp")]


def test_plot_title_and_drift_lines(tmp_path, monkeypatch):
    captured = {}
    from fedcluster_app.core.results import plots

    real_save = plots.save_png

    def spy(fig, out_path):
        captured["fig"] = fig
        return real_save(fig, out_path)

    monkeypatch.setattr(plots, "save_png", spy)
    r = RunRecorder(tmp_path, strategy="fedavg", scenario="sea", seed=4, config={})
    for i in range(1, 7):
        r.log_round(rec(i, 0.7, drift=1 if i in (3, 5) else 0, models_allocated=2))
    r.finish()
    ax = captured["fig"].axes[0]
    assert ax.get_title() == "fedavg on sea (seed 4)"
    assert ax.get_ylim() == (0.0, 1.0)
    dashed_x = sorted(
        line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"
    )
    assert dashed_x == [3, 5]
    ax2 = captured["fig"].axes[1]
    assert [line.get_label() for line in ax2.get_lines()] == ["clusters in use"]
    # models allocated beyond the clusters in use get a line of their own
    r = RunRecorder(tmp_path / "more", strategy="ifca", scenario="sea", seed=4, config={})
    for i in range(1, 4):
        r.log_round(rec(i, 0.7, k=1, models_allocated=4))
    r.finish()
    ax2 = captured["fig"].axes[1]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax2.get_lines()}
    assert lines == {"clusters in use": [1, 1, 1], "models allocated": [4, 4, 4]}


def test_module_import_is_light():
    # matplotlib is only imported by the plotting functions
    code = (
        "import sys, fedcluster_app.core.results; "
        "sys.exit(1 if any(m.startswith('matplotlib') for m in sys.modules) else 0)"
    )
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


# --------------------------------------------------------------------------------------------
# compare_runs
# --------------------------------------------------------------------------------------------


def _table_rows(text, title):
    after = text.split(title, 1)[1].splitlines()
    start = next(i for i, ln in enumerate(after) if ln.startswith("|"))
    lines = []
    for ln in after[start:]:
        if not ln.startswith("|"):
            break
        lines.append(ln)
    split = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    header, rows = split[0], split[2:]
    return [dict(zip(header, row)) for row in rows]


def test_compare_runs_two_strategies_two_seeds(tmp_path):
    dirs = []
    data = {
        ("ifca", 0): [0.6, 0.8, None, 0.8],  # mean 0.7333, after drift(3) 0.8, final 0.8
        ("ifca", 1): [0.7, 0.9, None, 1.0],  # mean 0.8667, after 1.0, final 1.0
        ("fedavg", 0): [0.5, 0.5, 0.5, 0.5],  # after 0.5
        ("fedavg", 1): [0.6, 0.6, 0.4, 0.4],  # after 0.4
    }
    for (strategy, seed), accs in data.items():
        d = tmp_path / f"{strategy}-circle2-s{seed}"
        make_run(d, strategy, "circle2", seed, accs, drift_at=3,
                 ari=0.5 + 0.5 * seed if strategy == "ifca" else None)
        dirs.append(d)
    out_png = tmp_path / "cmp" / "compare.png"
    text = compare_runs(dirs, out_path=out_png)

    runs = _table_rows(text, "## Runs")
    assert [r["run"] for r in runs] == [d.name for d in dirs]
    first = runs[0]
    assert first["strategy"] == "ifca" and first["scenario"] == "circle2"
    assert first["seed"] == "0" and first["rounds"] == "4"
    assert first["mean_accuracy [current step]"] == f"{(0.6 + 0.8 + 0.8) / 3:.4f}"
    assert first["mean_accuracy_after_drift [current step]"] == "0.8000"
    assert first["final_accuracy [current step]"] == "0.8000"
    assert first["ari_final"] == "0.5000"
    assert first["MB (up+down)"] == "12.00"  # 4 rounds x 3 MB
    assert first["status"] == "completed"
    assert float(first["wall_time_s"]) >= 0
    assert runs[2]["ari_final"] == "n/a"

    groups = _table_rows(text, "## By strategy and scenario")
    assert [(g["strategy"], g["scenario"], g["n seeds"]) for g in groups] == [
        ("ifca", "circle2", "2"),
        ("fedavg", "circle2", "2"),
    ]

    def ms(a, b):
        return f"{(a + b) / 2:.4f} ± {abs(a - b) / math.sqrt(2):.4f}"  # sample std, n=2

    ifca, fedavg = groups
    assert ifca["mean_accuracy [current step]"] == ms(2.2 / 3, 2.6 / 3)
    assert ifca["mean_accuracy_after_drift [current step]"] == ms(0.8, 1.0) == "0.9000 ± 0.1414"
    assert ifca["final_accuracy [current step]"] == ms(0.8, 1.0)
    assert ifca["ari_final"] == ms(0.5, 1.0) == "0.7500 ± 0.3536"
    assert fedavg["mean_accuracy [current step]"] == ms(0.5, 0.5) == "0.5000 ± 0.0000"
    assert fedavg["mean_accuracy_after_drift [current step]"] == ms(0.5, 0.4) == "0.4500 ± 0.0707"
    assert fedavg["final_accuracy [current step]"] == ms(0.5, 0.4)
    assert fedavg["ari_final"] == "n/a"

    # numbers agree with numpy's sample std
    assert ifca["final_accuracy [current step]"] == (
        f"{np.mean([0.8, 1.0]):.4f} ± {np.std([0.8, 1.0], ddof=1):.4f}"
    )
    assert_png(out_png)


def test_compare_runs_partial_nulls_single_runs_and_plot(tmp_path):
    a = tmp_path / "x" / "run"
    b = tmp_path / "y" / "run"  # same directory name: parent is added
    make_run(a, "ifca", "sea", 0, [0.5, 0.7], ari=1.0)
    make_run(b, "ifca", "sea", 1, [0.6, 0.8])  # no ari
    c = tmp_path / "single"
    make_run(c, "fedavg", "sea", 0, [0.4, 0.4])
    text = compare_runs([a, b, c], out_path=tmp_path / "c.png")
    runs = _table_rows(text, "## Runs")
    assert [r["run"] for r in runs] == ["x/run", "y/run", "single"]
    groups = _table_rows(text, "## By strategy and scenario")
    assert groups[0]["ari_final"] == "1.0000 (n=1)"
    assert groups[0]["mean_accuracy_after_drift [current step]"] == "n/a"
    assert groups[1]["n seeds"] == "1" and groups[1]["final_accuracy [current step]"] == "0.4000"
    assert_png(tmp_path / "c.png")

    # every group a single run: one line per run
    compare_runs([a, c], out_path=tmp_path / "d.png")
    assert_png(tmp_path / "d.png")


def test_compare_runs_errors(tmp_path):
    with pytest.raises(ValueError):
        compare_runs([])
    with pytest.raises(FileNotFoundError):
        compare_runs([tmp_path / "missing"])


# --------------------------------------------------------------------------------------------
# format_round_line
# --------------------------------------------------------------------------------------------


def test_format_round_line_full():
    record = {
        "round": 12, "time_step": 3, "accuracy": 0.91234, "num_clusters": 2, "ari": 1.0,
        "bytes_up": 12_300, "bytes_down": 24_600, "round_time_s": 0.2149,
    }
    assert format_round_line(record, 55) == (
        "[round  12/55 | step  3] acc 0.912 | clusters 2 | ari 1.000 | "
        "up 12.3 kB down 24.6 kB | 0.21 s |####----------------|  22%"
    )


def test_format_round_line_missing_parts_and_extras():
    line = format_round_line(
        {"round": 1, "time_step": 0, "accuracy": None, "num_clusters": 3}, 5
    )
    assert line == "[round   1/5 | step  0] clusters 3"
    line = format_round_line(
        {"round": np.int64(7), "time_step": 1, "accuracy": np.float32(0.5), "num_clusters": 1,
         "drifted_clients": np.int64(4), "failures": 1, "bytes_up": 999,
         "bytes_down": 3_500_000, "ari": float("nan"), "extra": [1, 2]},
        1000,
    )
    assert line == (
        "[round    7/1000 | step  1] acc 0.500 | clusters 1 | drift 4 | fail 1 | "
        "up 999 B down 3.5 MB |--------------------|   1%"
    )
    assert "ari" not in line
    assert format_round_line({"round": 3}, 0) == "[round 3]"
    # the models the server holds, when they are not the clusters in use
    assert "] clusters 1 (4 models) | ari" in format_round_line(
        {"round": 1, "num_clusters": 1, "models_allocated": 4, "ari": 0.5}, 5)
    assert "] clusters 2 | ari" in format_round_line(
        {"round": 1, "num_clusters": 2, "models_allocated": 2, "ari": 0.5}, 5)
    assert re.fullmatch(r"\[round\s+2/9\] acc 0\.250", format_round_line(
        {"round": 2, "accuracy": 0.25}, 9))
    assert "acc 0.250 | train loss 0.123 | clusters 2" in format_round_line(
        {"round": 2, "accuracy": 0.25, "train_loss": 0.1234, "num_clusters": 2}, 9)
    assert "loss" not in format_round_line({"round": 2, "train_loss": None}, 9)


def test_long_runs_get_a_progress_bar_on_their_round_lines():
    from fedcluster_app.core.results import format_round_line

    line = format_round_line({"round": 25, "time_step": 3, "accuracy": 0.5, "num_clusters": 2}, 100)
    assert line.endswith("|#####---------------|  25%")
    short = format_round_line({"round": 5, "time_step": 1, "accuracy": 0.5, "num_clusters": 2}, 12)
    assert "%" not in short


def _ttt_rows(text):
    section = text.split("## Time to target accuracy")[1]
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in section.splitlines()[4:] if line.startswith("| ")}   # after the header


def test_report_shows_the_time_to_target_speed_up_over_the_global_model(tmp_path):
    make_run(tmp_path / "avg", "fedavg", "s", 0, [0.5, 0.6, 0.7, 0.8])
    make_run(tmp_path / "fld", "fielding", "s", 0, [0.6, 0.8, 0.85, 0.9])
    make_run(tmp_path / "slow", "auxo", "s", 0, [0.1, 0.2, 0.3, 0.79])
    make_run(tmp_path / "other", "fielding", "t", 0, [0.9, 0.9, 0.9, 0.9])   # no baseline
    dirs = [tmp_path / d for d in ("avg", "fld", "slow", "other")]
    rows = _ttt_rows(results.compare_runs(dirs, target=0.75))
    # FedAvg holds 0.75 from round 4, Fielding from round 2 (speed-up 2.00), auxo from round 4
    assert rows["fld"] == ["fielding", "current step", "0.7500", "2", "4.0", "2.00", "2.00"]
    assert rows["avg"] == ["fedavg", "current step", "0.7500", "4", "8.0", "1.00", "1.00"]
    assert rows["slow"][2:4] == ["0.7500", "4"]
    assert "other" not in rows
    # an explicit target that a run does not reach says so; another baseline
    rows = _ttt_rows(results.compare_runs(dirs[:3], target=0.8))
    assert rows["slow"][3:] == ["not reached", "n/a", "not reached", "not reached"]
    text = results.compare_runs([tmp_path / "avg", tmp_path / "fld"], baseline="fedavg", target=0.6)
    assert "| fld " in text.split("## Time to target accuracy")[1]


def test_time_to_target_defaults_to_a_share_of_the_best_run_and_never_beats_a_collapsed_baseline(
        tmp_path):
    """The default target is 0.9 x the highest accuracy a run holds to its end (Fielding's
    0.9: 0.81), not the lowest (a collapsed FedAvg's 0.474 made every run 'reach' it and gave
    Fielding a speed-up against it); a baseline that never holds the target gives no speed-up."""
    make_run(tmp_path / "avg", "fedavg", "s", 0, [0.5, 0.8, 0.85, 0.474])
    make_run(tmp_path / "fld", "fielding", "s", 0, [0.6, 0.85, 0.88, 0.9])
    make_run(tmp_path / "weak", "local", "s", 0, [0.6, 0.7, 0.7, 0.7])
    rows = _ttt_rows(results.compare_runs([tmp_path / d for d in ("avg", "fld", "weak")]))
    assert rows["fld"] == ["fielding", "current step", "0.8100", "2", "4.0",
                           "fedavg not reached", "fedavg not reached"]
    assert rows["avg"][3:] == ["not reached", "n/a", "not reached", "not reached"]
    assert rows["weak"][3] == "not reached"
    data = json.loads(results.compare_runs([tmp_path / d for d in ("avg", "fld")], fmt="json"))
    fld = next(r for r in data["time_to_target"] if r["run"] == "fld")
    assert fld["target"] == pytest.approx(0.81) and fld["speedup_rounds"] is None
    assert fld["baseline_reached"] is False and fld["rounds_to_target"] == 2


    assert results.held_accuracy([{"round": 1, "accuracy": 0.9}, {"round": 2, "accuracy": 0.5},
                                  {"round": 3, "accuracy": 0.7}]) == 0.7
    assert results.rounds_to_target([{"round": 1, "accuracy": 0.7}, {"round": 2, "accuracy": 0.5},
                                     {"round": 3, "accuracy": 0.9}], 0.6) == 3


# --------------------------------------------------------------------------------------------
# fedcluster report: scoring rules, formats, line styles
# --------------------------------------------------------------------------------------------


def make_rule_run(out_dir, strategy, accs, rule=None, seed=0, **extra):
    r = RunRecorder(out_dir, strategy=strategy, scenario="circle2", seed=seed, config=CONFIG)
    for i, a in enumerate(accs, start=1):
        r.log_round(rec(i, a, up=1_000_000, down=2_000_000))
    return r.finish(plot=False, extra={**({"accuracy_rule": rule} if rule else {}), **extra})


def test_runs_of_different_scoring_rules_never_share_an_accuracy_column(tmp_path):
    """FedDrift's time-step protocol scores the next step: its runs get their own accuracy
    columns (an older summary without accuracy_rule is known by acc_include); the time to
    target compares runs of one rule only."""
    make_rule_run(tmp_path / "avg", "fedavg", [0.5, 0.7, 0.8, 0.8], "current step")
    make_rule_run(tmp_path / "ifca", "ifca", [0.6, 0.8, 0.9, 0.9], "current step")
    make_rule_run(tmp_path / "fd", "feddrift", [0.4, 0.5, 0.6, 0.6], "next step")
    make_rule_run(tmp_path / "old-fd", "oblivious", [0.3, 0.4, 0.5, 0.5], acc_include=0.425)
    text = compare_runs([tmp_path / d for d in ("avg", "ifca", "fd", "old-fd")])
    runs = {r["run"]: r for r in _table_rows(text, "## Runs")}
    assert runs["avg"]["mean_accuracy [current step]"] == "0.7000"
    assert runs["avg"]["mean_accuracy [next step]"] == "—"
    assert runs["fd"]["mean_accuracy [current step]"] == "—"
    assert runs["fd"]["final_accuracy [next step]"] == "0.6000"
    assert runs["old-fd"]["final_accuracy [next step]"] == "0.5000"
    assert not any(k.startswith("mean_accuracy") and "[" not in k for k in runs["avg"])
    groups = {g["strategy"]: g for g in _table_rows(text, "## By strategy and scenario")}
    assert groups["feddrift"]["mean_accuracy [current step]"] == "—"
    assert groups["feddrift"]["mean_accuracy [next step]"] == "0.5250"
    ttt = _ttt_rows(compare_runs([tmp_path / d for d in ("avg", "ifca", "fd")], target=0.6))
    assert set(ttt) == {"avg", "ifca"}          # no fedavg run of the next-step rule
    data = json.loads(compare_runs([tmp_path / d for d in ("avg", "fd", "old-fd")], fmt="json"))
    assert [r["accuracy_rule"] for r in data["runs"]] == ["current step", "next step",
                                                          "next step"]
    import pandas as pd

    table = pd.read_csv(io.StringIO(compare_runs([tmp_path / "avg", tmp_path / "fd"],
                                                 fmt="csv")))
    assert table["final_accuracy [current step]"].tolist()[0] == 0.8
    assert math.isnan(table["final_accuracy [current step]"].tolist()[1])
    assert table["final_accuracy [next step]"].tolist()[1] == 0.6


def test_the_common_rule_gets_its_own_columns(tmp_path):
    r = RunRecorder(tmp_path / "a", strategy="ifca", scenario="s", seed=0, config=CONFIG)
    r.log_round(rec(1, 0.5, accuracy_current=0.5))
    r.log_round(rec(2, 0.7, accuracy_current=0.7, accuracy_next=0.4, next_step=2))
    r.finish(plot=False)
    make_rule_run(tmp_path / "b", "fedavg", [0.5, 0.6])
    runs = {x["run"]: x for x in _table_rows(compare_runs([tmp_path / "a", tmp_path / "b"]),
                                             "## Runs")}
    assert runs["a"]["accuracy_current [common rule]"] == "0.6000"
    assert runs["a"]["accuracy_next [common rule]"] == "0.4000"
    assert runs["b"]["accuracy_next [common rule]"] == "n/a"


def test_report_formats_csv_and_json_carry_the_same_numbers(tmp_path):
    import pandas as pd

    make_rule_run(tmp_path / "avg", "fedavg", [0.5, 0.6, 0.7, 0.8])
    make_rule_run(tmp_path / "fld", "fielding", [0.6, 0.8, 0.85, 0.9])
    dirs = [tmp_path / "avg", tmp_path / "fld"]
    table = pd.read_csv(io.StringIO(compare_runs(dirs, fmt="csv")))
    data = json.loads(compare_runs(dirs, fmt="json"))
    assert table["run"].tolist() == [r["run"] for r in data["runs"]] == ["avg", "fld"]
    assert table["mean_accuracy [current step]"].tolist() == pytest.approx([0.65, 0.7875])
    assert "mean_accuracy" not in table
    assert table["accuracy_rule"].tolist() == ["current step"] * 2
    assert data["runs"][1]["final_accuracy"] == pytest.approx(0.9)
    # target 0.81: FedAvg never holds it (an empty cell, null in JSON), Fielding from round 3
    assert [None if math.isnan(x) else x for x in table["rounds_to_target"]] == [
        r["rounds_to_target"] for r in data["time_to_target"]] == [None, 3]
    assert table["mb"].tolist() == [12.0, 12.0]
    with pytest.raises(ValueError, match="unknown format 'xml'; valid: md, csv, json"):
        compare_runs(dirs, fmt="xml")


def test_the_cli_report_prints_csv(tmp_path, capsys):
    from fedcluster_app.cli import main

    make_rule_run(tmp_path / "avg", "fedavg", [0.5, 0.6])
    assert main(["report", str(tmp_path / "avg"), "--format", "csv", "--plot",
                 str(tmp_path / "p.png")]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith("run,strategy,scenario,seed,rounds,accuracy_rule")
    assert len(out.splitlines()) == 2 and "plot:" in err
    assert_png(tmp_path / "p.png")


@pytest.mark.parametrize("n", [1, 10, 11, 40, 41, 300, 1000])
def test_line_styles_are_distinct_for_any_number_of_runs(n):
    from fedcluster_app.core.results.plots import line_styles

    styles = line_styles(n)
    assert len(styles) == n == len(set(styles))
    if n <= 10:
        assert len({s for _, s in styles}) == 1        # few runs: solid lines, ten colours


def test_the_comparison_plot_gives_each_of_many_runs_its_own_line_and_keeps_the_legend_outside(
        tmp_path, monkeypatch):
    from fedcluster_app.core.results import plots

    dirs = []
    for i in range(12):
        dirs.append(tmp_path / f"r{i}")
        make_rule_run(dirs[-1], f"s{i}", [0.1 * (i % 9), 0.5, 0.6])
    figures = []
    real = plots.save_png
    monkeypatch.setattr(plots, "save_png", lambda fig, out: figures.append(fig) or real(fig, out))
    compare_runs(dirs, out_path=tmp_path / "many.png")
    (fig,) = figures
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert len(lines) == 12
    assert len({(tuple(ln.get_color()), ln.get_linestyle()) for ln in lines}) == 12
    fig.canvas.draw()
    legend, frame = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= frame.x1                   # beside the axes, over no curve
    assert_png(tmp_path / "many.png")
