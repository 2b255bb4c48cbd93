"""``shardmix convert --engine ray``: a conversion whose reading and writing run as Ray tasks.

``pip install 'shardmix[ray]'``; Ray is imported only when this module is. The inputs are
listed by the local engine's own code (:func:`shardmix.convert.api.list_inputs`): folders,
JSON Lines, CSV and Parquet tables, saved Hugging Face datasets and existing shards give the
same keys, fields, class labels and counted left-out inputs, and a bad input is refused (or,
with ``skip_bad``, skipped and counted) the same way. Ray then loads every sample's bytes
(files, inlined columns, rows, records of input shards) in parallel read tasks and writes them
through :class:`shardmix.ray.ShardSink`, so the manifest is written last, as the commit, and a
task Ray retries leaves nothing behind.

Samples travel from the read tasks to the write tasks as Python objects in one column of Ray
blocks (Ray serializes them as it does any object): the values shardmix itself just loaded,
whose types an Arrow column per field would change (a list field would become an array).
The order is the listing's (``shuffle`` permutes it with the local engine's seeded
permutation), each write task rolls its own shards within ``max_records`` and ``max_bytes``,
and the driver names them in task order. ``part`` and ``workers`` are the local engine's way
of spreading the work and are refused here: Ray spreads it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import ray.data

from shardmix.convert.api import InputLike, list_inputs
from shardmix.convert.inputs import Item, Problems, ShardCursor
from shardmix.convert.options import ConvertOptions, OutputPattern, Part
from shardmix.convert.plan import shuffled
from shardmix.errors import ConfigError
from shardmix.ray import SAMPLE_COLUMN, ShardSink, committed_shards

__all__ = ["RayConvertSummary", "convert_on_ray"]

ITEMS_PER_TASK = 2048


@dataclass(frozen=True)
class RayConvertSummary:
    """What a conversion on Ray wrote."""

    shards: int
    records: int
    bytes: int
    seconds: float
    manifest: str
    skipped: list[str]
    left_out: dict[str, int]


def convert_on_ray(
    inputs: Sequence[InputLike],
    output: str,
    options: ConvertOptions | None = None,
    *,
    address: str | None = None,
) -> RayConvertSummary:
    """Convert ``inputs`` into the shards ``output`` names, reading and writing on Ray.

    ``address`` is a Ray cluster's (``ray.init(address=...)``); None starts a local Ray, or
    uses the one this process already joined.
    """
    options = options or ConvertOptions()
    if options.part != Part() or options.workers != 1:
        raise ConfigError(
            "--engine ray spreads the work itself: leave out --part and --workers (they are "
            "the local engine's)"
        )
    began = time.monotonic()
    OutputPattern.parse(output)  # a bad pattern fails before Ray starts
    problems = Problems(options.skip_bad)
    listing = list_inputs(inputs, options, problems)
    items = listing.items
    if options.shuffle:
        items = shuffled(items, options.seed, Part())
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # the listing's order, in every run
    blocks = max(1, -(-len(items) // ITEMS_PER_TASK))
    held = ray.put(items)
    rows = ray.data.range(len(items), override_num_blocks=blocks)
    samples = rows.map_batches(
        _load_items,  # type: ignore[arg-type]  # the fn_kwargs argument is not in Ray's type
        fn_kwargs={"held": [held]},
        batch_size=ITEMS_PER_TASK,
        batch_format="numpy",
    )
    sink = ShardSink(
        output,
        max_records=options.max_records,
        max_bytes=options.max_bytes,
        overwrite=options.overwrite,
    )
    samples.write_datasink(sink)
    manifest, _ = committed_shards(output)
    return RayConvertSummary(
        shards=len(manifest.shards),
        records=sum(shard.records for shard in manifest.shards),
        bytes=sum(shard.bytes for shard in manifest.shards),
        seconds=time.monotonic() - began,
        manifest=os.path.abspath(sink.manifest_path),
        skipped=list(listing.skipped),
        left_out=dict(listing.left_out),
    )


def _load_items(batch: dict[str, np.ndarray], held: list[Any]) -> dict[str, Any]:
    """The samples of a read task's items, as objects in the sample column."""
    items: list[Item] = ray.get(held[0])
    cursor = ShardCursor()
    try:
        loaded = [items[int(i)].load(cursor) for i in batch["id"]]
    finally:
        cursor.close()
    column = np.empty(len(loaded), dtype=object)
    column[:] = loaded
    return {SAMPLE_COLUMN: column}
