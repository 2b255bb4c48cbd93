"""ShardDataset: the shards of a URL pattern as a torch IterableDataset, what users build.

It checks the user's arguments into the plan it holds (``plan``, a
:class:`~shardmix.reading.shardplan.ShardPlan`) and the reads of that plan (``reads``, a
:class:`~shardmix.reading.shardreads.ShardReads`). Iterated directly, or by a plain DataLoader,
each worker reads its lanes interleaved; under :class:`~shardmix.loader.MixingLoader` the
trainer merges the lanes in one fixed order, whatever the workers.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from torch.utils.data import IterableDataset

from shardmix.errors import ConfigError
from shardmix.formats import Format, ReadOptions, TFRecordPayload, infer_format
from shardmix.plan.arguments import check_not_empty, given_counts, refuse_arguments
from shardmix.plan.counts import COUNTS_CACHE_NAME, RecordCounts
from shardmix.plan.kept import KeptCounts, kept_cache_path
from shardmix.plan.manifests import warn_missing_listed
from shardmix.plan.sharding import DEFAULT_PIECE_RECORDS, World, worker_lanes
from shardmix.plan.urls import check_sources, expand_urls
from shardmix.policy import ErrorPolicy, OnError, SkipLedger
from shardmix.reading.decode import Decoder, as_decoder
from shardmix.reading.lanes import read_lane, round_robin
from shardmix.reading.reader import Sample
from shardmix.reading.shardplan import DEFAULT_NUM_LANES, ShardPlan
from shardmix.reading.shardreads import ShardReads
from shardmix.reading.transforms import SampleTransform, samples_as_returned, without_tombstones
from shardmix.sources import SourceOptions
from shardmix.sources.version import forget_versions
from shardmix.world import detect_world

__all__ = ["DEFAULT_NUM_LANES", "ShardDataset"]


class ShardDataset(IterableDataset[Sample]):
    """Samples from tar or TFRecord shards named by a URL pattern.

    Args:
        urls: a pattern (``"data/train-{000000..000063}.tar"``, ``::``-joined, a glob) or a
            list of them.
        format: ``"tar"`` or ``"tfrecord"`` (default: from each URL's extension).
        seed, shuffle_shards: shuffle the shard order every epoch, from ``(seed, epoch)``.
        num_lanes: shards each rank reads at once (the sample order is defined over lanes, not
            workers); keep it at least the number of workers.
        piece_records: records per piece: a shard's pieces are dealt over the lanes and the
            epoch (``None``: whole shards; shards without a record count are read whole;
            docs/epochs.md).
        transform: applied to every sample in the worker, deterministic (a resume runs it
            again); ``None`` drops the sample (counted), an exception is a
            :class:`TransformError` naming the shard, record and key.
        transform_rng: call ``transform(sample, rng)`` with a ``numpy.random.Generator``
            seeded from ``(seed, epoch, pass, shard index, record index)``.
        transform_id: names ``transform`` (change it when what it drops changes), so that an
            epoch read whole learns each shard's kept counts and ``len()`` is exact under a
            filter (docs/epochs.md). Not with ``transform_rng=True`` or ``on_error="skip"``.
        decode: decode fields before ``transform``: ``True`` (webdataset conventions), an
            image mode (``"numpy"``, ``"pil"``, ``"torch"``), a :class:`Decoder`, or a function.
        tfrecord_payload: ``"example"`` decodes ``tf.train.Example`` records, ``"raw"`` keeps
            each record's bytes under ``"record"``.
        record_counts: records per shard URL (a manifest), or a list in the expanded URLs'
            order; the others are counted when a plan for several ranks needs them.
        counts_cache: a JSON file keeping counted shards for later jobs (while a shard's size
            and mtime or ETag hold); default ``record-counts.json`` in ``source_options.cache_dir``.
        source_options: how shards are opened: fsspec ``storage_options``, retries and
            timeouts, a local ``cache_dir``, and ``allow_pipe`` for ``pipe:`` URLs.
        on_error: ``"raise"`` (default): damage stops the epoch with an error naming the file,
            record and byte offset; ``"skip"``: the damaged record (or the rest of its shard
            when the framing is lost) is left out, warned once per shard and counted.
        max_skips: with ``on_error="skip"``, more skips raise :class:`TooManySkipsError`
            (``None``: no limit).
        max_record_bytes, max_member_bytes, max_inflated_bytes, max_decoded_bytes: a TFRecord
            record, tar member, gzip shard's inflated stream or decoded ``tf.train.Example``
            larger than this is refused as damage.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        format: str | Format | None = None,
        seed: int = 0,
        shuffle_shards: bool = True,
        num_lanes: int | None = None,
        piece_records: int | None = DEFAULT_PIECE_RECORDS,
        transform: Callable[..., Sample | None] | None = None,
        transform_rng: bool = False,
        transform_id: str | None = None,
        decode: bool | str | Decoder | Callable[[Sample], Sample] | None = None,
        tfrecord_payload: str | TFRecordPayload = TFRecordPayload.EXAMPLE,
        max_record_bytes: int = 1 << 30,
        record_counts: Mapping[str, int] | Sequence[int] | None = None,
        counts_cache: str | os.PathLike[str] | None = None,
        source_options: SourceOptions | None = None,
        on_error: str | OnError = OnError.RAISE,
        max_skips: int | None = 100,
        max_member_bytes: int = 1 << 30,
        max_inflated_bytes: int = 64 << 30,
        max_decoded_bytes: int = 256 << 20,
        **unknown: Any,
    ) -> None:
        refuse_arguments(unknown)
        if num_lanes is not None and num_lanes < 1:
            raise ConfigError(f"num_lanes must be at least 1, got {num_lanes}")
        if piece_records is not None and piece_records < 1:
            raise ConfigError(
                f"piece_records must be at least 1 (or None: whole shards), got {piece_records}"
            )
        sources = source_options or SourceOptions()
        expanded = expand_urls(urls, sources)
        check_sources(expanded, sources)
        warn_missing_listed(urls)
        forced = Format(format) if format is not None else None
        format_of = {url: forced or infer_format(url) for url in expanded}
        check_not_empty(format_of)
        options = ReadOptions(
            tfrecord_payload=TFRecordPayload(tfrecord_payload),
            max_record_bytes=max_record_bytes,
            max_member_bytes=max_member_bytes,
            max_inflated_bytes=max_inflated_bytes,
            max_decoded_bytes=max_decoded_bytes,
        )
        policy = ErrorPolicy(OnError(on_error), max_skips)
        # What the counting pass skipped: shards cut short by damage, warned about there once.
        counting_ledger = SkipLedger.for_policy(policy) if policy.skips else None
        if counts_cache is None and sources.cache_dir is not None:
            counts_cache = os.path.join(sources.cache_dir, COUNTS_CACHE_NAME)
        cache_path = None if counts_cache is None else os.fspath(counts_cache)
        self.plan = ShardPlan(
            expanded,
            RecordCounts(
                expanded,
                format_of,
                options,
                given_counts(record_counts, expanded),
                sources,
                cache_path=cache_path,
                on_damage=counting_ledger,
            ),
            _kept_counts(
                transform_id, transform, transform_rng, policy, expanded, sources, cache_path
            ),
            seed=seed,
            shuffle_shards=shuffle_shards,
            num_lanes=num_lanes,
            piece_records=piece_records,
        )
        self.reads = ShardReads(
            self.plan,
            format_of=format_of,
            options=options,
            source_options=sources,
            policy=policy,
            sample_transform=SampleTransform(
                transform=transform, decode=_decoder(decode), rng=transform_rng, seed=seed
            ),
        )
        self.counting_ledger = counting_ledger
        self.epoch = 0
        # What the last direct iteration dropped: {"filtered": n, "skipped": n}.
        self.dropped: Counter[str] = Counter()

    @property
    def urls(self) -> list[str]:
        """The shards' URLs, the pattern expanded: a shard's index in checkpoints is its place."""
        return self.plan.urls

    # The constructor's plan settings, read back as given.
    seed = property(lambda self: self.plan.seed, doc="The seed of the shards' order per epoch.")
    shuffle_shards = property(lambda self: self.plan.shuffle_shards, doc="Shards shuffled.")
    num_lanes = property(lambda self: self.plan.num_lanes, doc="Lanes asked for (None: default).")
    piece_records = property(lambda self: self.plan.piece_records, doc="Records per piece.")

    @property
    def transform(self) -> Callable[..., Sample | None] | None:
        """The user's transform (None: samples are kept as read, or only decoded)."""
        return self.reads.transform

    @property
    def skipped(self) -> dict[str, Any] | None:
        """What the last direct iteration skipped (``on_error="skip"``), as plain JSON."""
        ledger = self.reads.ledger
        return ledger.summary() if ledger is not None else None

    @property
    def filtered(self) -> int:
        """Samples the transform dropped (returned ``None``) in the last direct iteration."""
        return self.dropped["filtered"]

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next time the dataset is iterated directly."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[Sample]:
        return self.iter_world(detect_world(), self.epoch)

    def iter_world(self, world: World, epoch: int) -> Iterator[Any]:
        """The samples that ``world``'s worker reads in ``epoch``, its lanes interleaved."""
        forget_versions()  # each iteration looks at the shards' versions again
        plan, reads = self.plan, self.reads
        if reads.policy.skips:
            reads.ledger = SkipLedger.for_policy(reads.policy, reported=plan.record_counts.damaged)
        self.dropped = Counter()
        num_lanes = plan.lanes_for(None, world.world_size)
        lanes = worker_lanes(
            num_lanes=num_lanes, worker=world.worker, num_workers=world.num_workers
        )
        pieces = plan.lane_pieces(
            epoch, rank=world.rank, world_size=world.world_size, num_lanes=num_lanes
        )
        read = partial(reads.read_piece, epoch=epoch)
        lane_samples = [read_lane(pieces[lane], read) for lane in lanes]
        samples = without_tombstones(round_robin(lane_samples), self._count_dropped)
        return samples_as_returned(samples)

    def _count_dropped(self, kind: str) -> None:
        self.dropped[kind] += 1

    def __repr__(self) -> str:
        plan = self.plan
        return (
            f"ShardDataset({len(plan.urls)} shards, seed={plan.seed}, "
            f"shuffle_shards={plan.shuffle_shards}, num_lanes={plan.num_lanes}, "
            f"piece_records={plan.piece_records})"
        )


