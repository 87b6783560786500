"""Plots of runs: accuracy, ARI and clusters in use (and models allocated where they differ)
over rounds with drift events marked, and the comparison of several runs. matplotlib is
imported lazily (Agg canvas only: pyplot and the global backend are never touched)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from fedcluster_app.core.atomic import atomic_open
from fedcluster_app.core.results.files import PLOT_FILE, load_run

def title_of(summary: Mapping) -> str:
    return f"{summary.get('strategy')} on {summary.get('scenario')} (seed {summary.get('seed')})"


def new_figure(figsize: tuple[float, float]):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=100)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig, out_path: Path) -> Path:
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(out_path) as f:
        fig.savefig(f, format="png", bbox_inches="tight")
    return out_path


def plot_history(records: list[dict], title: str, out_path: Path) -> Path:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    fig = new_figure((8.0, 4.5))
    ax = fig.add_subplot(1, 1, 1)
    ax.set_title(title)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0.0, 1.0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    handles = []

    if not records:
        ax.text(0.5, 0.5, "no rounds logged", ha="center", va="center", transform=ax.transAxes)
    else:
        evaluated = [(r["round"], r["accuracy"]) for r in records if r.get("accuracy") is not None]
        if evaluated:
            xs, ys = zip(*evaluated)
            (h,) = ax.plot(xs, ys, color="tab:blue", marker="." if len(xs) < 60 else None,
                           label="accuracy")
            handles.append(h)
        with_ari = [(r["round"], r["ari"]) for r in records if r.get("ari") is not None]
        if with_ari:
            xs, ys = zip(*with_ari)
            (h,) = ax.plot(xs, ys, color="tab:green", linestyle=":", linewidth=1.2, label="ARI")
            handles.append(h)

        ax2 = ax.twinx()
        xs = [r["round"] for r in records]
        ks = [r["num_clusters"] for r in records]
        (h,) = ax2.step(xs, ks, where="post", color="tab:orange", label="clusters in use")
        handles.append(h)
        # models held beyond the clusters in use (IFCA's unchosen ones, FedDrift's older ones)
        allocated = [r.get("models_allocated", k) for r, k in zip(records, ks)]
        if allocated != ks:
            (h,) = ax2.step(xs, allocated, where="post", color="tab:orange", linestyle="--",
                            linewidth=1.0, label="models allocated")
            handles.append(h)
        ax2.set_ylabel("number of clusters")
        ax2.set_ylim(0, max(ks + allocated) + 1)
        ax2.yaxis.set_major_locator(MaxNLocator(integer=True))

        drift_rounds = [r["round"] for r in records if (r.get("drifted_clients") or 0) > 0]
        for x in drift_rounds:
            ax.axvline(x, color="tab:red", linestyle="--", linewidth=1.0, alpha=0.7)
        if drift_rounds:
            handles.append(Line2D([], [], color="tab:red", linestyle="--", label="drift"))
        lo, hi = min(xs), max(xs)
        ax.set_xlim(lo - 0.5, hi + 0.5)

    if handles:   # under the axes: it hides no curve (a drift's dip fills the lower right)
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.14),
                  ncol=len(handles), fontsize="small", frameon=False)
    return save_png(fig, out_path)


def plot_run(run_dir: str | os.PathLike, out_path: str | os.PathLike | None = None) -> Path:
    """(Re)draw a run's plot from its files; default ``<run_dir>/plot.png``. Returns the path."""
    summary, records = load_run(run_dir)
    out = Path(out_path) if out_path is not None else Path(run_dir) / PLOT_FILE
    return plot_history(records, title_of(summary), out)


LINE_STYLES = ("-", "--", ":", "-.")


def line_styles(n: int) -> list[tuple[tuple[float, ...], str]]:
    """``n`` distinct (colour, line style) pairs, for any ``n``: tab10's ten colours drawn solid,
    then dashed, dotted and dash-dotted (40 pairs); past 40, ``n`` colours spread along a
    continuous colour map (each its own), the line styles cycling over them."""
    from matplotlib import colormaps
    from matplotlib.colors import LinearSegmentedColormap, to_rgba

    if n <= 10 * len(LINE_STYLES):
        tab = colormaps["tab10"].colors
        return [(to_rgba(tab[i % 10]), LINE_STYLES[i // 10]) for i in range(n)]
    # interpolated with n levels: a listed map of 256 colours would repeat them past 256
    spread = LinearSegmentedColormap.from_list("runs", colormaps["turbo"].colors, N=n)
    return [(tuple(float(c) for c in spread(i)), LINE_STYLES[i % len(LINE_STYLES)])
            for i in range(n)]


def plot_comparison(runs: list[tuple[Path, dict, list[dict]]], names: list[str],
                    out_path: Path, rules: list[str] | None = None) -> Path:
    """Accuracy over rounds of several runs (or of their groups: mean ± std over seeds), each
    line its own colour and style, the legend beside the axes where it hides no curve; with
    runs of several scoring rules (``rules``, per run) each label names its rule."""
    rules = rules or [""] * len(runs)
    several = len(set(rules)) > 1
    fig = new_figure((9.0, 5.0))
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0.0, 1.0)
    ax.grid(True, alpha=0.3)

    groups: dict[tuple[str, str, str], list[list[dict]]] = {}
    for (_, summary, records), rule in zip(runs, rules):
        key = (str(summary["strategy"]), str(summary["scenario"]), rule)
        groups.setdefault(key, []).append(records)

    if all(len(members) == 1 for members in groups.values()):
        ax.set_title("accuracy per run")
        for (name, (_, summary, records), rule), (colour, style) in zip(
                zip(names, runs, rules), line_styles(len(runs))):
            pts = [(r["round"], r["accuracy"]) for r in records if r.get("accuracy") is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, color=colour, linestyle=style,
                        label=f"{name} ({summary['strategy']}, seed {summary['seed']}"
                              f"{', ' + rule if several else ''})")
    else:
        ax.set_title("accuracy per strategy and scenario (mean ± std over seeds)")
        for ((strategy, scenario, rule), members), (colour, style) in zip(
                groups.items(), line_styles(len(groups))):
            by_round: dict[int, list[float]] = {}
            for records in members:
                for r in records:
                    if r.get("accuracy") is not None:
                        by_round.setdefault(r["round"], []).append(float(r["accuracy"]))
            if not by_round:
                continue
            xs = sorted(by_round)
            means, lo, hi = [], [], []
            for x in xs:
                v = by_round[x]
                m = sum(v) / len(v)
                sd = math.sqrt(sum((a - m) ** 2 for a in v) / (len(v) - 1)) if len(v) > 1 else 0.0
                means.append(m)
                lo.append(max(0.0, m - sd))
                hi.append(min(1.0, m + sd))
            ax.plot(xs, means, color=colour, linestyle=style,
                    label=f"{strategy} on {scenario} (n={len(members)}"
                          f"{', ' + rule if several else ''})")
            ax.fill_between(xs, lo, hi, color=colour, alpha=0.2, linewidth=0)
    if ax.get_legend_handles_labels()[0]:   # beside the axes: it hides no curve after a drift
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small",
                  borderaxespad=0.0)
    return save_png(fig, out_path)
