"""Inspect: which shards every batch came from, with the settings a training run uses.

:func:`inspect_batches` reads batches from the real :class:`~shardmix.ShardDataset` and
:class:`~shardmix.MixingLoader` (payloads dropped in the workers), so it reports what training
would get; rank ``I`` of ``R`` is inspected in one process, without torch.distributed. The
baseline, the ideal and the advice are spelled out in ``docs/inspect-schema.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from shardmix.errors import ConfigError
from shardmix.inspect.advice import Context
from shardmix.inspect.advice import advise as advise_run
from shardmix.inspect.mixture import inspect_mixture
from shardmix.inspect.reading import LaneOf, inspect_dataset, provenance_of, rank_shards, record_run
from shardmix.inspect.reading import baseline as read_baseline
from shardmix.inspect.report import InspectReport, InspectSettings
from shardmix.inspect.summary import Ideal
from shardmix.loader import DEFAULT_SHUFFLE_BUFFER_BYTES, MixingLoader
from shardmix.plan.apportion import Stopping
from shardmix.plan.sharding import DEFAULT_PIECE_RECORDS, EvenRanks


def inspect_batches(
    urls: str | Sequence[str] | Mapping[str, str | Sequence[str]],
    *,
    weights: Mapping[str, float] | None = None,
    stopping: str | Stopping = Stopping.FIRST_EXHAUSTED,
    batch_size: int = 64,
    num_workers: int = 0,
    num_lanes: int | None = None,
    shuffle_buffer: int | None = None,
    shuffle_buffer_bytes: int | None = DEFAULT_SHUFFLE_BUFFER_BYTES,
    record_counts: Mapping[str, int] | None = None,
    seed: int = 0,
    epoch: int = 0,
    batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    even_ranks: str | EvenRanks = EvenRanks.DROP,
    piece_records: int | None = DEFAULT_PIECE_RECORDS,
    label: str | None = None,
    compare: bool = False,
    advise: bool = True,
    progress: bool = False,
) -> InspectReport:
    """Read batches the way training would and record which shards each one came from.

    The loader settings are :class:`~shardmix.MixingLoader`'s and :class:`~shardmix.ShardDataset`'s;
    ``batches`` limits how many are read (default: all of epoch ``epoch``). ``label``: a field
    (``"cls"``) counted per batch and per tenth against a random order (the report's ``order``).
    ``compare`` also reads a plain DataLoader; ``advise`` tries the settings that could raise a
    low share of the ideal, and the defaults when settings are given. A mixture: ``urls`` maps
    names to patterns, with ``weights`` and ``stopping`` (no ``compare``, no advice).
    """
    settings = InspectSettings(
        batch_size=batch_size,
        num_workers=num_workers,
        num_lanes=num_lanes,
        shuffle_buffer=shuffle_buffer,
        shuffle_buffer_bytes=shuffle_buffer_bytes,
        seed=seed,
        epoch=epoch,
        batches=batches,
        rank=rank,
        world_size=world_size,
        even_ranks=EvenRanks(even_ranks),
        piece_records=piece_records,
        label=label,
    )
    if isinstance(urls, Mapping):
        if label is not None:
            raise ConfigError("label= counts one dataset's labels; inspect a mixture without it")
        if compare:
            raise ConfigError(
                "compare reads one dataset with a plain DataLoader; inspect the datasets of a "
                "mixture one at a time to compare them"
            )
        return inspect_mixture(
            urls, weights, stopping, settings, record_counts=record_counts, progress=progress
        )
    if weights is not None:
        raise ConfigError("weights= mixes several datasets: pass the patterns as a dict of names")
    given = settings
    dataset = inspect_dataset(urls, settings, num_lanes, record_counts)
    lanes = dataset.plan.lanes_for(batch_size, world_size)
    plan = dataset.plan.lane_pieces(epoch, rank=rank, world_size=world_size, num_lanes=lanes)
    shards = rank_shards(dataset, plan)
    ideal = Ideal(list(shards.values()), batch_size)
    total = math.ceil(sum(shards.values()) / batch_size)  # for the progress bar only
    total = min(total, batches) if batches is not None else total

    loader = MixingLoader(dataset, collate_fn=provenance_of, **settings.loader_keywords())
    loader.set_epoch(epoch)
    settings = dataclasses.replace(
        settings, num_lanes=lanes, shuffle_buffer=loader.options.shuffle_buffer_size()
    )
    lane_of = LaneOf(plan, dataset.urls)
    run = record_run("MixingLoader", loader, lane_of, lanes, settings, ideal, total, progress)
    baseline = read_baseline(urls, settings, ideal, total, progress) if compare else None
    advice = None
    if advise:
        sized = world_size > 1 or dataset.plan.piece_weights([p for lane in plan for p in lane], 1)
        context = Context(
            urls, given, settings, record_counts, len(dataset.urls), shards, inspect_batches
        )
        pieces = dataset.plan.spread_counts(world_size) is not None
        advice = advise_run(context, run.summary, run.judged_order, bool(sized), pieces, progress)
    return InspectReport(settings, len(dataset.urls), shards, run, baseline, advice)
