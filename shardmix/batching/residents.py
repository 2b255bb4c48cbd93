"""Re-reading records a checkpoint names: the shuffle buffer's residents, in order of need.

A restore puts a :class:`Resident` (a ``(shard, record, offset)`` reference, size and tag) in
the buffer in place of each sample; :class:`ResidentReads` reads them in waves of one batch,
then two, four, ... in the order the buffer will evict them, the first wave at the epoch's
start. A resident missing or with another tag is a ConfigError naming the shard and record.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from shardmix.errors import ConfigError, CorruptShardError, ShardChangedError, describe_position
from shardmix.formats import DROPPED_KEY, INDEX_KEY, Sample, is_gzipped
from shardmix.formats.tags import NO_TAG, TAG_KEY, tags_differ
from shardmix.policy import SkipLedger
from shardmix.reading.reader import longest_record_of, record_ranges
from shardmix.reading.shardreads import ShardReads
from shardmix.sources import SourceOptions
from shardmix.sources.ranges import reads_ranges
from shardmix.state.codec import Ref

__all__ = ["Resident", "ResidentReads", "check_lane_ends", "read_refs"]

Key = tuple[int, int]  # (shard index, record)


@dataclass(frozen=True, slots=True)
class Resident:
    """A buffer resident not read yet: its reference, its sample's size, the wave it is in."""

    ref: Ref
    size: int
    wave: int
    tag: int = NO_TAG  # its record's tag (:mod:`shardmix.formats.tags`), 0 if not known


class _Wave:
    """Reads of some references, asked for at construction, read by :meth:`samples`."""

    def __init__(
        self,
        dataset: ShardReads,
        refs: Sequence[Ref],
        epoch: int,
        epoch_pass: int,
        longest: Mapping[int, int | None] | None = None,
        tags: Sequence[int] | None = None,
    ) -> None:
        self.dataset = dataset
        self.refs = refs
        self.tags = tags
        wanted: dict[int, dict[int, int]] = {}
        for shard_index, record, offset in refs:
            wanted.setdefault(shard_index, {})[record] = offset
        # Damage met again here was counted when it was first skipped.
        quiet = SkipLedger(max_skips=None, warn=False)
        # Every shard's reads are asked for first (remote ranges go out together), then read.
        self._reads = {
            shard_index: dataset.read_records(
                dataset.plan.urls[shard_index],
                sorted(records.items()),
                epoch=epoch,
                epoch_pass=epoch_pass,
                on_damage=quiet,
                longest_record=(longest or {}).get(shard_index),
            )
            for shard_index, records in wanted.items()
        }

    def samples(self) -> dict[Key, Sample]:
        """Every reference's sample, by ``(shard, record)``; a ConfigError if one is missing
        or has another tag than ``tags`` says."""
        found: dict[Key, Sample] = {}
        for shard_index, samples in self._reads.items():
            _take(self.dataset.plan.urls[shard_index], shard_index, samples, found)
        self._reads = {}
        tags = self.tags if self.tags is not None else [NO_TAG] * len(self.refs)
        for (shard_index, record, offset), tag in zip(self.refs, tags, strict=True):
            url = self.dataset.plan.urls[shard_index]
            sample = found.get((shard_index, record))
            if sample is None:
                raise ConfigError(
                    f"cannot resume: the checkpoint's shuffle buffer holds record {record} of "
                    f"{url}, which no longer has it or which the transform now drops; the data "
                    "changed, or the transform is not deterministic",
                    url=url,
                    record=record,
                )
            there = sample.get(TAG_KEY, NO_TAG)
            if tags_differ(tag, there):
                raise ConfigError(
                    f"cannot resume: the checkpoint's shuffle buffer holds record {record} of "
                    f"{url} at byte offset {offset} with tag {tag:#06x}, but the record read "
                    f"there has tag {there:#06x}: the buffer's references in the state were "
                    "edited or damaged, or the shard was rewritten in place since the "
                    "checkpoint; resume from an untouched checkpoint over the same data",
                    url=url,
                    offset=None if offset < 0 else offset,
                    record=record,
                )
        for sample in found.values():
            sample.pop(TAG_KEY, None)
        return found


