"""``shardmix inspect``: which shards each batch came from, with the loader settings given.

A shell over :func:`shardmix.inspect.inspect_batches` (with ``--seq-len``,
:func:`shardmix.inspect.tokens.inspect_tokens`): a table per batch, the summary and the advice,
or the JSON (docs/inspect-schema.md), or a plot.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any

from shardmix.plan.sharding import DEFAULT_PIECE_RECORDS

HELP = "show which shards each batch came from, against the uniformly random ideal"
# With more batches than this, the table shows the first and the last EDGE_ROWS.
MAX_ROWS = 12
EDGE_ROWS = 5
DATASET_SYNTAX = "NAME=WEIGHT:PATTERN"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def dataset_spec(text: str) -> tuple[str, float, str]:
    """``NAME=WEIGHT:PATTERN`` as ``(name, weight, pattern)``; the pattern may hold ``:``."""
    name, equals, rest = text.partition("=")
    weight_text, colon, pattern = rest.partition(":")
    if not equals or not colon:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not {DATASET_SYNTAX}; e.g. --dataset web=0.7:'web/train-{{0..63}}.tar'"
        )
    if not _NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(
            f"{text!r}: the name {name!r} must be letters, digits, '_', '.' or '-'"
        )
    try:
        weight = float(weight_text)
    except ValueError:
        weight = math.nan
    if not math.isfinite(weight) or weight < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the weight {weight_text!r} must be a number >= 0 (e.g. 0.7)"
        )
    if not pattern:
        raise argparse.ArgumentTypeError(f"{text!r}: no shard pattern after {name}={weight_text}:")
    return name, weight, pattern


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "urls", nargs="*", metavar="URLS", help="shard URL patterns (or --dataset, for a mixture)"
    )
    parser.add_argument(
        "--dataset",
        action="append",
        type=dataset_spec,
        default=[],
        metavar=DATASET_SYNTAX,
        dest="datasets",
        help="a dataset of a mixture: its name, its weight, a colon and its shard pattern "
        "(the first '=' and the first ':' after it split them, so a pattern may hold ':'); "
        "repeat for each dataset, e.g. --dataset web=0.7:'web/train-{0..63}.tar' "
        "--dataset code=0.3:'code/*.tfrecord'; weights are normalized to sum to 1",
    )
    parser.add_argument(
        "--stopping",
        choices=("first_exhausted", "all_exhausted"),
        default="first_exhausted",
        help="a mixture's epoch ends when one dataset is read whole, or when every dataset "
        "has been (the others starting new passes) (first_exhausted)",
    )
    for flag, default, text in (
        ("--batch-size", None, "samples per batch (64); with --seq-len, rows (8)"),
        ("--num-workers", 0, "DataLoader workers (0)"),
        ("--num-lanes", None, "shards open at once (min(shards per rank, 3 x batch size))"),
        ("--shuffle-buffer", None, "shuffle buffer samples (max(8192, 64 x batch size))"),
        ("--shuffle-buffer-bytes", None, "shuffle buffer byte budget (64 MiB)"),
    ):
        parser.add_argument(flag, type=int, default=default, help=text)
    parser.add_argument(
        "--piece-records",
        type=int,
        default=DEFAULT_PIECE_RECORDS,
        help=f"records per piece a shard is read as; 0: whole shards ({DEFAULT_PIECE_RECORDS})",
    )
    parser.add_argument(
        "--label",
        metavar="FIELD",
        help="also count this field's values (e.g. cls) per batch and per tenth of the epoch, "
        "against a random order",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of shard order and buffer (0)")
    parser.add_argument("--epoch", type=int, default=0, help="epoch to read (0)")
    parser.add_argument("--batches", type=int, default=None, help="read only the first K")
    parser.add_argument("--world-size", type=int, default=1, help="ranks in the job (1)")
    parser.add_argument("--rank", type=int, default=0, help="the rank to inspect (0)")
    parser.add_argument(
        "--even-ranks",
        choices=("drop", "pad", "none"),
        default="drop",
        help="with several ranks: drop the uneven tail, pad to the largest rank, or let the "
        "ranks differ (drop)",
    )
    parser.add_argument(
        "--compare", action="store_true", help="also read a plain DataLoader over the shards"
    )
    parser.add_argument(
        "--no-advice",
        action="store_true",
        help="do not try other settings when the mixing is low (nor the defaults)",
    )
    parser.add_argument(
        "--seq-len",
        type=int,
        help="inspect a TokenLoader's batches of rows of this many tokens: documents per row, "
        "padding, distinct shards against a random draw, a mixture's token shares",
    )
    parser.add_argument(
        "--packing", choices=("best_fit", "concat"), help="with --seq-len: packing (best_fit)"
    )
    parser.add_argument(
        "--window", type=int, help="with --seq-len: documents packed together (16384)"
    )
    parser.add_argument("--field", help="with --seq-len: the token field (tokens)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--plot", metavar="FILE", help="draw the report to FILE (.png or .svg)")


def run(args: argparse.Namespace) -> int:
    from shardmix.inspect import inspect_batches

    if bool(args.urls) == bool(args.datasets):
        print(
            "shardmix inspect: give shard URL patterns, or a mixture as --dataset "
            f"{DATASET_SYNTAX} (repeated), not both",
            file=sys.stderr,
        )
        return 2
    names = [name for name, _, _ in args.datasets]
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        print(f"shardmix inspect: --dataset names {twice} more than once", file=sys.stderr)
        return 2
    urls = {name: pattern for name, _, pattern in args.datasets} if args.datasets else args.urls
    if args.seq_len is not None:
        return _run_tokens(args, urls)
    for flag in ("packing", "window", "field"):
        if getattr(args, flag) is not None:
            print(f"shardmix inspect: --{flag} packs tokens; give --seq-len too", file=sys.stderr)
            return 2

    report = inspect_batches(
        urls,
        batch_size=64 if args.batch_size is None else args.batch_size,
        piece_records=args.piece_records or None,
        compare=args.compare,
        advise=not args.no_advice,
        progress=sys.stderr.isatty(),
        **_given(args, "label"),
    )
    if args.plot:
        from shardmix.inspect.plot import plot_report

        plot_report(report, args.plot)
    data = report.to_dict()
    print(json.dumps(data, indent=1) if args.json else format_report(data))
    return 0


def _given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The loader options (and those of ``names``) given, and a mixture's weights."""
    names += ("num_workers", "seed", "epoch", "batches", "rank", "world_size", "even_ranks")
    names += ("num_lanes", "shuffle_buffer", "shuffle_buffer_bytes")
    options = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if args.datasets:
        options["weights"] = {name: weight for name, weight, _ in args.datasets}
        options["stopping"] = args.stopping
    return options


