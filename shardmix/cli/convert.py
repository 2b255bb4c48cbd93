"""``shardmix convert INPUT... OUTPUT_PATTERN``: a shell over :func:`shardmix.convert.convert`.

``--merge-manifests`` instead merges the part manifests of ``OUTPUT_PATTERN``; ``--engine ray``
runs the conversion as Ray tasks (:mod:`shardmix.ray`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from shardmix.convert import ConvertOptions, ConvertSummary
    from shardmix.ray import RayConvertSummary

HELP = (
    "Convert folders, tables (JSON Lines, CSV, Parquet), saved Hugging Face datasets or shards "
    "into tar/TFRecord shards."
)

EPILOG = """\
inputs: a folder (files sharing a stem form a sample; class subfolders give a 'cls' label),
a .jsonl/.csv/.tsv/.parquet table (one sample per row), a folder written by Hugging Face's
Dataset.save_to_disk (Image/Audio columns become raw <column>.<ext> members), or tar/TFRecord
shards (patterns allowed). The output pattern has one %d directive, e.g.
out/train-%06d.tar; .gz compresses. A manifest <prefix>.manifest.json is written beside the
shards; re-running the same command after an interruption completes the set.

tokens: --tokenizer tokenizer.json writes each document (row, file, record) as its token ids
(tokens.npy in tar, uint16 or uint32; an int64 list 'tokens' in TFRecord) and its key, nothing
else unless kept with --keep-column; the manifest counts the tokens of every record and shard.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("paths", nargs="+", metavar="INPUT... OUTPUT_PATTERN")
    parser.add_argument("--format", choices=["tar", "tfrecord"], help="default: from extension")
    parser.add_argument("--max-records", type=int, metavar="N", help="records per shard at most")
    parser.add_argument("--max-bytes", metavar="SIZE", help="bytes per shard at most: 1GB, 512MiB")
    parser.add_argument("--shuffle", action="store_true", help="shuffle the samples (seeded)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument("--workers", type=int, default=1, help="parallel writer processes")
    parser.add_argument("--part", metavar="I/N", help="convert only part I of N of the input")
    parser.add_argument("--skip-bad", action="store_true", help="skip and count bad inputs")
    parser.add_argument("--overwrite", action="store_true", help="replace existing output")
    parser.add_argument(
        "--follow-links", action="store_true", help="follow links out of input folders"
    )
    parser.add_argument(
        "--labels",
        choices=["auto", "subfolder", "none"],
        default="auto",
        help="class labels from subfolders (default: auto)",
    )
    parser.add_argument(
        "--inline-column",
        action="append",
        default=[],
        metavar="COL",
        help="table column naming files whose bytes become the field (repeatable)",
    )
    parser.add_argument("--key-column", metavar="COL", help="table column holding sample keys")
    parser.add_argument("--no-index", action="store_true", help="no TFRecord .idx files")
    tokens = parser.add_argument_group("tokens (pip install 'shardmix[tokens]')")
    tokens.add_argument("--tokenizer", metavar="PATH", help="a local tokenizer.json: write tokens")
    tokens.add_argument("--text-column", metavar="COL", help="the documents' text (default: text)")
    tokens.add_argument("--append-eos", action="store_true", help="end each document with EOS")
    tokens.add_argument(
        "--eos-token",
        metavar="TOKEN",
        help="the EOS token (default: from the tokenizer's special tokens)",
    )
    tokens.add_argument(
        "--keep-column",
        action="append",
        default=[],
        metavar="COL",
        help="a field kept beside the tokens, the text's too (repeatable; default: none)",
    )
    parser.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="local processes (default) or Ray tasks (pip install 'shardmix[ray]')",
    )
    parser.add_argument("--address", help="with --engine ray: the Ray cluster (default: local)")
    parser.add_argument(
        "--merge-manifests",
        action="store_true",
        help="only merge the part manifests of OUTPUT_PATTERN",
    )


