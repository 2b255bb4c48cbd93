"""ShardDataset: the shards of a URL pattern as a torch IterableDataset.

It owns the epoch plan (which pieces of which shards each rank reads, dealt to lanes) and
reading a lane.
Iterated directly, or by a plain DataLoader, each worker reads its lanes interleaved. Under
:class:`~shardmix.loader.MixingLoader` the loader asks for lanes one by one
(:meth:`ShardDataset.read_lane`) so that the mixing order does not depend on the workers.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from torch.utils.data import IterableDataset

from shardmix import reader
from shardmix.arguments import check_not_empty, given_counts, refuse_arguments
from shardmix.claims import CountCheck
from shardmix.counts import COUNTS_CACHE_NAME, RecordCounts
from shardmix.decode import Decoder, as_decoder
from shardmix.errors import ConfigError
from shardmix.formats import (
    BlockReader,
    Format,
    ReadOptions,
    RecordBlock,
    TFRecordPayload,
    infer_format,
    is_gzipped,
    reader_for,
)
from shardmix.formats.tags import NO_TAG
from shardmix.kept import KeptCounts, kept_cache_path
from shardmix.lanes import LanePosition, read_lane, round_robin
from shardmix.policy import DamageHandler, ErrorPolicy, OnError, SkipLedger
from shardmix.reader import Sample
from shardmix.recount import Exchange, ReadVersions, recount_changed
from shardmix.sharding import (
    Piece,
    World,
    balanced_pieces,
    deal_balanced,
    deal_to_lanes,
    default_num_lanes,
    epoch_shard_order,
    whole_shards,
    worker_lanes,
)
from shardmix.sources import SourceOptions, is_local, local_path, readahead, scheme_of
from shardmix.sources.identity import ShardIdentity
from shardmix.transforms import SampleTransform, without_tags, without_tombstones
from shardmix.urls import check_sources, expand_urls
from shardmix.world import count_exchange, detect_world

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
        transform_id: a name for ``transform`` that changes whenever which records it drops
            changes. With it, an epoch read whole teaches the dataset which records each
            shard keeps (:mod:`shardmix.kept`, kept beside the count cache): ``len()`` is then
            exact under a filter, and ranks know the epoch's end ahead. Not with
            ``transform_rng=True`` (its drops may differ per epoch) or ``on_error="skip"``.
        decode: decode fields before ``transform`` (:mod:`shardmix.decode`): ``True`` for
            the webdataset conventions, an image mode (``"numpy"``, ``"pil"``, ``"torch"``),
            a :class:`~shardmix.decode.Decoder`, or any function of a sample.
        tfrecord_payload: ``"example"`` decodes ``tf.train.Example`` records, ``"raw"`` keeps
            each record's bytes under ``"record"``.
        max_record_bytes: a TFRecord length field above this is refused as damage.
        record_counts: records per shard URL, when known (a manifest), or a list of counts in
            the order of the expanded URLs (one per shard); the others are counted
            when a plan for several ranks needs them (once per job: the ranks split the
            counting and share the counts).
        counts_cache: a JSON file where counted shards are kept for later jobs, each entry
            used only while the shard's size and modification time (or ETag) are unchanged;
            default ``record-counts.json`` in ``source_options.cache_dir`` when that is set,
            else none. The data folder itself is never written.
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
        max_decoded_bytes: a ``tf.train.Example`` that would decode to more than this (its
            size read from the wire first) is damage, a :class:`DecodedSizeError`.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        format: str | Format | None = None,
        seed: int = 0,
        shuffle_shards: bool = True,
        num_lanes: int | None = None,
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
        super().__init__()
        refuse_arguments(unknown)
        if num_lanes is not None and num_lanes < 1:
            raise ConfigError(f"num_lanes must be at least 1, got {num_lanes}")
        self.urls = expand_urls(urls)
        self.source_options = source_options or SourceOptions()
        check_sources(self.urls, self.source_options)
        # A URL's index in ``urls`` (its first, if listed twice): how checkpoints name shards.
        self.shard_index = {url: i for i, url in reversed(list(enumerate(self.urls)))}
        forced = Format(format) if format is not None else None
        self._format_of = {url: forced or infer_format(url) for url in self.urls}
        check_not_empty(self._format_of)
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
            max_decoded_bytes=max_decoded_bytes,
        )
        self.policy = ErrorPolicy(OnError(on_error), max_skips)
        # Counts what this copy of the dataset skipped (set per iteration; see ``skipped``).
        self.ledger: SkipLedger | None = None
        # What the counting pass skipped: shards cut short by damage, warned about there once.
        self.counting_ledger = SkipLedger.for_policy(self.policy) if self.policy.skips else None
        # What the last direct iteration dropped: {"filtered": n, "skipped": n}.
        self.dropped: Counter[str] = Counter()
        # By shard index: the identities a read of a shard must find (a checkpoint's, set per
        # epoch), and those this copy's reads found since :meth:`take_opened`.
        self.expected: Mapping[int, ShardIdentity] = {}
        self.opened: dict[int, ShardIdentity] = {}
        # What this process's epochs read of each shard, which the next epoch's start checks.
        self.read_versions = ReadVersions()
        if counts_cache is None and self.source_options.cache_dir is not None:
            counts_cache = os.path.join(self.source_options.cache_dir, COUNTS_CACHE_NAME)
        self.record_counts = RecordCounts(
            self.urls,
            self._format_of,
            self.options,
            given_counts(record_counts, self.urls),
            self.source_options,
            cache_path=None if counts_cache is None else os.fspath(counts_cache),
            on_damage=self.counting_ledger,
        )
        self.kept_counts = _kept_counts(
            transform_id,
            transform,
            transform_rng,
            self.policy,
            self.urls,
            self.source_options,
            None if counts_cache is None else os.fspath(counts_cache),
        )
        self._plan: tuple[tuple[int, int, int], list[list[Piece]]] | None = None  # the last plan
        self.epoch = 0
        # The shards' sizes as the mixer weighs lanes: found once, on first use (see below).
        self._weights: tuple[str, dict[str, float]] | None = None
        self._weights_found = False

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next time the dataset is iterated directly."""
        self.epoch = epoch

    def lanes_for(self, batch_size: int | None, world_size: int = 1) -> int:
        """The number of lanes: ``num_lanes`` when given, else from the batch size.

        See :func:`~shardmix.sharding.default_num_lanes`; without a batch size (direct
        iteration, a plain DataLoader) the default is 32.
        """
        if self.num_lanes is not None:
            return self.num_lanes
        if batch_size is None:
            return DEFAULT_NUM_LANES
        shards_per_rank = max(1, len(self.urls) // max(1, world_size))
        return default_num_lanes(batch_size=batch_size, shards_per_rank=shards_per_rank)

    def rank_pieces(self, epoch: int, world_size: int, epoch_pass: int = 0) -> list[list[Piece]]:
        """Each rank's pieces in ``epoch``: the epoch's plan (:mod:`shardmix.sharding`).

        One rank reads every shard whole, in the epoch's order. Several ranks get a balanced
        plan, made from every shard's record count (:meth:`shard_counts`).
        """
        key = (epoch, world_size, epoch_pass)
        if self._plan is not None and self._plan[0] == key:
            return self._plan[1]
        order = epoch_shard_order(
            len(self.urls),
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle_shards,
            epoch_pass=epoch_pass,
        )
        if world_size == 1:
            plan = [whole_shards(order)]
        else:
            plan = balanced_pieces(self.shard_counts(world_size), order, world_size)
        self._plan = key, plan
        return plan

    def recount_changed(
        self, epoch: int, rank: int, world_size: int, exchange: Exchange | None
    ) -> list[int]:
        """At the start of a new epoch (not a restore): count again each shard that changed
        since this process last read it, so that the epoch is planned from its new count
        (:mod:`shardmix.recount`); the indices of the shards found changed. A collective under
        ``exchange``."""
        changed = recount_changed(
            self.urls,
            self.record_counts,
            self.read_versions,
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            exchange=exchange,
            kept=self.kept_counts,
        )
        if changed:  # plans and lane weights made from the old counts or sizes are made again
            self._plan = None
            self._weights, self._weights_found = None, False
        return changed

    def shard_counts(self, world_size: int = 1) -> list[int]:
        """Every shard's record count, in URL order, found once per job.

        Under torch.distributed with ``world_size`` ranks, called in the main process of
        every rank at the same point (the first epoch, or ``len()``), each shard is counted
        by one rank and the counts are shared; elsewhere this process counts what no
        manifest or count cache has.
        """
        shared = count_exchange(world_size)
        if shared is None:
            return self.record_counts.resolve_all()
        rank, exchange = shared
        return self.record_counts.resolve_all(rank=rank, world_size=world_size, exchange=exchange)

    def lane_pieces(
        self,
        epoch: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        num_lanes: int | None = None,
        epoch_pass: int = 0,
    ) -> list[list[Piece]]:
        """For each lane, the pieces it reads in ``epoch`` on ``rank``, in order.

        With sizes known (:meth:`piece_weights`), pieces are dealt so that lanes hold about
        the same size; else like cards.
        """
        pieces = self.rank_pieces(epoch, world_size, epoch_pass)[rank]
        lanes = num_lanes or self.lanes_for(None, world_size)
        weights = self.piece_weights(pieces, world_size)
        if weights is None:
            return deal_to_lanes(pieces, lanes)
        return deal_balanced(pieces, weights[1], lanes)

    def lane_shards(
        self, epoch: int, *, rank: int = 0, world_size: int = 1, num_lanes: int | None = None
    ) -> list[list[int]]:
        """For each lane, the indices into ``self.urls`` of the shards its pieces are of."""
        lanes = self.lane_pieces(epoch, rank=rank, world_size=world_size, num_lanes=num_lanes)
        return [[piece.shard for piece in lane] for lane in lanes]

    def piece_weights(
        self, pieces: Sequence[Piece], world_size: int
    ) -> tuple[str, list[float]] | None:
        """``(unit, size of each piece)`` when the sizes are known, else None.

        Records under several ranks (the plan counted every shard) or when every shard's count
        is given or in a manifest; else bytes when every shard is a local, uncompressed file
        (one rank reads whole shards: a piece's size is its file's); else unknown. The mixer
        then takes samples from the lanes in proportion to these sizes, so that all lanes end
        together. A function of the data and the world size alone.
        """
        if world_size > 1:
            counts = self.shard_counts(world_size)
            return "records", [float(piece.size(counts)) for piece in pieces]
        if not self._weights_found:
            self._weights = _known_weights(self.urls, self.record_counts)
            self._weights_found = True
        known = self._weights
        if known is None:
            return None
        unit, by_url = known
        return unit, [by_url[self.urls[piece.shard]] for piece in pieces]

    def rank_totals(self, epoch: int, world_size: int, epoch_pass: int = 0) -> list[int]:
        """How many samples each rank reads in ``epoch`` (counting the shards if needed)."""
        plan = self.rank_pieces(epoch, world_size, epoch_pass)
        if world_size == 1:
            return [self.record_counts.total(range(len(self.urls)))]
        counts = self.shard_counts(world_size)
        return [sum(piece.size(counts) for piece in pieces) for pieces in plan]

    def kept_totals(self, epoch: int, world_size: int, epoch_pass: int = 0) -> list[int] | None:
        """How many samples each rank keeps in ``epoch`` under the filter, when every shard's
        kept count was learned (:mod:`shardmix.kept`); else None."""
        if self.kept_counts is None:
            return None
        plan = self.rank_pieces(epoch, world_size, epoch_pass)
        return self.kept_counts.totals(plan, self.shard_counts(world_size))

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
        pieces = self.lane_pieces(epoch, rank=rank, world_size=world_size)[lane]
        return self.read_lane_pieces(pieces, epoch, start)

    def read_lane_pieces(
        self,
        pieces: Sequence[Piece],
        epoch: int,
        start: LanePosition = LanePosition(),
        epoch_pass: int = 0,
    ) -> Iterator[Sample]:
        """The samples of a lane that reads ``pieces`` in ``epoch``, from ``start`` on."""
        read = partial(self.read_piece, epoch=epoch, epoch_pass=epoch_pass)
        return read_lane(pieces, read, start, self._ahead())

    @property
    def reads_blocks(self) -> bool:
        """Whether lanes can be read in record blocks (:meth:`read_lane_blocks`): no decoder
        or transform needs a dict per sample, and every shard's reader gives blocks."""
        if self.sample_transform.active:
            return False
        formats = set(self._format_of.values())
        return all(isinstance(reader_for(fmt, self.options), BlockReader) for fmt in formats)

    def read_lane_blocks(
        self, pieces: Sequence[Piece], start: LanePosition = LanePosition()
    ) -> Iterator[RecordBlock]:
        """The records :meth:`read_lane_pieces` gives, in record blocks (see
        :attr:`reads_blocks`; with no transform, the epoch changes nothing in them)."""
        return read_lane(pieces, self.read_piece_blocks, start, self._ahead())

    def _ahead(self) -> Callable[[Piece, Piece | None], None] | None:
        """What tells read-ahead which shard a lane reads next (None: no read-ahead)."""
        options = self.source_options
        if options.read_ahead is None:
            return None
        urls = self.urls

        def ahead(piece: Piece, following: Piece | None) -> None:
            url = urls[piece.shard]
            if scheme_of(url) not in ("http", "https"):
                return
            if following is None:
                readahead.forget(url)
            elif options.cache_limit is not None and _has_copy(options, urls[following.shard]):
                readahead.follow(url, None, options)  # the next one is read from its copy
            else:
                readahead.follow(url, urls[following.shard], options)

        return ahead

    def read_piece_blocks(
        self, piece: Piece, record: int, before_offset: int = -1, before_tag: int = NO_TAG
    ) -> Iterator[RecordBlock]:
        """The records :meth:`read_piece` gives, in record blocks."""
        url = self.urls[piece.shard]
        check = self._count_check(url, record, piece.stop, self.ledger)
        on_damage = self.ledger if check is None else check.on_damage
        arguments = self._read_arguments(url, record, before_offset, piece.stop, on_damage)
        arguments["before_tag"] = before_tag
        blocks = reader.read_shard_blocks(url, self._format_of[url], **arguments)
        return blocks if check is None else check.blocks(blocks)

    def _count_check(
        self, url: str, start: int, stop: int | None, on_damage: DamageHandler | None
    ) -> CountCheck | None:
        """What checks a read of ``url`` against its record count, when the count is known."""
        claim = self.record_counts.claim(url)
        if claim is None:
            return None
        return CountCheck(url, claim, start, stop, on_damage if self.policy.skips else None)

    def take_opened(self) -> dict[int, ShardIdentity]:
        """The identities of the shards read since the last call, by shard index."""
        opened, self.opened = self.opened, {}
        return opened

    def _note_opened(self, shard: int, identity: ShardIdentity | None) -> None:
        if identity is not None:
            self.opened[shard] = identity

    def _read_arguments(
        self,
        url: str,
        start: int,
        before_offset: int,
        stop: int | None,
        on_damage: DamageHandler | None,
    ) -> dict[str, Any]:
        """What a read of records ``[start, stop)`` of ``url`` passes the reader module."""
        shard = self.shard_index[url]
        return {
            "expect": self.expected.get(shard),
            "on_open": partial(self._note_opened, shard),
            "start": start,
            "stop": stop,
            "seek_from": self.record_counts.seek_from(url, start),
            "options": self.options,
            "source_options": self.source_options,
            "on_damage": on_damage if self.policy.skips else None,
            "before_offset": before_offset,
            "listed": self._listed(url),
        }

    def _listed(self, url: str) -> tuple[int, str | None] | None:
        """The size and sha256 the manifest gives ``url``, which a cached copy must have."""
        if self.source_options.cache_dir is None:
            return None
        entry = self.record_counts.manifests.entry(url, fetch=False)
        return None if entry is None else (entry.bytes, entry.sha256)

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
            self.ledger = SkipLedger.for_policy(self.policy, reported=self.record_counts.damaged)
        self.dropped = Counter()
        num_lanes = self.lanes_for(None, world.world_size)
        lanes = worker_lanes(
            num_lanes=num_lanes, worker=world.worker, num_workers=world.num_workers
        )
        plan = self.lane_pieces(
            epoch, rank=world.rank, world_size=world.world_size, num_lanes=num_lanes
        )
        read = partial(self.read_piece, epoch=epoch)
        lane_samples = [read_lane(plan[lane], read) for lane in lanes]
        samples = without_tombstones(round_robin(lane_samples), self._count_dropped)
        return without_tags(samples)

    def _count_dropped(self, kind: str) -> None:
        self.dropped[kind] += 1

    def read_piece(
        self,
        piece: Piece,
        record: int,
        before_offset: int = -1,
        before_tag: int = NO_TAG,
        *,
        epoch: int = 0,
        epoch_pass: int = 0,
    ) -> Iterator[Sample]:
        """The samples of ``piece`` in ``epoch`` from record ``record`` (in its shard) on;
        ``before_offset`` and ``before_tag``: see :meth:`read_shard`."""
        url = self.urls[piece.shard]
        return self.read_shard(
            url,
            record,
            before_offset,
            stop=piece.stop,
            epoch=epoch,
            epoch_pass=epoch_pass,
            before_tag=before_tag,
        )

    def read_shard(
        self,
        url: str,
        start: int = 0,
        before_offset: int = -1,
        *,
        stop: int | None = None,
        epoch: int = 0,
        epoch_pass: int = 0,
        on_damage: DamageHandler | None = None,
        before_tag: int = NO_TAG,
    ) -> Iterator[Sample]:
        """The samples of records ``[start, stop)`` of shard ``url`` in ``epoch``, transformed.

        ``stop`` None reads to the shard's end. ``before_offset``: where record ``start - 1``
        begins, when known (a lane's resume position): reading starts there instead of walking
        the shard from its start; ``before_tag``, when not 0, the tag that record has there
        (another is a ConfigError: :func:`~shardmix.reader.check_resumed`). Else a read from
        ``start`` > 0 enters the shard at the nearest entry of its sparse offset index, when the
        counting pass made one. Each sample carries its record's tag under ``__tag__``
        (:mod:`shardmix.formats.tags`), which the loader's batches leave out.

        Damage is raised, or with ``on_error="skip"`` reported to ``on_damage`` (default: this
        dataset's ledger) and left out. A sample the transform drops or fails on (skipped)
        leaves a tombstone (:mod:`shardmix.transforms`).
        """
        if self.policy.skips and on_damage is None:
            on_damage = self.ledger
        check = self._count_check(url, start, stop, on_damage)
        read_damage = on_damage if check is None else check.on_damage
        arguments = self._read_arguments(url, start, before_offset, stop, read_damage)
        arguments["before_tag"] = before_tag
        samples = reader.read_shard(url, self._format_of[url], **arguments)
        if check is not None:
            samples = check.samples(samples)
        return self._transformed(samples, url, epoch, on_damage, epoch_pass)

    def read_records(
        self,
        url: str,
        positions: Sequence[tuple[int, int]],
        *,
        epoch: int = 0,
        epoch_pass: int = 0,
        on_damage: DamageHandler | None = None,
        longest_record: int | None = None,
    ) -> Iterator[Sample]:
        """The samples at the ``(record, byte offset)`` pairs of shard ``url``, transformed.

        Each is read by seeking to its offset (by walking the framing on gzip shards and
        streams that cannot seek): how a checkpoint's shuffle buffer is restored.
        ``longest_record``: see :func:`~shardmix.reader.record_ranges`.
        """
        samples = reader.read_shard_at(
            url,
            self._format_of[url],
            positions,
            options=self.options,
            source_options=self.source_options,
            on_damage=on_damage if self.policy.skips else None,
            longest_record=longest_record,
            expect=self.expected.get(self.shard_index[url]),
        )
        return self._transformed(samples, url, epoch, on_damage, epoch_pass)

    def _transformed(
        self,
        samples: Iterator[Sample],
        url: str,
        epoch: int,
        on_damage: DamageHandler | None,
        epoch_pass: int = 0,
    ) -> Iterator[Sample]:
        if not self.sample_transform.active:
            return samples
        return self.sample_transform.apply(
            samples,
            epoch=epoch,
            epoch_pass=epoch_pass,
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


def _has_copy(options: SourceOptions, url: str) -> bool:
    from shardmix.sources.bounded import has_copy

    return options.cache_dir is not None and has_copy(options.cache_dir, url)


def _known_weights(
    urls: Sequence[str], counts: RecordCounts
) -> tuple[str, dict[str, float]] | None:
    known = {url: counts.known(url) for url in urls}
    if all(count is not None for count in known.values()):
        return "records", {url: float(count or 0) for url, count in known.items()}
    if all(is_local(url) and not is_gzipped(url) for url in urls):
        return "bytes", {url: float(os.path.getsize(local_path(url))) for url in urls}
    return None


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
