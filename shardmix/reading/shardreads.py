"""ShardReads: what a worker needs to read its lanes' pieces (held by a ShardDataset as ``reads``).

It owns the settings a read is made with (formats, read and source options, error policy, the
sample transform), a lane's samples or record blocks from a position, and what the reads found
(identities of the shards opened, skips). Layers below the dataset reach it through
:func:`shard_reads`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import cast

from shardmix.formats import BlockReader, Format, ReadOptions, RecordBlock, reader_for
from shardmix.formats.tags import NO_TAG
from shardmix.plan.sharding import Piece
from shardmix.policy import DamageHandler, ErrorPolicy, SkipLedger
from shardmix.reading import reader
from shardmix.reading.claims import CountCheck
from shardmix.reading.lanes import LanePosition, read_lane
from shardmix.reading.reader import Sample
from shardmix.reading.shardplan import ShardPlan
from shardmix.reading.transforms import SampleTransform
from shardmix.sources import SourceOptions, is_local, scheme_of
from shardmix.sources.http import readahead
from shardmix.sources.identity import ShardIdentity


class ShardReads:
    """The samples of the pieces ``plan`` deals, read with these settings.

    Picklable: every worker reads with its own copy.
    """

    def __init__(
        self,
        plan: ShardPlan,
        *,
        format_of: dict[str, Format],
        options: ReadOptions,
        source_options: SourceOptions,
        policy: ErrorPolicy,
        sample_transform: SampleTransform,
    ) -> None:
        self.plan = plan
        # A URL's index in ``urls`` (its first, if listed twice): how checkpoints name shards.
        self.shard_index = {url: i for i, url in reversed(list(enumerate(plan.urls)))}
        self._format_of = format_of
        self.options = options
        # Each format's reader, made once: making one checks its options (a piece reads
        # a few dozen records, so what is done per read counts).
        self._readers = {fmt: reader_for(fmt, options) for fmt in set(format_of.values())}
        self.source_options = source_options
        self.policy = policy
        self.sample_transform = sample_transform
        # Counts what this copy of the reads skipped (set per iteration).
        self.ledger: SkipLedger | None = None
        # By shard index: the identities a read of a shard must find (a checkpoint's, set per
        # epoch), and those this copy's reads found since :meth:`take_opened`.
        self.expected: Mapping[int, ShardIdentity] = {}
        self.opened: dict[int, ShardIdentity] = {}

    @property
    def transform(self) -> Callable[..., Sample | None] | None:
        """The user's transform (None: samples are kept as read, or only decoded)."""
        return self.sample_transform.transform

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
        return all(isinstance(reader, BlockReader) for reader in self._readers.values())

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
        urls = self.plan.urls

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
        url = self.plan.urls[piece.shard]
        check = self._count_check(url, record, piece.stop, self.ledger)
        on_damage = self.ledger if check is None else check.on_damage
        request = self._request(url, record, before_offset, piece.stop, on_damage, before_tag)
        shard_reader = cast(BlockReader, self._readers[self._format_of[url]])  # reads_blocks
        blocks = reader.read_shard_blocks(url, shard_reader, request)
        return blocks if check is None else check.blocks(blocks)

    def _count_check(
        self, url: str, start: int, stop: int | None, on_damage: DamageHandler | None
    ) -> CountCheck | None:
        """What checks a read of ``url`` against its record count, when the count is known."""
        claim = self.plan.record_counts.claim(url)
        if claim is None:
            return None
        whole = url not in self.plan.record_counts.damaged  # else the count ends at the damage
        skips = on_damage if self.policy.skips else None
        return CountCheck(url, claim, start, stop, skips, whole)

    def take_opened(self) -> dict[int, ShardIdentity]:
        """The identities of the shards read since the last call, by shard index."""
        opened, self.opened = self.opened, {}
        return opened

    def _note_opened(self, shard: int, identity: ShardIdentity | None) -> None:
        if identity is not None:
            self.opened[shard] = identity

    def _request(
        self,
        url: str,
        start: int,
        before_offset: int,
        stop: int | None,
        on_damage: DamageHandler | None,
        before_tag: int,
    ) -> reader.ReadRequest:
        """What a read of records ``[start, stop)`` of ``url`` asks the reader module."""
        shard = self.shard_index[url]
        # Where record ``stop`` begins, when the sparse index holds it: the read ends there.
        at_stop = None if stop is None else self.plan.record_counts.seek_from(url, stop)
        seek = self.plan.record_counts.seek_from(url, start)
        # A damaged local shard has no index: a resume walks it from the start, as its read did.
        walk = seek is None and self.policy.skips and is_local(url)
        return reader.ReadRequest(
            expect=self.expected.get(shard),
            on_open=partial(self._note_opened, shard),
            start=start,
            stop=stop,
            seek_from=seek,
            options=self.options,
            source_options=self.source_options,
            on_damage=on_damage if self.policy.skips else None,
            before_offset=-1 if walk else before_offset,
            listed=self._listed(url),
            before_tag=before_tag,
            stop_offset=at_stop[1] if at_stop is not None and at_stop[0] == stop else None,
        )

    def _listed(self, url: str) -> tuple[int, str | None] | None:
        """The size and sha256 the manifest gives ``url``, which a cached copy must have."""
        if self.source_options.cache_dir is None:
            return None
        entry = self.plan.record_counts.manifests.entry(url, fetch=False)
        return None if entry is None else (entry.bytes, entry.sha256)

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
        url = self.plan.urls[piece.shard]
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
        """The samples of records ``[start, stop)`` (None: to the end) of shard ``url`` in
        ``epoch``, transformed, each with its record's tag under ``__tag__``.

        ``before_offset``, ``before_tag``: where record ``start - 1`` begins and its tag, when
        known (a resume): the read starts there (see :class:`~shardmix.reading.reader.ReadRequest`).
        Damage is raised, or with ``on_error="skip"`` reported to ``on_damage`` (default: the
        dataset's ledger) and left out; a sample the transform drops leaves a tombstone
        (:mod:`shardmix.reading.transforms`).
        """
        if self.policy.skips and on_damage is None:
            on_damage = self.ledger
        check = self._count_check(url, start, stop, on_damage)
        read_damage = on_damage if check is None else check.on_damage
        request = self._request(url, start, before_offset, stop, read_damage, before_tag)
        samples = reader.read_shard(url, self._format_of[url], request)
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
        raw: bool = False,
    ) -> Iterator[Sample]:
        """The samples at the ``(record, byte offset)`` pairs of shard ``url``, transformed
        (``raw``: as read, with their tags).

        Each is read by seeking to its offset (by walking the framing on gzip shards and
        streams that cannot seek): how a checkpoint's shuffle buffer is restored.
        ``longest_record``: see :func:`~shardmix.reading.reader.record_ranges`.
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
        return samples if raw else self._transformed(samples, url, epoch, on_damage, epoch_pass)

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
            example=self._format_of[url] is Format.TFRECORD,
        )


def _has_copy(options: SourceOptions, url: str) -> bool:
    from shardmix.sources.cache.bounded import has_copy

    return options.cache_dir is not None and has_copy(options.cache_dir, url)


def shard_reads(dataset: object) -> ShardReads | None:
    """The reads of a :class:`~shardmix.dataset.ShardDataset` (its ``reads``), None for any
    other dataset: how the layers below the dataset tell one apart and read its shards."""
    reads = getattr(dataset, "reads", None)
    return reads if isinstance(reads, ShardReads) else None
