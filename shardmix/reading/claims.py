"""A count is a claim the read checks: a shard must hold the records its count says.

A read short of its count, or a record past it, is a :class:`~shardmix.errors.RecordCountError`
naming the shard, where the count came from and both numbers (under ``on_error="skip"``:
damage, never a silently shorter or longer epoch). Damage already reported counts as reached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from shardmix.errors import RecordCountError, ShardmixError
from shardmix.formats import INDEX_KEY, OFFSET_KEY, RecordBlock, Sample
from shardmix.policy import Damage, DamageHandler


class CountCheck:
    """Checks one read of records ``[start, stop)`` of ``url`` against ``claim``, ``(records,
    where the count comes from)``: pass :attr:`on_damage` to the reader, read through it."""

    def __init__(
        self,
        url: str,
        claim: tuple[int, str],
        start: int,
        stop: int | None,
        on_damage: DamageHandler | None,
        whole: bool = True,
    ) -> None:
        self.url = url
        self.expected, self.source = claim
        self.start = start
        self.stop = stop
        self._forward = on_damage
        self._reached = start - 1  # the last record read or reported damaged
        self._cut = False  # the reader dropped the shard's rest (already reported)
        self._whole = whole  # the count is of the whole shard (not cut short by damage)

    @property
    def on_damage(self) -> DamageHandler | None:
        return None if self._forward is None else self._damaged

    def _damaged(self, damage: Damage) -> None:
        if damage.rest_of_shard:
            self._cut = True
            damage = self._with_records(damage)
        elif damage.record is not None:
            self._reached = max(self._reached, damage.record)
        if self._forward is not None:
            self._forward(damage)

    def _with_records(self, damage: Damage) -> Damage:
        """A cut of the shard's rest, with the records of this read it lost, where known."""
        end = self.expected if self.stop is None else self.stop
        first = max(damage.record or 0, self.start, self._reached + 1)
        if damage.records is not None or not self._whole or first > end:
            return damage
        return dataclasses.replace(damage, records=end - first)

    def samples(self, samples: Iterator[Sample]) -> Iterator[Sample]:
        """``samples`` (each with its ``__index__``), checked."""
        for sample in samples:
            index = sample[INDEX_KEY]
            if self.stop is None and index >= self.expected:
                self._surplus(index, sample[OFFSET_KEY], *counted_rest(samples, lambda _: 1))
                return
            self._reached = index
            yield sample
        self._ended()

    def blocks(self, blocks: Iterator[RecordBlock]) -> Iterator[RecordBlock]:
        """``blocks`` of records, checked."""
        for block in blocks:
            if self.stop is None and block.records[-1] >= self.expected:
                keep = sum(1 for record in block.records if record < self.expected)
                head, tail = block.split(keep)
                if keep:
                    yield head
                rest, whole = counted_rest(blocks, len)
                self._surplus(tail.records[0], tail.offsets[0], len(tail) - 1 + rest, whole)
                return
            self._reached = block.records[-1]
            yield block
        self._ended()

    def _ended(self) -> None:
        end = self.expected if self.stop is None else self.stop
        if self._cut or self._reached >= end - 1:
            return
        found = self._reached + 1
        # A piece read from a record past the shard's end read nothing: the end is before it.
        where = f"before record {found}" if found == self.start > 0 else f"after {found}"
        error = RecordCountError(
            f"{self.url}: {self.source} says {self.expected} records, but the shard ends "
            f"{where}: it was cut short (an interrupted copy?) or changed since it was "
            "counted; restore the shard, or re-create its manifest or count",
            url=self.url,
            record=found,
        )
        self._report(error, found, None, end - found)

    def _surplus(self, record: int, offset: int, rest: int, whole: bool) -> None:
        found = f"{record + 1 + rest}" if whole else f"at least {record + 1 + rest}"
        error = RecordCountError(
            f"{self.url}: {self.source} says {self.expected} records, but the shard holds "
            f"{found} (record {record} at byte offset {offset} is past the count): it grew or "
            "changed since it was counted, or the count is wrong; re-create its manifest or "
            "count, or pass the right record_counts=",
            url=self.url,
            offset=offset,
            record=record,
        )
        self._report(error, record, offset, rest + 1 if whole else None)

    def _report(
        self, error: RecordCountError, record: int, offset: int | None, records: int | None
    ) -> None:
        if self._forward is None:
            raise error
        self._forward(Damage(error, record, offset, rest_of_shard=True, records=records))


def counted_rest(items: Iterator[Any], size: Callable[[Any], int]) -> tuple[int, bool]:
    """``(records, whole)``: the records ``items`` still gives, and whether damage cut it short."""
    count = 0
    try:
        for item in items:
            count += size(item)
    except ShardmixError:
        return count, False
    return count, True