def _take(url: str, shard_index: int, samples: Iterator[Sample], found: dict[Key, Sample]) -> None:
    try:
        for sample in samples:
            if DROPPED_KEY not in sample:
                found[shard_index, sample[INDEX_KEY]] = sample
    except CorruptShardError as error:
        where = describe_position(url, offset=error.offset, record=error.record)
        raise ConfigError(
            f"cannot resume: re-reading the checkpoint's shuffle buffer found no valid "
            f"record at {where}; the data changed (or was damaged) since the checkpoint "
            "was written",
            url=url,
            offset=error.offset,
            record=error.record,
        ) from error


def check_lane_ends(dataset: ShardReads, ends: Sequence[tuple[Ref, int]]) -> None:
    """Refuse a shard whose record a saved lane read last (a reference, and its tag) is not
    found there now: where an elastic resume deals the rest of a piece from."""
    wanted: dict[int, list[tuple[int, int]]] = {}
    for (shard_index, record, offset), _ in ends:
        wanted.setdefault(shard_index, []).append((record, offset))
    reads = {
        shard_index: dataset.read_records(
            dataset.plan.urls[shard_index], sorted(positions), raw=True
        )
        for shard_index, positions in wanted.items()
    }
    found = {
        (shard_index, sample["__index__"]): sample.get(TAG_KEY, NO_TAG)
        for shard_index, samples in reads.items()
        for sample in samples
    }
    for (shard_index, record, offset), tag in ends:
        there = found.get((shard_index, record))
        if there is None or tags_differ(tag, there):
            url = dataset.plan.urls[shard_index]
            what = "no such record" if there is None else f"tag {there:#06x}"
            raise ShardChangedError(
                f"{url}: the shard changed since the checkpoint: a lane was dealt the rest of "
                f"it after record {record} (byte offset {offset}, tag {tag:#06x}), but the "
                f"shard has {what} there; it was rewritten in place: resume over the data the "
                "checkpoint was taken on, or start the epoch again",
                url=url,
                offset=None if offset < 0 else offset,
                record=record,
            )


def read_refs(
    dataset: ShardReads, refs: Sequence[Ref], epoch: int, epoch_pass: int = 0
) -> list[Sample]:
    """The samples that ``refs`` name, in order, each shard opened once (each record read at
    its byte offset where the shard allows it, else walked to by its framing)."""
    found = _Wave(dataset, refs, epoch, epoch_pass).samples()
    return [dict(found[shard_index, record]) for shard_index, record, _ in refs]