def _progress(stream: TextIO) -> tuple[Any, Callable[[int, int], None] | None]:
    """A tqdm bar and its update callback when ``stream`` is a terminal; else (None, None)."""
    if not stream.isatty():
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=0, unit="rec", unit_scale=True, file=stream)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return bar, update


def _merge(pattern_text: str) -> int:
    import glob
    import os

    from shardmix.convert import OutputPattern, merge_part_manifests, read_manifest

    pattern = OutputPattern.parse(pattern_text)
    stem = pattern.manifest_name(None).removesuffix(".manifest.json")
    found = sorted(glob.glob(os.path.join(glob.escape(pattern.folder), f"{stem}-p*.manifest.json")))
    if not found:
        print(f"shardmix convert: no part manifests for {pattern_text}")
        return 2
    path = merge_part_manifests(pattern, read_manifest(found[0]).parts, required=True)
    print(f"merged {read_manifest(str(path)).parts} part manifests into {path}")
    return 0


def _run_on_ray(args: argparse.Namespace, options: ConvertOptions) -> int:
    from shardmix.ray import convert_on_ray

    summary = convert_on_ray(args.paths[:-1], args.paths[-1], options, address=args.address)
    print(
        f"{summary.shards} shards written on Ray, {summary.records} records, "
        f"{summary.bytes:,} bytes in {summary.seconds:.1f} s; manifest {summary.manifest}"
    )
    _report_left_out(summary)
    return 0


def _report_left_out(summary: ConvertSummary | RayConvertSummary) -> None:
    if summary.left_out:
        counts = sorted(summary.left_out.items())
        print(f"left out by rule: {', '.join(f'{count} {reason}' for reason, count in counts)}")
    if summary.skipped:
        print(f"skipped {len(summary.skipped)} bad inputs, first: {summary.skipped[0]}")


def run(args: argparse.Namespace) -> int:
    from shardmix.convert import ConvertOptions, LabelMode, Part, TokenOptions, convert, parse_size
    from shardmix.formats import Format

    if args.merge_manifests:
        return _merge(args.paths[-1])
    if len(args.paths) < 2:
        print("shardmix convert: give at least one INPUT and an OUTPUT_PATTERN")
        return 2
    tokens = None
    if args.tokenizer is not None:
        text, keep = args.text_column or "text", tuple(args.keep_column)
        tokens = TokenOptions(args.tokenizer, text, args.append_eos, args.eos_token, keep)
    elif args.text_column or args.append_eos or args.eos_token or args.keep_column:
        print("shardmix convert: the token options need --tokenizer", file=sys.stderr)
        return 2
    options = ConvertOptions(
        format=Format(args.format) if args.format else None,
        max_records=args.max_records,
        max_bytes=parse_size(args.max_bytes) if args.max_bytes else None,
        shuffle=args.shuffle,
        seed=args.seed,
        workers=args.workers,
        part=Part.parse(args.part) if args.part else Part(),
        skip_bad=args.skip_bad,
        overwrite=args.overwrite,
        follow_links=args.follow_links,
        labels=LabelMode(args.labels),
        inline_columns=tuple(args.inline_column),
        key_column=args.key_column,
        write_index=not args.no_index,
        tokens=tokens,
    )
    if args.engine == "ray":
        return _run_on_ray(args, options)
    if args.address:
        print("shardmix convert: --address is for --engine ray", file=sys.stderr)
        return 2
    bar, update = _progress(sys.stderr)
    try:
        summary = convert(args.paths[:-1], args.paths[-1], options, progress=update)
    finally:
        if bar is not None:
            bar.close()
    counted = "" if summary.tokens is None else f"{summary.tokens:,} tokens, "
    print(
        f"{summary.shards} shards ({summary.shards_written} written now), "
        f"{summary.records} records, {counted}{summary.bytes:,} bytes in {summary.seconds:.1f} s "
        f"({summary.records_per_s:,.0f} records/s); manifest {summary.manifest}"
    )
    if summary.merged_manifest:
        print(f"all parts done: merged manifest {summary.merged_manifest}")
    _report_left_out(summary)
    return 0
