"""The loader's length: batches per epoch on this rank, and whether the current epoch goes on.

Counted from the record counts (the ranks' quota, or kept counts learned under a filter); a
resized phase's after the batches before it; a mixture's from each dataset's and the weights.
"""

from __future__ import annotations

from typing import Any

from shardmix.dataset import ShardDataset
from shardmix.epochs.contract import Cursor
from shardmix.epochs.options import LoaderOptions
from shardmix.errors import UnknownLengthError
from shardmix.plan.apportion import Stopping, mixture_batches
from shardmix.plan.sharding import rank_quota
from shardmix.world import count_exchange, job_count_exchange

# len() of an all_exhausted mixture counts each dataset's passes from the plans of up to
# this many passes (the last one's count repeats); exact while sizes do not change per pass.
_PLANNED_PASSES = 4


def in_epoch(options: LoaderOptions, cursor: Cursor) -> bool:
    """Whether the current epoch goes on: batches are left, the newest ``iter()`` reads
    it, and the user still holds that iterator (else the next epoch comes next)."""
    current = cursor.current
    if current is None or current.finished or cursor.current_iteration != cursor.iterations:
        return False
    if cursor.holder is None or cursor.holder() is None:
        return False
    if not current.sees_its_end():
        return current.batches == 0 or current.batches < batches_in(options, cursor, current.epoch)
    return True


def loader_length(options: LoaderOptions, cursor: Cursor) -> int:
    """Batches per epoch on this rank, from the record counts: exact without filtering, else
    an upper bound (the samples kept are known only once read)."""
    dataset = options.dataset
    if not isinstance(dataset, ShardDataset):
        raise UnknownLengthError(
            f"len() of a MixingLoader over a {type(dataset).__name__} is unknown: only a "
            "ShardDataset knows its record counts; wrap the shards in "
            "ShardDataset(urls, record_counts=...) or write them with a manifest "
            "(shardmix convert), or do without len()"
        )
    current = cursor.current
    epoch = current.epoch if current is not None and in_epoch(options, cursor) else cursor.epoch
    return batches_in(options, cursor, epoch)


def batches_left(options: LoaderOptions, cursor: Cursor) -> int:
    """Batches the epoch being read still yields on this rank, counted as ``len()`` counts."""
    current = cursor.current
    if current is None or cursor.current_iteration != cursor.iterations:
        return loader_length(options, cursor)
    if current.finished:  # its last batch is cut: nothing left until the next iter()
        return 0
    return max(0, batches_in(options, cursor, current.epoch) - current.batches)


def batches_in(options: LoaderOptions, cursor: Cursor, epoch: int) -> int:
    """Batches in ``epoch`` on this rank (see :func:`loader_length`)."""
    dataset = options.shard_dataset("len()")
    share_counts(options)
    if options.datasets is not None:
        return _mixture_len(options, epoch)
    phase = _phase(cursor, epoch)
    if phase:  # a resized phase: its batches after those before it
        before, samples = phase["batches"], phase["quota"]
    else:
        before, samples = 0, _samples(options, dataset, epoch)
    batches, rest = divmod(samples, options.batch_size)
    return before + batches + (1 if rest and not options.drop_last else 0)


def share_counts(options: LoaderOptions) -> None:
    """Under ``group`` or with ``canonical_ranks``, have each shard counted by one rank of the
    job, at the first ``iter()`` or ``len()`` (a collective); later calls share nothing."""
    _, world_size = options.rank_and_world_size()
    shared = job_count_exchange(world_size, options.ranks.group)
    if shared is None and options.canonical_ranks is not None:
        plain = count_exchange(world_size)
        shared = None if plain is None else (plain[0], world_size, plain[1])
    if shared is None:
        return
    rank, ranks, exchange = shared
    for dataset in options.members().values():
        if isinstance(dataset, ShardDataset):
            dataset.plan.record_counts.resolve_all(rank=rank, world_size=ranks, exchange=exchange)


def _phase(cursor: Cursor, epoch: int) -> dict[str, Any]:
    """The resized phase ``epoch`` runs in, or ``{}`` where it runs as planned."""
    if cursor.resume is not None and cursor.resume.get("epoch") == epoch:
        return dict(cursor.resume.get("phase") or {})
    current = cursor.current
    if current is not None and current.epoch == epoch:
        return cursor.phase or {}
    return {}


def _samples(options: LoaderOptions, dataset: ShardDataset, epoch: int, epoch_pass: int = 0) -> int:
    """The samples this rank (or each canonical rank) yields in one pass of ``epoch``."""
    rank, world_size = options.planning_world()
    totals = dataset.plan.kept_totals(epoch, world_size, epoch_pass)  # learned under a filter
    if totals is None:
        totals = dataset.plan.rank_totals(epoch, world_size, epoch_pass)
    return totals[rank] if world_size == 1 else rank_quota(totals, options.even_ranks, rank)


def _mixture_len(options: LoaderOptions, epoch: int) -> int:
    datasets = options.datasets or {}
    passes = 1 if options.stopping is Stopping.FIRST_EXHAUSTED else _PLANNED_PASSES
    totals = {
        name: [_samples(options, dataset, epoch, p) for p in range(passes)]
        for name, dataset in datasets.items()
    }
    weights = options.mixture_weights()
    return mixture_batches(totals, weights, options.batch_size, options.stopping, options.drop_last)
