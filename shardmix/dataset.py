"""ShardDataset: the shards of a URL pattern as a torch IterableDataset.

It owns the epoch plan (which shards each rank reads, dealt to lanes) and reading a lane.
Iterated directly, or by a plain DataLoader, each worker reads its lanes interleaved. Under
:class:`~shardmix.loader.MixingLoader` the loader asks for lanes one by one
(:meth:`ShardDataset.read_lane`) so that the mixing order does not depend on the workers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from torch.utils.data import IterableDataset

from shardmix import reader
from shardmix.counts import RecordCounts
from shardmix.decode import Decoder, as_decoder
from shardmix.errors import ConfigError
from shardmix.formats import Format, ReadOptions, TFRecordPayload, infer_format
from shardmix.policy import DamageHandler, ErrorPolicy, OnError, SkipLedger
from shardmix.reader import LanePosition, Sample, read_lane, round_robin
from shardmix.sharding import (
    World,
    deal_to_lanes,
    epoch_shard_order,
    rank_shards,
    worker_lanes,
)
from shardmix.sources import SourceOptions
from shardmix.transforms import SampleTransform, without_tombstones
from shardmix.urls import check_sources, expand_urls
from shardmix.world import detect_world

DEFAULT_NUM_LANES = 32


class ShardDataset(IterableDataset[Sample]):
    """Samples from tar or TFRecord shards named by a URL pattern.

    Args:
        urls: a pattern (``"data/train-{000000..000063}.tar"``, several joined by ``::``, a
            glob) or a list of them.
        format: ``"tar"`` or ``"tfrecord"``; inferred from each URL's extension when omitted.
        seed: seeds the per-epoch shard order.
        shuffle_shards: shuffle the shard order every epoch (from ``(seed, epoch)``).
        num_lanes: how many shards each rank reads at once. The sample order is defined over
            lanes, so it does not change with ``num_workers``; keep it at least the number of
            workers.
        transform: applied to every sample in the worker (decode images here). Returning
            ``None`` drops the sample, counted (``MixingLoader.filtered``); an exception is
            raised as :class:`TransformError` naming the shard, record and key (skipped and
            counted under ``on_error="skip"``). Provenance keys are kept even when the
            function drops them. It must be deterministic: a resume runs it again.
        transform_rng: call ``transform(sample, rng)`` with a ``numpy.random.Generator``
            seeded from ``(seed, epoch, pass, shard index, record index)``, for random
            augmentation that is reproducible and resumes exactly.
        decode: decode fields before ``transform`` (:mod:`shardmix.decode`): ``True`` for
            the webdataset conventions, an image mode (``"numpy"``, ``"pil"``, ``"torch"``),
            a :class:`~shardmix.decode.Decoder`, or any function of a sample.
        tfrecord_payload: ``"example"`` decodes ``tf.train.Example`` records, ``"raw"`` keeps
            each record's bytes under ``"record"``.
        max_record_bytes: a TFRecord length field above this is refused as damage.
        record_counts: records per shard URL, when known (a manifest); the others are counted
            when equal steps per rank need them.
        source_options: how remote shards are opened: fsspec ``storage_options`` (endpoint,
            credentials), retries and timeouts, a local ``cache_dir``, and ``allow_pipe`` for
            ``pipe:`` URLs (off: a URL list never runs a command unless asked to).
        on_error: ``"raise"`` (default): damage stops the epoch with an error naming the file,
            record and byte offset. ``"skip"``: a damaged record is left out (or, when the
            framing is lost, the rest of its shard), a :class:`SkippedDataWarning` names it
            once per shard, and everything skipped is counted (``MixingLoader.skipped``).
        max_skips: with ``on_error="skip"``, more skips than this raise
            :class:`TooManySkipsError` listing them all (``None``: no limit).
        max_member_bytes, max_inflated_bytes: a tar member, or a gzip shard's inflated
            stream, larger than this is refused as damage (no decompression bombs).
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        format: str | Format | None = None,
        seed: int = 0,
        shuffle_shards: bool = True,
        num_lanes: int = DEFAULT_NUM_LANES,
        transform: Callable[..., Sample | None] | None = None,
        transform_rng: bool = False,
        decode: bool | str | Decoder | Callable[[Sample], Sample] | None = None,
        tfrecord_payload: str | TFRecordPayload = TFRecordPayload.EXAMPLE,
        max_record_bytes: int = 1 << 30,
        record_counts: Mapping[str, int] | None = None,
        source_options: SourceOptions | None = None,
        on_error: str | OnError = OnError.RAISE,
        max_skips: int | None = 100,
        max_member_bytes: int = 1 << 30,
        max_inflated_bytes: int = 64 << 30,
    ) -> None:
        super().__init__()
        if num_lanes < 1:
            raise ConfigError(f"num_lanes must be at least 1, got {num_lanes}")
        self.urls = expand_urls(urls)
        self.source_options = source_options or SourceOptions()
        check_sources(self.urls, self.source_options)
        # A URL's index in ``urls`` (its first, if listed twice): how checkpoints name shards.
        self.shard_index = {url: i for i, url in reversed(list(enumerate(self.urls)))}
        forced = Format(format) if format is not None else None
        self._format_of = {url: forced or infer_format(url) for url in self.urls}
        self.seed = seed
        self.shuffle_shards = shuffle_shards
        self.num_lanes = num_lanes
        self.transform = transform
        self.sample_transform = SampleTransform(
            transform=transform,
            decode=_decoder(decode),
            rng=transform_rng,
            seed=seed,
        )
        self.options = ReadOptions(
            tfrecord_payload=TFRecordPayload(tfrecord_payload),
            max_record_bytes=max_record_bytes,
            max_member_bytes=max_member_bytes,
            max_inflated_bytes=max_inflated_bytes,
        )
        self.policy = ErrorPolicy(OnError(on_error), max_skips)
        # Counts what this copy of the dataset skipped (set per iteration; see ``skipped``).
        self.ledger: SkipLedger | None = None
        # What the last direct iteration dropped: {"filtered": n, "skipped": n}.
        self.dropped: Counter[str] = Counter()
        self.record_counts = RecordCounts(
            self.urls, self._format_of, self.options, record_counts, self.source_options
        )
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next time the dataset is iterated directly."""
        self.epoch = epoch

    def lane_shards(self, epoch: int, *, rank: int = 0, world_size: int = 1) -> list[list[int]]:
        """For each lane, the indices into ``self.urls`` it reads in ``epoch``, in order."""
        order = self._shard_order(epoch, world_size)
        return deal_to_lanes(rank_shards(order, rank=rank, world_size=world_size), self.num_lanes)

    def rank_totals(self, epoch: int, world_size: int) -> list[int]:
        """How many samples each rank reads in ``epoch`` (counting the shards if needed)."""
        order = self._shard_order(epoch, world_size)
        return [
            self.record_counts.total(rank_shards(order, rank=rank, world_size=world_size))
            for rank in range(world_size)
        ]

    def _shard_order(self, epoch: int, world_size: int) -> list[int]:
        if world_size > len(self.urls):
            raise ConfigError(
                f"{len(self.urls)} shards cannot be split over {world_size} ranks without "
                "reading some twice; write more shards (shardmix convert --max-records)"
            )
        return epoch_shard_order(
            len(self.urls), seed=self.seed, epoch=epoch, shuffle=self.shuffle_shards
        )

    def read_lane(
        self,
        lane: int,
        epoch: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        start: LanePosition = LanePosition(),
    ) -> Iterator[Sample]:
        """The samples of one lane of ``epoch`` on ``rank``, from ``start`` on."""
        shards = self.lane_shards(epoch, rank=rank, world_size=world_size)[lane]
        read = partial(self.read_shard, epoch=epoch)
        return read_lane([self.urls[i] for i in shards], read, start)

    def __iter__(self) -> Iterator[Sample]:
        world = detect_world()
        return self.iter_world(world, self.epoch)

    @property
    def skipped(self) -> dict[str, Any] | None:
        """What the last direct iteration skipped (``on_error="skip"``), as plain JSON."""
        return self.ledger.summary() if self.ledger is not None else None

    @property
    def filtered(self) -> int:
        """Samples the transform dropped (returned ``None``) in the last direct iteration."""
        return self.dropped["filtered"]

    def iter_world(self, world: World, epoch: int) -> Iterator[Sample]:
        """The samples that ``world``'s worker reads in ``epoch``, its lanes interleaved."""
        if self.policy.skips:
            self.ledger = SkipLedger.for_policy(self.policy)
        self.dropped = Counter()
        lanes = worker_lanes(
            num_lanes=self.num_lanes, worker=world.worker, num_workers=world.num_workers
        )
        plan = self.lane_shards(epoch, rank=world.rank, world_size=world.world_size)
        read = partial(self.read_shard, epoch=epoch)
        lane_samples = [read_lane([self.urls[i] for i in plan[lane]], read) for lane in lanes]
        return without_tombstones(round_robin(lane_samples), self._count_dropped)

    def _count_dropped(self, kind: str) -> None:
        self.dropped[kind] += 1

    def read_shard(
        self,
        url: str,
        start: int = 0,
        before_offset: int = -1,
        *,
        epoch: int = 0,
        on_damage: DamageHandler | None = None,
    ) -> Iterator[Sample]:
        """The samples of shard ``url`` in ``epoch`` from record ``start`` on, transformed.

        ``before_offset``: where record ``start - 1`` begins, when known (a lane's resume
        position): reading starts there instead of walking the shard from its start.

        Damage is raised, or with ``on_error="skip"`` reported to ``on_damage`` (default: this
        dataset's ledger) and left out. A sample the transform drops or fails on (skipped)
        leaves a tombstone (:mod:`shardmix.transforms`).
        """
        if self.policy.skips and on_damage is None:
            on_damage = self.ledger
        samples = reader.read_shard(
            url,
            self._format_of[url],
            start=start,
            options=self.options,
            source_options=self.source_options,
            on_damage=on_damage if self.policy.skips else None,
            before_offset=before_offset,
        )
        return self._transformed(samples, url, epoch, on_damage)

    def read_records(
        self,
        url: str,
        positions: Sequence[tuple[int, int]],
        *,
        epoch: int = 0,
        on_damage: DamageHandler | None = None,
    ) -> Iterator[Sample]:
        """The samples at the ``(record, byte offset)`` pairs of shard ``url``, transformed.

        Each is read by seeking to its offset (by walking the framing on gzip shards and
        streams that cannot seek): how a checkpoint's shuffle buffer is restored.
        """
        samples = reader.read_shard_at(
            url,
            self._format_of[url],
            positions,
            options=self.options,
            source_options=self.source_options,
            on_damage=on_damage if self.policy.skips else None,
        )
        return self._transformed(samples, url, epoch, on_damage)

    def _transformed(
        self, samples: Iterator[Sample], url: str, epoch: int, on_damage: DamageHandler | None
    ) -> Iterator[Sample]:
        if not self.sample_transform.active:
            return samples
        return self.sample_transform.apply(
            samples,
            epoch=epoch,
            shard_index=self.shard_index[url],
            on_damage=on_damage if self.policy.skips else None,
        )

    def __repr__(self) -> str:
        return (
            f"ShardDataset({len(self.urls)} shards, seed={self.seed}, "
            f"shuffle_shards={self.shuffle_shards}, num_lanes={self.num_lanes})"
        )


def _decoder(
    decode: bool | str | Decoder | Callable[[Sample], Sample] | None,
) -> Callable[[Sample], Sample] | None:
    if callable(decode) and not isinstance(decode, Decoder):
        return decode
    return as_decoder(decode)