# Sample-mode options a token inspection has no use for, and why.
_NOT_FOR_TOKENS = {
    "label": "counts a label field of samples",
    "compare": "reads the samples with a plain DataLoader",
    "plot": "draws a sample report",
}


def _run_tokens(args: argparse.Namespace, urls: Any) -> int:
    """``--seq-len``: a TokenLoader's batches (:func:`shardmix.inspect.tokens.inspect_tokens`)."""
    from shardmix.inspect.tokens import inspect_tokens

    for flag, why in _NOT_FOR_TOKENS.items():
        if getattr(args, flag):
            print(
                f"shardmix inspect: --{flag} {why}; leave it out with --seq-len "
                "(a token inspection reports documents per row, padding and shards per batch)",
                file=sys.stderr,
            )
            return 2
    data = inspect_tokens(
        urls,
        seq_len=args.seq_len,
        batch_size=8 if args.batch_size is None else args.batch_size,
        piece_records=args.piece_records or None,
        **_given(args, "packing", "window", "field"),
    )
    print(json.dumps(data, indent=1) if args.json else format_tokens(data))
    return 0


def format_tokens(data: dict) -> str:
    """The token report as text: a table per batch and the summary."""
    s, summary = data["settings"], data["summary"]
    lines = [
        f"{len(data['shards'])} shards, {sum(data['shards'].values())} documents; "
        f"TokenLoader seq_len {s['seq_len']}, batch_size {s['batch_size']}, packing "
        f"{s['packing']}, window {s['window']}, num_workers {s['num_workers']}, seed {s['seed']}, "
        f"epoch {s['epoch']}, rank {s['rank']} of {s['world_size']}",
        "",
    ]
    mixture = summary["datasets"] or {}
    header = f"{'batch':>6} {'rows':>5} {'docs/row':>8} {'padding':>8} {'shards':>6} {'random':>6}"
    lines.append(header + "".join(f"  {name[:6] + ' share':>12} {'dev':>9}" for name in mixture))

    def row(batch: dict) -> str:
        parts = "".join(
            f"  {part['share']:>12.3f} {part['deviation']:>+9.2f}"
            for part in (batch["datasets"] or {}).values()
        )
        return (
            f"{batch['index']:>6} {batch['rows']:>5} {batch['documents_per_row']:>8.2f} "
            f"{batch['padding_tokens']:>8} {batch['distinct_sources']:>6} "
            f"{batch['random_distinct_sources']:>6.1f}{parts}"
        )

    lines += _rows(data["batches"], row)
    share, ratio = summary["padding_share"], summary["distinct_ratio"]
    end = "the epoch read to its end" if summary["epoch_end"] else "the epoch goes on"
    lines += [
        "",
        f"{summary['batches']} batches, {summary['rows']} rows ({end})",
        f"documents per row: {summary['documents_per_row']:.2f}",
        f"padding: {summary['padding_tokens']} tokens, "
        + ("no batch" if share is None else f"{share:.3%}")
        + (
            f" (the epoch's last batch aside, which holds {summary['last_batch_padding_tokens']})"
            if summary["epoch_end"]
            else ""
        ),
        f"documents cut across rows: {summary['cut_documents']} of {summary['documents']} "
        f"({summary['cut_share']:.1%})",
        f"distinct shards per batch: {summary['mean_distinct_sources']:.2f}, a random draw of "
        f"as many documents {summary['mean_random_distinct_sources']:.2f}"
        + ("" if ratio is None else f" ({ratio:.2f}x)"),
    ]
    for name, part in mixture.items():
        lines.append(
            f"{name}: weight {part['weight']:.3f}, share of the tokens {part['share']:.3f}, "
            f"largest deviation in a batch {part['max_deviation']:.2f} x seq_len"
        )
    return "\n".join(lines)


