"""Inspect: which shards every batch came from, with the settings a training run uses.

:func:`inspect_batches` builds the real :class:`~shardmix.ShardDataset` and
:class:`~shardmix.MixingLoader` from its arguments and reads batches from them, so what it
reports is what training would get: the same lanes, workers, mixing order and shuffle buffer.
Batches come out in the same order whatever the payloads hold, so two choices only save work:
TFRecords are read raw (not decoded as ``tf.train.Example``) and each sample is cut down to its
provenance (``__source__``, ``__index__``) in the worker (:mod:`~shardmix.inspect.reading`).
Every sample says where it came from, and that is all this module counts.

Rank: ``rank`` and ``world_size`` are given to the loader explicitly, so rank ``I`` of ``R``
is inspected in one process, without torch.distributed. With ``world_size > 1`` the loader
evens the ranks out (``even_ranks``: drop the tail or pad), as in training.

Workers: a batch does not say which worker read each sample; it is derived from the lane plan
(lane ``l`` lives in worker ``l % num_workers``; worker 0 is the main process when
``num_workers`` is 0). Both per-lane and per-worker counts are reported.

With ``compare=True`` the same shards are also read by a plain
``torch.utils.data.DataLoader(ShardDataset(urls, num_lanes=W), batch_size=B, num_workers=W)``:
every worker reads one shard at a time and each batch is what one worker read, which is how a
per-worker shard stream behaves (of rank ``I``'s shards, without evening out the ranks). Its
statistics are reported beside, as ``baseline``.

The ideal is the expected number of distinct shards in a batch of ``B`` samples drawn
uniformly without replacement from all ``N`` samples of the rank's shards (shard ``s`` holding
``n_s``): ``E = sum_s 1 - C(N - n_s, B) / C(N, B)``, computed with log-gamma from the shards'
record counts (the dataset's counting pass, which walks the framing only).

Share of the ideal: the batches' distinct shards over the ideal for their sizes (a short last
batch is held to the ideal of its size), for the whole run and for each tenth of it (batches
``[i * n // 10, (i + 1) * n // 10)``), so that a warm-up or a tail that mixes worse shows.

Advice (``advise=True``, the default): when the share is under :data:`LOW_SHARE` or a tenth's
under :data:`LOW_TENTH_SHARE`, each setting that could raise it (``num_lanes``,
``shuffle_buffer``, ``shuffle_buffer_bytes``, ``record_counts`` when the lanes cannot be read
by size) is tried by inspecting again with that one change (payloads are dropped in the
workers, so a run is cheap), and those that help are reported with the figures they gave.
With explicit settings the defaults are inspected too, and a warning is given when they mix
better.

This module wires the stages together; the statistics are in :mod:`~shardmix.inspect.summary`,
the advice in :mod:`~shardmix.inspect.advice`, the report and its JSON in
:mod:`~shardmix.inspect.report`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from shardmix.errors import ConfigError
from shardmix.inspect.advice import Context
from shardmix.inspect.advice import advise as advise_run
from shardmix.inspect.mixture import inspect_mixture
from shardmix.inspect.reading import (
    LaneOf,
    inspect_dataset,
    provenance_of,
    rank_shards,
    record_run,
)
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

    ``seed`` seeds both the dataset's shard order and the loader's shuffle buffer;
    ``batches`` limits how many batches are read (default: all of epoch ``epoch``).
    ``record_counts`` is passed to the dataset, as a manifest would give them, and
    ``piece_records`` as the dataset takes it.
    ``label``: a field (``"cls"``) whose values are counted per batch and per tenth of the run
    beside the sources', against a random order of the same samples (the report's ``order``).
    ``compare`` also reads a plain DataLoader over the same shards (see the module docstring).
    ``advise`` tries the settings that could raise a low share of the ideal, and the defaults
    when settings are given (each an inspection of its own).

    A mixture: ``urls`` maps names to patterns, with ``weights`` (a weight per name; default
    equal) and ``stopping`` as :class:`~shardmix.MixingLoader` takes them; the report then
    has each dataset's part of every batch (:mod:`~shardmix.inspect.mixture`). ``compare``
    is for one dataset, and a mixture is not advised on.
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
    run = record_run(
        "MixingLoader",
        loader,
        LaneOf(plan, dataset.urls),
        lanes,
        settings,
        ideal=ideal,
        total=total,
        progress=progress,
    )
    baseline = None
    if compare:
        baseline = read_baseline(urls, settings, ideal, total, progress)
    advice = None
    if advise:
        sized = world_size > 1 or dataset.plan.piece_weights([p for lane in plan for p in lane], 1)
        context = Context(
            urls, given, settings, record_counts, len(dataset.urls), shards, inspect_batches
        )
        pieces = dataset.plan.spread_counts(world_size) is not None
        advice = advise_run(
            context,
            run.summary,
            run.judged_order,
            by_size=bool(sized),
            pieces=pieces,
            progress=progress,
        )
    return InspectReport(settings, len(dataset.urls), shards, run, baseline, advice)
