"""``shardmix stat``: per shard its format, records and bytes, and totals.

A shell over :func:`shardmix.inspect.stat.stat_shards`; the exit status is 1 when a shard is
damaged or missing (each listed), else 0.
"""

from __future__ import annotations

import argparse
import json
import sys

HELP = "list shards with their format, records and bytes; --verify checks every record"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+", metavar="URLS", help="shard URL patterns")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="read every record, checking headers and CRCs, and each shard's sha256 against "
        "the manifest beside it",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from shardmix.inspect.stat import stat_shards

    report = stat_shards(args.urls, verify=args.verify, progress=sys.stderr.isatty())
    data = report.to_dict()
    print(json.dumps(data, indent=1) if args.json else format_report(data))
    return 1 if report.damaged or report.missing else 0


def format_report(data: dict) -> str:
    """The report as text: one row per shard, the totals, then each damage in full."""
    width = max([len(shard["url"]) for shard in data["shards"]] + [15])
    lines = [f"{'shard':<{width}}  {'format':<8} {'records':>10} {'bytes':>14}  status"]
    for shard in data["shards"]:
        size = "?" if shard["bytes"] is None else f"{shard['bytes']:,}"
        status = "ok" if shard["error"] is None else _damage(shard)
        if shard.get("checksum") == "stale":
            status = "STALE"
        if shard.get("checksum") is not None:
            status += f", {_CHECKSUM[shard['checksum']]}"
        lines.append(
            f"{shard['url']:<{width}}  {shard['format']:<8} {shard['records']:>10,} "
            f"{size:>14}  {status}"
        )
    totals = data["totals"]
    checked = "verified" if data["verify"] else "counted (use --verify to check every record)"
    if data["missing"]:
        checked += f"; {len(data['missing'])} MISSING"
    lines.append(
        f"{'total: ' + str(totals['shards']) + ' shards':<{width}}  {'':<8} "
        f"{totals['records']:>10,} {totals['bytes']:>14,}  {checked}"
    )
    damaged = [shard for shard in data["shards"] if shard["error"] is not None]
    if damaged:
        lines += ["", f"{len(damaged)} damaged shard(s):"]
        lines += [f"- {shard['error']}" for shard in damaged]
    if data["missing"]:
        lines += ["", f"{len(data['missing'])} missing shard(s), named or listed but gone:"]
        lines += [f"- {url}" for url in data["missing"]]
    return "\n".join(lines)


_CHECKSUM = {
    "verified": "sha256 verified",
    "mismatch": "sha256 MISMATCH",
    "no manifest entry": "unverified (no manifest)",
    "stale": "sha256 matches a stale conversion (its input changed)",
}


def _damage(shard: dict) -> str:
    where = []
    if shard["error_record"] is not None:
        where.append(f"record {shard['error_record']}")
    if shard["error_offset"] is not None:
        where.append(f"byte offset {shard['error_offset']}")
    return "DAMAGED" + (f" at {', '.join(where)}" if where else "")