def format_report(data: dict) -> str:
    """The report as text: a table per batch and the summary."""
    lines = [_settings_line(data), ""]
    runs = [data] + ([data["baseline"]] if data["baseline"] else [])
    mixture = data.get("mixture")
    if mixture:
        lines += [f"{_name(data)}:", *_mixture_table(data["batches"], mixture), ""]
        lines += [*_mixture_summary(mixture), ""]
    else:
        for run in runs:
            lines += [f"{_name(run)}:", *_table(run["batches"]), ""]
    lines += _summary(runs)
    lines += _order(runs)
    if data.get("loader_stats"):
        lines.append(_stats_line(data["loader_stats"]))
    advice = data.get("advice")
    if advice and advice["messages"]:
        lines += ["", "advice:", *(f"  {message}" for message in advice["messages"])]
    return "\n".join(lines)


def _stats_line(stats: dict) -> str:
    """The loader's stats() in one line: the wait for data, the rates, the cache, stalls."""
    rates = ", ".join(
        f"{rate / 1e6:.1f} MB/s from {host}" for host, rate in stats["bytes_per_second"].items()
    )
    return (
        f"data: waited {stats['wait_seconds']:.3f} s over {stats['steps']} steps "
        f"({1e3 * stats['wait_per_step']:.2f} ms per step); {rates or 'nothing fetched'}; "
        f"cache {stats['cache_hits']} hits, {stats['cache_misses']} misses, "
        f"{stats['cache_evictions']} evictions, {stats.get('cache_read_bytes', 0):,} bytes read; "
        f"{stats['lane_stalls']} lane stalls ({stats['lane_stall_seconds']:.3f} s)"
    )


def _name(run: dict) -> str:
    if run["loader"] == "MixingLoader":
        return f"shardmix MixingLoader ({run['num_lanes']} lanes, {run['num_workers']} workers)"
    return f"plain DataLoader ({run['num_workers']} workers, one shard open each)"


def _settings_line(data: dict) -> str:
    s = data["settings"]
    return (
        f"{s['num_shards']} shards (rank {s['rank']} of {s['world_size']} reads "
        f"{len(data['shards'])}, {sum(data['shards'].values())} records); "
        f"batch_size {s['batch_size']}, num_workers {s['num_workers']}, "
        f"num_lanes {'default' if s['num_lanes'] is None else s['num_lanes']}, "
        f"shuffle_buffer {s['shuffle_buffer']}, "
        f"shuffle_buffer_bytes {s['shuffle_buffer_bytes']}, seed {s['seed']}, epoch {s['epoch']}"
    )


def _table(batches: list) -> list[str]:
    header = f"{'batch':>6} {'samples':>7} {'distinct':>8} {'largest':>7}  {'largest shard':<28}"

    def row(batch: dict) -> str:
        url, _count = max(batch["sources"].items(), key=lambda item: item[1])
        name = url.rstrip("/").rsplit("/", 1)[-1]
        workers = " ".join(str(count) for count in batch["workers"])
        return (
            f"{batch['index']:>6} {batch['size']:>7} {batch['distinct_sources']:>8} "
            f"{batch['largest_share']:>7.1%}  {name[-28:]:<28} {workers}"
        )

    return [header + " samples per worker", *_rows(batches, row)]


def _rows(batches: list, row: Callable[[dict], str]) -> list[str]:
    """One row per batch; with more than MAX_ROWS, the first and the last EDGE_ROWS."""
    if len(batches) <= MAX_ROWS:
        return [row(batch) for batch in batches]
    skipped = f"{'...':>6} ({len(batches) - 2 * EDGE_ROWS} batches not shown)"
    return [*map(row, batches[:EDGE_ROWS]), skipped, *map(row, batches[-EDGE_ROWS:])]


