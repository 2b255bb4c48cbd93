"""Plot an inspect report: where each batch's samples came from, at a glance.

:func:`plot_report` draws a heat map of batches by shard (the baseline's beside it), the
histogram of distinct shards per batch, the share of the ideal per tenth with the advice, a
mixture's datasets per batch and each tenth's label (or shard) mix. matplotlib (the ``plot``
extra) is imported on first use with the Agg backend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardmix.errors import ConfigError

if TYPE_CHECKING:
    from shardmix.inspect.report import InspectReport

# Heat maps show at most this many batches (the first ones); more would be thinner than a pixel.
MAX_HEATMAP_BATCHES = 400
_FORMATS = (".png", ".svg")
_COLORS = {"MixingLoader": "tab:blue", "DataLoader": "tab:orange"}


def plot_report(report: InspectReport | Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``report``'s heat map(s) and histogram to ``path`` (``.png`` or ``.svg``)."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in _FORMATS:
        raise ConfigError(
            f"{os.fspath(path)}: cannot tell the plot format from the extension; "
            "name the file .png or .svg"
        )
    data = report if isinstance(report, Mapping) else report.to_dict()
    plt = _pyplot()
    runs = [data] + ([data["baseline"]] if data.get("baseline") else [])
    mixture = data.get("mixture")
    order = data.get("order") or {}
    drift = order.get("label") or order.get("sources")
    rows = 3 + bool(mixture) + bool(drift)
    figure = plt.figure(figsize=(7.5 * len(runs) + 3.5, 14 + 4 * (rows - 3)), layout="constrained")
    grid = figure.add_gridspec(rows, len(runs), height_ratios=[2.2, 1, 1, 1, 1][:rows])
    for column, run in enumerate(runs):
        _heatmap(figure, figure.add_subplot(grid[0, column]), run)
    _histogram(figure.add_subplot(grid[1, :]), runs)
    _tenths(figure.add_subplot(grid[2, :]), runs, data.get("advice"))
    if mixture:
        _shares(figure.add_subplot(grid[3, :]), data["batches"], mixture)
    if drift:
        _drift(figure, figure.add_subplot(grid[rows - 1, :]), drift)
    figure.suptitle(_title(data), fontsize=13)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "plotting needs matplotlib: pip install 'shardmix[plot]'", name=error.name
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(data: Mapping[str, Any]) -> str:
    s = data["settings"]
    limit = "whole epoch" if s["batches"] is None else f"first {s['batches']} batches"
    return (
        f"shardmix inspect: {s['num_shards']} shards, rank {s['rank']} of {s['world_size']}, "
        f"epoch {s['epoch']} ({limit})\n"
        f"batch_size {s['batch_size']}, num_workers {s['num_workers']}, "
        f"num_lanes {'default' if s['num_lanes'] is None else s['num_lanes']}, "
        f"shuffle_buffer {s['shuffle_buffer']}, seed {s['seed']}"
    )


def _run_label(run: Mapping[str, Any]) -> str:
    if run["loader"] == "MixingLoader":
        return f"shardmix MixingLoader ({run['num_lanes']} lanes)"
    return f"plain DataLoader ({run['num_workers']} workers, one shard open each)"


def _heatmap(figure: Any, axes: Any, run: Mapping[str, Any]) -> None:
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    batches: Sequence[Mapping[str, Any]] = run["batches"][:MAX_HEATMAP_BATCHES]
    order: dict[str, int] = {}
    for batch in batches:
        for url in batch["sources"]:
            order.setdefault(url, len(order))
    counts = np.zeros((max(1, len(batches)), max(1, len(order))))
    for row, batch in enumerate(batches):
        for url, count in batch["sources"].items():
            counts[row, order[url]] = count
    image = axes.imshow(
        np.ma.masked_equal(counts, 0), aspect="auto", interpolation="nearest", cmap=_cmap(), vmin=0
    )
    shown, total = len(batches), len(run["batches"])
    more = f" (first {shown} of {total} batches)" if shown < total else ""
    axes.set_title(f"{_run_label(run)}{more}", fontsize=11)
    axes.set_xlabel(f"shard, in order of first appearance ({len(order)} shards)")
    axes.set_ylabel("batch")
    axes.set_facecolor("white")
    bar = figure.colorbar(image, ax=axes, fraction=0.05, pad=0.02, aspect=40)
    bar.set_label("samples from the shard in the batch")
    bar.locator = MaxNLocator(integer=True)
    bar.update_ticks()


def _color(run: Mapping[str, Any]) -> str:
    return _COLORS.get(run["loader"], "tab:gray")


def _cmap() -> Any:
    import matplotlib

    return matplotlib.colormaps["viridis"].with_extremes(bad="white")


def _histogram(axes: Any, runs: Sequence[Mapping[str, Any]]) -> None:
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    histograms = [run["summary"]["histogram"] for run in runs]
    highest = max(max((h["distinct_sources"] for h in each), default=1) for each in histograms)
    ideal = runs[0]["summary"]["ideal_distinct_sources"]
    width = 0.8 / len(runs)
    tallest = 1.0
    for position, run in enumerate(runs):
        bins = np.zeros(highest + 1)
        for entry in run["summary"]["histogram"]:
            bins[entry["distinct_sources"]] = entry["batches"]
        tallest = max(tallest, float(bins.max()))
        label = f"{_run_label(run)}: mean {run['summary']['mean_distinct_sources']:.1f}"
        offset = (position - (len(runs) - 1) / 2) * width
        axes.bar(np.arange(highest + 1) + offset, bins, width=width, color=_color(run), label=label)
    axes.axvline(ideal, color="tab:red", linestyle="--", linewidth=2)
    axes.annotate(
        f"uniformly random ideal: {ideal:.1f}",
        xy=(ideal, 0.97),
        xycoords=("data", "axes fraction"),
        xytext=(-6, 0),
        textcoords="offset points",
        ha="right",
        va="top",
        color="tab:red",
        fontsize=10,
        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8},
    )
    axes.set_xlim(-0.5, max(highest, ideal) * 1.05 + 1.5)
    axes.set_ylim(0, tallest * 1.45)  # headroom: the legend and the label sit above the bars
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("distinct shards in the batch")
    axes.set_ylabel("batches")
    axes.set_title("distinct shards per batch", fontsize=11)
    axes.legend(loc="upper left", fontsize=9)


def _tenths(axes: Any, runs: Sequence[Mapping[str, Any]], advice: Any) -> None:
    import numpy as np

    from shardmix.inspect.report import LOW_SHARE

    width = 0.8 / len(runs)
    highest = 1.0
    for position, run in enumerate(runs):
        shares = [tenth["share_of_ideal"] for tenth in run["summary"].get("tenths", [])]
        highest = max([highest, *shares])
        label = f"{_run_label(run)}: {run['summary'].get('share_of_ideal', 0.0):.2f} overall"
        offset = (position - (len(runs) - 1) / 2) * width
        axes.bar(
            np.arange(len(shares)) + offset, shares, width=width, color=_color(run), label=label
        )
    axes.axhline(LOW_SHARE, color="tab:red", linestyle="--", linewidth=1.5)
    axes.set_ylim(0, highest * 1.3)
    axes.set_xticks(range(10), [f"{10 * i}-{10 * i + 10}%" for i in range(10)], fontsize=8)
    axes.set_xlabel("tenth of the epoch")
    axes.set_ylabel("share of the ideal")
    axes.set_title("distinct shards per batch over the ideal, per tenth of the epoch", fontsize=11)
    axes.legend(loc="upper left", fontsize=9)
    messages = advice.get("messages") if isinstance(advice, Mapping) else None
    if messages:
        axes.annotate(
            "\n".join(messages),
            xy=(0.0, -0.3),
            xycoords="axes fraction",
            va="top",
            fontsize=8,
            color="tab:red",
            wrap=True,
        )


def _drift(figure: Any, axes: Any, order: Mapping[str, Any]) -> None:
    """Each tenth's mix of values under the epoch's, labelled with its drift (and random's)."""
    import numpy as np

    values = list(order["histogram"])
    rows = [order["histogram"], *order["tenth_histograms"]]
    shares = np.array([[row.get(v, 0) for v in values] for row in rows], dtype=float)
    shares /= np.maximum(shares.sum(axis=1, keepdims=True), 1)
    image = axes.imshow(shares, aspect="auto", interpolation="nearest", cmap=_cmap())
    labels = ["epoch"] + [
        f"tenth {i + 1}: {mine:.3f} ({theirs:.3f})"
        for i, (mine, theirs) in enumerate(
            zip(order["tenth_drift"], order["random_tenth_drift"], strict=True)
        )
    ]
    axes.set_yticks(range(len(rows)), labels, fontsize=8)
    axes.set_xlabel(f"{order['field']} values ({len(values)})")
    if len(values) <= 40:
        axes.set_xticks(range(len(values)), [v[-12:] for v in values], fontsize=7, rotation=90)
    ratio = order["drift_ratio"]
    axes.set_title(
        f"each tenth's mix of {order['field']} against the epoch's: drift {order['drift']:.3f}, "
        f"random order {order['random_drift']:.3f}" + ("" if ratio is None else f" ({ratio:.2f}x)"),
        fontsize=11,
    )
    figure.colorbar(image, ax=axes, label="share of the tenth's samples")


def _shares(axes: Any, batches: Sequence[Mapping[str, Any]], mixture: Mapping[str, Any]) -> None:
    """Each dataset's samples per batch, stacked, with its cumulative weight x batch size."""
    import numpy as np

    names = list(mixture["datasets"])
    shown = batches[:MAX_HEATMAP_BATCHES]
    index = np.arange(len(shown))
    bottom = np.zeros(len(shown))
    expected = 0.0
    colors = [f"C{i % 10}" for i in range(len(names))]
    for name, color in zip(names, colors, strict=True):
        counts = np.array([batch["datasets"][name]["size"] for batch in shown], dtype=float)
        weight = mixture["datasets"][name]["weight"]
        label = f"{name} (weight {weight:.2f})"
        axes.bar(index, counts, bottom=bottom, width=1.0, color=color, alpha=0.75, label=label)
        bottom += counts
        expected += shown[0]["datasets"][name]["expected"] if shown else 0.0
        axes.axhline(expected, color=color, linestyle="--", linewidth=1.5)
    more = f" (first {len(shown)} of {len(batches)} batches)" if len(shown) < len(batches) else ""
    axes.set_xlim(-0.5, max(1, len(shown)) - 0.5)
    axes.set_ylim(0, max([1.0, *bottom]) * 1.25)
    axes.set_xlabel("batch")
    axes.set_ylabel("samples")
    axes.set_title(
        f"each dataset's samples per batch, stacked; dashed: cumulative weight x batch size{more}",
        fontsize=11,
    )
    axes.legend(loc="upper left", fontsize=9, ncols=min(4, len(names)))