class ResidentReads:
    """A restored buffer's residents, asked for in waves in ``order`` (of expected eviction)
    and read when needed; here the first wave's reads are asked for."""

    def __init__(
        self,
        dataset: ShardReads,
        refs: Sequence[Ref],
        sizes: Sequence[int],
        order: Sequence[int],
        *,
        first_wave: int,
        epoch: int,
        epoch_pass: int = 0,
        tags: Sequence[int] | None = None,
    ) -> None:
        tags = [NO_TAG] * len(refs) if tags is None else tags
        options = dataset.source_options or SourceOptions()
        ranged = {
            shard_index
            for shard_index in {ref[0] for ref in refs}
            if reads_ranges(dataset.plan.urls[shard_index], options)
            and not is_gzipped(dataset.plan.urls[shard_index])
        }
        wave_of = _waves(refs, order, first_wave, ranged)
        waves: list[list[Ref]] = [[] for _ in range(max(wave_of, default=-1) + 1)]
        wave_tags: list[list[int]] = [[] for _ in waves]
        for ref, wave, tag in zip(refs, wave_of, tags, strict=True):
            waves[wave].append(ref)
            wave_tags[wave].append(tag)
        self.residents = [
            Resident(ref, sizes[position], wave_of[position], tags[position])
            for position, ref in enumerate(refs)
        ]
        # A wave's ranges guess a record's length as the whole buffer shows it, not the wave.
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for shard_index, record, offset in refs:
            if offset >= 0:
                by_shard.setdefault(shard_index, []).append((record, offset))
        longest = {shard: longest_record_of(positions) for shard, positions in by_shard.items()}
        self._ask_wave: Callable[[int], _Wave] = lambda wave: _Wave(
            dataset, waves[wave], epoch, epoch_pass, longest, wave_tags[wave]
        )
        self._pending: list[_Wave | None] = [None] * len(waves)
        self._asked = 0  # the waves before this one were asked for
        self._read: dict[int, dict[Key, Sample]] = {}
        self._left = [len(wave) for wave in waves]  # residents of each wave not yet handed out
        self._ask(1)

    def _ask(self, waves: int) -> None:
        """Ask for the reads of the first ``waves`` waves (those not asked for yet)."""
        for wave in range(self._asked, min(waves, len(self._pending))):
            self._pending[wave] = self._ask_wave(wave)
        self._asked = max(self._asked, waves)

    def read_wave(self, wave: int) -> dict[Key, Sample]:
        """Wave ``wave``'s samples, read now unless they were. A later wave's first need asks
        for every wave's reads: until then only the first wave's are out."""
        found = self._read.get(wave)
        if found is None:
            if wave:
                self._ask(len(self._pending))
            pending = self._pending[wave] if wave < len(self._pending) else None
            if pending is None:
                return {}  # no such wave, or every one of its residents was handed out
            self._pending[wave] = None
            found = self._read[wave] = pending.samples()
        return found

    def sample(self, resident: Resident) -> Sample:
        """``resident``'s sample, reading its wave first if this is the wave's first need."""
        wave = resident.wave
        found = self.read_wave(wave)
        shard_index, record, _ = resident.ref
        sample = dict(found[shard_index, record])
        self._left[wave] -= 1
        if not self._left[wave]:
            del self._read[wave]  # every resident of the wave was handed out
        return sample

    def close(self) -> None:
        """Let go of the waves not read (their ranges are cancelled as they are collected)."""
        self._pending = [None] * len(self._pending)
        self._asked = len(self._pending)
        self._read.clear()


def _waves(
    refs: Sequence[Ref], order: Sequence[int], first_wave: int, ranged: Collection[int]
) -> list[int]:
    """The wave of each reference: by need, then whole ranges of a shard in their first's.

    In ``order`` (then the rest, in slot order), the first ``first_wave`` references are wave
    0, the next twice as many wave 1, and so on. Then the references of one ``ranged`` shard
    that one range request would fetch together all go in the earliest wave of any of them.

    >>> refs = [(0, 0, 0), (0, 1, 4608), (1, 5, 900000), (0, 99, 900000)]
    >>> _waves(refs, [3, 2], 1, ranged={0, 1}), _waves(refs, [3, 2], 1, ranged=())
    ([1, 1, 1, 0], [1, 2, 1, 0])
    """
    listed = set(order)
    need = [*order, *(position for position in range(len(refs)) if position not in listed)]
    wave_of = [0] * len(refs)
    wave, size, taken = 0, max(1, first_wave), 0
    for position in need:
        if taken == size:
            wave, size, taken = wave + 1, size * 2, 0
        wave_of[position] = wave
        taken += 1
    by_shard: dict[int, list[int]] = {}
    for position, (shard_index, _, offset) in enumerate(refs):
        if offset >= 0 and shard_index in ranged:
            by_shard.setdefault(shard_index, []).append(position)
    for positions in by_shard.values():
        ranges = record_ranges([refs[position][1:] for position in positions])
        starts = [start for start, _ in ranges]
        earliest = [len(need)] * len(ranges)
        range_of = {}
        for position in positions:
            index = bisect.bisect_right(starts, refs[position][2]) - 1
            range_of[position] = index
            earliest[index] = min(earliest[index], wave_of[position])
        for position, index in range_of.items():
            wave_of[position] = earliest[index]
    return wave_of