def _summary(runs: list) -> list[str]:
    labels = ["MixingLoader", "DataLoader"][: len(runs)]
    summaries = [run["summary"] for run in runs]
    ideal = summaries[0]["ideal_distinct_sources"]
    lines = [
        _row("distinct shards per batch", labels),
        _row("batches", [str(s["batches"]) for s in summaries]),
        _row("mean", [f"{s['mean_distinct_sources']:.2f}" for s in summaries]),
        _row(
            "min / max",
            [f"{s['min_distinct_sources']} / {s['max_distinct_sources']}" for s in summaries],
        ),
        _row("mean largest share", [f"{s['mean_largest_share']:.1%}" for s in summaries]),
        _row("uniformly random ideal", [f"{ideal:.2f}"]),
        _row("share of the ideal", [f"{s['share_of_ideal']:.2f}" for s in summaries]),
        "",
    ]
    for label, summary in zip(labels, summaries, strict=True):
        tenths = " ".join(f"{tenth['share_of_ideal']:.2f}" for tenth in summary["tenths"])
        lines.append(f"share of the ideal per tenth of the epoch, {label}: {tenths}")
    for label, summary in zip(labels, summaries, strict=True):
        histogram = " ".join(
            f"{entry['distinct_sources']}:{entry['batches']}" for entry in summary["histogram"]
        )
        lines.append(f"histogram {label} (distinct shards:batches): {histogram}")
    return lines


def _order(runs: list) -> list[str]:
    """Each run's diversity and drift against a random order of the same samples."""
    lines = []
    for run in runs:
        for what, order in (run.get("order") or {}).items():
            if order is None:
                continue
            name = "shards" if what == "sources" else f"{order['field']!r} values"
            ratio = order["drift_ratio"]
            lines.append(
                f"{run['loader']}, distinct {name} per batch: {order['mean_distinct']:.2f}, "
                f"{order['diversity']:.3f} of a random order's "
                f"({order['random_mean_distinct']:.2f}); drift per tenth of the epoch "
                f"{order['drift']:.3f} against {order['random_drift']:.3f}"
                + ("" if ratio is None else f" ({ratio:.2f}x)")
            )
    return [""] + lines if lines else []


def _mixture_table(batches: list, mixture: dict) -> list[str]:
    """Per batch: each dataset's samples beside weight x batch size, and files beside ideal."""
    names = list(mixture["datasets"])
    head = f"{'':>24}" + "".join(
        f"  {name[:12]:<12} {mixture['datasets'][name]['weight']:>5.2f} weight" for name in names
    )
    columns = f"{'batch':>6} {'samples':>7} {'distinct':>8} " + "".join(
        f"  {'samples':>7}/{'want':<5} {'files':>5}/{'ideal':<5}" for _ in names
    )

    def row(batch: dict) -> str:
        parts = "".join(
            f"  {part['size']:>7}/{part['expected']:<5.1f} "
            f"{part['distinct_sources']:>5}/{part['ideal_distinct_sources']:<5.1f}"
            for part in (batch["datasets"][name] for name in names)
        )
        row = f"{batch['index']:>6} {batch['size']:>7} {batch['distinct_sources']:>8} {parts}"
        return row.rstrip()

    return [head, columns, *_rows(batches, row)]


def _row(label: str, values: list[str], width: int = 28) -> str:
    return f"{label:<{width}}" + "".join(f"{value:>14}" for value in values)


def _mixture_summary(mixture: dict) -> list[str]:
    """Per dataset over the run: its share beside its weight, its files beside the ideal."""
    datasets = mixture["datasets"]
    names = list(datasets)
    row = functools.partial(_row, width=34)
    summaries = [datasets[name]["summary"] for name in names]
    total = sum(s["samples"] for s in summaries) or 1
    return [
        row(f"per dataset ({mixture['stopping']})", [name[:13] for name in names]),
        row("weight", [f"{datasets[name]['weight']:.3f}" for name in names]),
        row("share of the samples", [f"{s['samples'] / total:.3f}" for s in summaries]),
        row(
            "samples in a full batch, min / max",
            [f"{datasets[n]['min_size']} / {datasets[n]['max_size']}" for n in names],
        ),
        row(
            "largest |samples - weight x batch|",
            [f"{datasets[n]['max_deviation']:.2f}" for n in names],
        ),
        row("shards (this rank)", [str(len(datasets[n]["shards"])) for n in names]),
        row("mean distinct shards", [f"{s['mean_distinct_sources']:.2f}" for s in summaries]),
        row("share of the ideal", [f"{s['share_of_ideal']:.2f}" for s in summaries]),
    ]
