"""Planning: which items go to which shard, decided before a byte is written.

A pure function of the items and the options, so any number of workers writes the same shards
and :func:`plan_digest` tells a re-run of the same conversion (docs/design/convert.md).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardmix.convert.inputs import Item
from shardmix.convert.options import ConvertOptions, OutputPattern, Part
from shardmix.formats import Format, writer_for


@dataclass(frozen=True)
class ShardPlan:
    """One output shard: its number, file name and items in write order."""

    index: int
    name: str
    items: tuple[Item, ...]


def shuffled(items: Sequence[Item], seed: int, part: Part) -> list[Item]:
    """The items in an order that depends only on (seed, part)."""
    order = list(items)
    random.Random(f"shardmix.convert:{seed}:{part.index}/{part.count}").shuffle(order)
    return order


class Roller:
    """Where shards close under the limits, one item at a time (never an empty shard)."""

    def __init__(self, fmt: Format, max_records: int | None, max_bytes: int | None) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._writer = writer_for(fmt)
        self._base = self._writer.end_size  # a finished shard's bytes before any record
        self.records = 0  # in the current shard
        self._size = self._base

    def add(self, item: Item) -> bool:
        """Count ``item`` in; True when it must open a new shard (the current one is full)."""
        item_size = 0
        if self.max_bytes is not None:
            item_size = self._writer.record_size(item.key, item.fields, item.sizes)
        full = self.max_records is not None and self.records >= self.max_records
        too_big = self.max_bytes is not None and self._size + item_size > self.max_bytes
        new = self.records > 0 and (full or too_big)
        if new:
            self.records, self._size = 0, self._base
        self.records += 1
        self._size += item_size
        return new


def make_plan(
    items: Sequence[Item], pattern: OutputPattern, fmt: Format, options: ConvertOptions
) -> list[ShardPlan]:
    """The shards of ``options.part``, named by ``pattern``."""
    part = options.part
    chosen = list(items[part.index :: part.count])
    if options.shuffle:
        chosen = shuffled(chosen, options.seed, part)
    roller = Roller(fmt, *options.limits())
    shards: list[list[Item]] = []
    for item in chosen:
        if roller.add(item) or not shards:
            shards.append([])
        shards[-1].append(item)
    return [
        ShardPlan(index, pattern.shard_name(index, part), tuple(shard))
        for index, shard in enumerate(shards)
    ]


class PlanDigest:
    """A sha256 over the settings and every shard's name and (key, source) list, as they come."""

    def __init__(self, settings: dict[str, object]) -> None:
        self._sha256 = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())

    def shard(self, name: str) -> None:
        self._sha256.update(f"\n{name}".encode("utf-8", "surrogateescape"))

    def item(self, key: str, source: str) -> None:
        self._sha256.update(f"\t{key}\x00{source}".encode("utf-8", "surrogateescape"))

    def hexdigest(self) -> str:
        return self._sha256.hexdigest()


def plan_digest(plans: Sequence[ShardPlan], settings: dict[str, object]) -> str:
    """A sha256 over the settings and every shard's name and (key, source) list."""
    digest = PlanDigest(settings)
    for plan in plans:
        digest.shard(plan.name)
        for item in plan.items:
            digest.item(item.key, item.source)
    return digest.hexdigest()


def set_origin(
    given: Sequence[str],
    items: Sequence[Item],
    settings: dict[str, object],
    options: ConvertOptions,
) -> dict[str, Any]:
    """What a whole set is made from, the same in each of its parts (a manifest's ``origin``):
    the sha256 of every listed item's key and source, and the options (the inputs as given
    among them) but the part."""
    digest = PlanDigest({})
    for item in items:
        digest.item(item.key, item.source)
    chosen = {name: value for name, value in settings.items() if name != "part"}
    chosen["inputs"] = list(given)
    chosen |= {"labels": options.labels.value, "inline_columns": list(options.inline_columns)}
    chosen |= {"key_column": options.key_column, "follow_links": options.follow_links}
    return {"inputs": digest.hexdigest(), "options": json.loads(json.dumps(chosen))}