def _decoder(
    decode: bool | str | Decoder | Callable[[Sample], Sample] | None,
) -> Callable[[Sample], Sample] | None:
    if callable(decode) and not isinstance(decode, Decoder):
        return decode
    return as_decoder(decode)


def _kept_counts(
    transform_id: str | None,
    transform: Callable[..., Sample | None] | None,
    transform_rng: bool,
    policy: ErrorPolicy,
    urls: Sequence[str],
    source_options: SourceOptions,
    counts_cache: str | None,
) -> KeptCounts | None:
    """The kept counts of a named transform (None without ``transform_id``), its use checked."""
    if transform_id is None:
        return None
    if not isinstance(transform_id, str) or not transform_id:
        raise ConfigError(f"transform_id must be a non-empty string, got {transform_id!r}")
    if transform is None:
        raise ConfigError(f"transform_id={transform_id!r} names no transform: pass transform= too")
    if transform_rng:
        raise ConfigError(
            f"transform_id={transform_id!r} with transform_rng=True: a transform that draws "
            "random numbers may drop other records in other epochs, so what it keeps cannot be "
            "learned; drop transform_id (len() is then an upper bound under a filter)"
        )
    if policy.skips:
        raise ConfigError(
            f"transform_id={transform_id!r} with on_error='skip': skipped damage changes what "
            "an epoch keeps, so kept counts are not learned; drop one of the two"
        )
    return KeptCounts(transform_id, urls, kept_cache_path(counts_cache), source_options)
