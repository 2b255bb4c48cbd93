"""Mixing: the main-process stage that merges all lanes in one fixed order.

Items leave in ascending ``(key, lane)`` order, a key being a clock (the share of its lane read
before the item) or a turn, so the output is a function of the lanes' contents alone, never of
worker timing; tombstones (samples the transform dropped) are counted and passed over. The state
(:meth:`LaneMerge.state_dict`) is each lane's position after the last item handed out. How
items are released: ``docs/design/batching.md``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shardmix.batching.rows import RowStore
from shardmix.errors import WorkerError
from shardmix.policy import SkipLedger
from shardmix.reading.chunks import (
    DROPPED,
    FILTERED_ITEM,
    ID,
    KEPT,
    KIND_NAMES,
    LANE,
    NO_ITEMS,
    OFFSET,
    RECORD,
    SHARD,
    SIZE,
    TAG,
    Chunk,
    keys_of,
)
from shardmix.reading.lanes import LanePosition
from shardmix.reading.mergekeys import LaneClocks, LanePieces, slot_of

_INT = np.int64
# Taken items are accounted in the lanes' positions in batches of about this many.
_TAKEN_BACKLOG = 1 << 13


class LaneMerge:
    """All lanes' items in one fixed order, from the chunks that carry them.

    ``clocks``: None where items are keyed by turn; ``dropped``: the tombstones counted before
    a resume; ``note_filtered``: the number of shards, to keep what kept counts are learned
    from (:attr:`filtered_refs`, :attr:`records_seen`; 0: not)."""

    def __init__(
        self,
        chunks: Iterator[Chunk],
        num_lanes: int,
        store: RowStore,
        *,
        clocks: LaneClocks | None = None,
        lane_pieces: LanePieces | None = None,
        dropped: Mapping[str, int] | None = None,
        ledger: SkipLedger | None = None,
        note_filtered: int = 0,
    ) -> None:
        self._chunks = chunks
        self._note_filtered = note_filtered > 0
        self.filtered_refs: list[np.ndarray] = []
        self.records_seen = np.zeros(note_filtered, dtype=_INT)
        self.num_lanes = num_lanes
        self.store = store
        self._clocks = clocks
        if lane_pieces is None and clocks is not None:
            lane_pieces = clocks.lane_pieces
        self._lane_pieces = lane_pieces
        self._ledger = ledger
        self._begin(list(range(num_lanes)), 0, [LanePosition()] * num_lanes)
        self._last_key = np.full(num_lanes, -np.inf)
        self._pending = NO_ITEMS  # arrived, not released: in arrival order
        self._ready = NO_ITEMS  # released, in merge order; taken up to ``_head``
        self._head = 0
        self._moved = np.zeros(num_lanes, dtype=bool)
        self._last = np.zeros((num_lanes, 3), dtype=_INT)  # (shard, record, offset) taken last
        self._last_tag = np.zeros(num_lanes, dtype=_INT)  # and its record's tag
        self._dropped: Counter[str] = Counter(dropped or {})
        self.exhausted = False
        self._tombstones = False  # whether any item that arrived is a tombstone
        # Items taken but not yet accounted in the positions (see :meth:`_settle`).
        self._taken: list[np.ndarray] = []
        self._taken_count = 0

    def peek(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, sizes)`` of up to ``count`` released samples not yet taken; none at the end."""
        self.lookahead(1)
        ahead = self._ready[self._head :]
        # Tombstones: only the first ``count`` samples' rows are copied, not the whole tail.
        kept = np.flatnonzero(ahead[:, ID] >= 0)[:count] if self._tombstones else slice(count)
        ahead = ahead[kept]
        return ahead[:, ID], ahead[:, SIZE]

    def lookahead(self, count: int) -> int:
        """The samples released and not yet taken, pulling chunks until ``count`` or the end."""
        while True:
            ahead = self._ready[self._head :]
            ready = int((ahead[:, ID] >= 0).sum()) if self._tombstones else len(ahead)
            if ready >= count or self.exhausted:
                return ready
            self._release()

    def consume(self, count: int) -> None:
        """Take the next ``count`` samples (as :meth:`peek` gave them) and the tombstones
        before them; ``count`` 0 at the end takes the tombstones left."""
        ready, head = self._ready, self._head
        if count and self._tombstones:
            kept = np.flatnonzero(ready[head:, ID] >= 0)
            end = head + int(kept[count - 1]) + 1
        elif count:
            end = head + count
        elif self.exhausted:
            end = len(ready)
        else:
            return
        taken = ready[head:end]
        self._head = end
        if not len(taken):
            return
        self._taken.append(taken)
        self._taken_count += len(taken)
        if self._taken_count > _TAKEN_BACKLOG:
            self._settle()

    def _settle(self) -> None:
        """Bring the lanes' positions, turns and tombstone counts up to the items taken."""
        if not self._taken:
            return
        taken = self._taken[0] if len(self._taken) == 1 else np.concatenate(self._taken)
        self._taken, self._taken_count = [], 0
        lanes = taken[:, LANE]
        moved, last_from_end = np.unique(lanes[::-1], return_index=True)
        last = taken[len(lanes) - 1 - last_from_end]
        self._moved[moved] = True
        self._last[moved] = last[:, SHARD : OFFSET + 1]
        self._last_tag[moved] = last[:, TAG]
        dropped = taken[:, DROPPED]
        kept_mask = dropped == KEPT
        if self._clocks is None:
            self.turns += np.bincount(lanes[kept_mask], minlength=self.num_lanes)
        if not kept_mask.all():
            for kind, number in Counter(dropped[~kept_mask].tolist()).items():
                self._dropped[KIND_NAMES[kind]] += number

    @property
    def dropped(self) -> Counter[str]:
        """The tombstones taken, by why (``"filtered"``, ``"skipped"``)."""
        self._settle()
        return self._dropped

    def _release(self) -> None:
        """Pull one chunk, and release every pending item no lane can still precede."""
        if not self._ended.all():
            self._arrive(self._pull())
        pending = self._pending
        waiting = np.flatnonzero(~self._ended)
        if len(waiting):
            keys = self._last_key[waiting]
            lowest = np.lexsort((waiting, keys))[0]
            key, lane = keys[lowest], waiting[lowest]
            pending_keys = keys_of(pending)
            free = (pending_keys < key) | ((pending_keys == key) & (pending[:, LANE] <= lane))
            released = pending[free]
            self._pending = pending[~free]
        else:
            released, self._pending = pending, NO_ITEMS
            self.exhausted = True
        if len(released):
            released = released[np.lexsort((released[:, LANE], keys_of(released)))]
        rest = self._ready[self._head :]
        self._ready = np.concatenate((rest, released)) if len(rest) else released
        self._head = 0
        if self.exhausted:
            self._finish()

    def _arrive(self, chunk: Chunk) -> None:
        if chunk.skipped is not None and self._ledger is not None:
            self._ledger.merge(chunk.skipped)
        if len(chunk):
            items = chunk.items
            self.store.add(chunk)
            lanes = items[:, LANE]
            if self._clocks is None:
                keys_of(items)[:] += self._turns_at_start[lanes]
            late = self._ended[lanes]
            if late.any():
                stray = sorted(set(lanes[late].tolist()))
                raise WorkerError(f"a worker sent samples for lanes {stray} after they ended")
            self._tombstones = self._tombstones or bool((items[:, DROPPED] != KEPT).any())
            if self._note_filtered:
                self._note(items)
            pending = self._pending
            self._pending = np.concatenate((pending, items)) if len(pending) else items
            seen, last_from_end = np.unique(lanes[::-1], return_index=True)
            self._last_key[seen] = keys_of(items)[len(items) - 1 - last_from_end]
        self._ended[chunk.ended] = True
        chunk.stored()  # its columns are the store's rows now

    def _note(self, items: np.ndarray) -> None:
        """Count each shard's records that arrived; keep those the transform filtered out."""
        self.records_seen += np.bincount(items[:, SHARD], minlength=len(self.records_seen))
        if self._tombstones:
            filtered = items[items[:, DROPPED] == FILTERED_ITEM]
            if len(filtered):
                self.filtered_refs.append(filtered[:, [SHARD, RECORD]])

    def _pull(self) -> Chunk:
        try:
            return next(self._chunks)
        except StopIteration:
            waiting = np.flatnonzero(~self._ended).tolist()
            raise WorkerError(
                f"the workers stopped sending before lanes {waiting} ended; a worker exited early"
            ) from None

    def _finish(self) -> None:
        """Read the chunk stream to its end, so the DataLoader shuts its workers down."""
        for chunk in self._chunks:
            chunk.stored()
            if len(chunk):
                stray = sorted(set(chunk.items[:, LANE].tolist()))
                raise WorkerError(f"a worker sent samples for lanes {stray} after they ended")
        self._chunks = iter(())

    def _begin(self, live: Sequence[int], cursor: int, start: Sequence[LanePosition]) -> None:
        """Start with the lanes ``live`` in the turn, ``live[cursor]``'s next, from ``start``."""
        live = list(live)
        self._in_play = np.zeros(self.num_lanes, dtype=bool)
        self._in_play[live] = True
        # By turn: the turns each lane has had, counting the current round's from ``cursor``.
        self.turns = np.zeros(self.num_lanes, dtype=_INT)
        if self._clocks is None:
            self.turns[live[:cursor]] = 1
        self._turns_at_start = self.turns.copy()  # the workers count turns from 0
        self._ended = ~self._in_play  # a lane out of the turn has nothing left to send
        self.start = list(start)

    def state_dict(self) -> dict[str, Any]:
        """``{"live": lanes, "cursor": index, "lanes": positions}``: the lanes still in the
        turn, the index into them of the next turn, and each lane's position as
        ``[slot, record, offset, shard, start, stop, tag]``."""
        live = self.live()
        return merge_state(live, self.cursor(live), self.lane_positions(), self._lane_pieces)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on where :meth:`state_dict` was taken (before the first chunk arrives)."""
        live, start = resume_points(state)
        self._begin(live, state["cursor"], start)

    def live(self) -> list[int]:
        """The lanes still in the turn: not ended, or with items not yet taken."""
        left = np.concatenate((self._pending[:, LANE], self._ready[self._head :, LANE]))
        active = ~self._ended
        active[left] = True
        return np.flatnonzero(active & self._in_play).tolist()

    def cursor(self, live: list[int]) -> int:
        """Index into ``live`` of the lane whose turn is next (0 when keyed by clock)."""
        if self._clocks is not None or not live:
            return 0
        self._settle()
        turns = self.turns[live]
        return int(np.count_nonzero(turns > turns.min()))

    def lane_positions(self) -> list[LanePosition]:
        """Where each lane resumes: just after the last item taken from it."""
        self._settle()
        positions = list(self.start)
        moved = np.flatnonzero(self._moved)
        lane_pieces = self._lane_pieces
        if lane_pieces is None:
            if len(moved):
                raise TypeError("lane positions need the lanes' pieces (lane_pieces)")
            lane_pieces = ()
        for lane in moved.tolist():
            shard, record, offset = self._last[lane].tolist()
            slot = slot_of(lane_pieces[lane], shard, record, self.start[lane].slot, lane)
            positions[lane] = LanePosition(slot, record + 1, offset, int(self._last_tag[lane]))
        return positions


# ``(shard, start, stop)`` of no piece: past a lane's last one, or before the plan is made.
NO_PIECE = (-1, 0, -1)


def piece_name(lane_pieces: LanePieces | None, lane: int, slot: int) -> tuple[int, int, int]:
    """``(shard, start, stop)`` of ``lane``'s piece in ``slot`` (stop -1: to the shard's end)."""
    if lane_pieces is None or slot >= len(lane_pieces[lane]):
        return NO_PIECE
    shard, start, stop = lane_pieces[lane][slot]
    return shard, start, -1 if stop is None else stop


def merge_state(
    live: list[int], cursor: int, lanes: Sequence[LanePosition], lane_pieces: LanePieces | None
) -> dict[str, Any]:
    """A merge's state (:meth:`LaneMerge.state_dict`); :func:`start_state` is the first."""
    return {
        "live": live,
        "cursor": cursor,
        "lanes": [
            [p.slot, p.record, p.offset, *piece_name(lane_pieces, lane, p.slot), p.tag]
            for lane, p in enumerate(lanes)
        ],
    }


def start_state(num_lanes: int) -> dict[str, Any]:
    """The state of a merge of ``num_lanes`` lanes before any item."""
    return merge_state(list(range(num_lanes)), 0, [LanePosition()] * num_lanes, None)


def resume_points(state: Mapping[str, Any]) -> tuple[list[int], list[LanePosition]]:
    """``(live lanes, where each lane resumes)`` of a merge's state."""
    starts = [
        LanePosition(slot, record, offset, tag) for slot, record, offset, *_, tag in state["lanes"]
    ]
    return list(state["live"]), starts
