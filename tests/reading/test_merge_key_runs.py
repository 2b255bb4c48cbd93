"""MergeKeys works a chunk's clocks out a run at a time: the very floats an item-by-item walk
of the lanes' pieces gives, whatever the chunks' cuts, gaps and pieces of one shard in a row,
and with the clocks as a worker gets them (packed, pickled)."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from shardmix.plan.sharding import PackedLanes, Piece
from shardmix.reading.mergekeys import LaneClocks, MergeKeys

Pieces = list[list[tuple[int, int, int | None]]]


def item_by_item(clocks: LaneClocks, items: list[tuple[int, int, int, int]]) -> list[float]:
    """Each item's clock, its piece found by walking its lane's pieces in order."""
    slots: dict[int, int] = {}
    keys = []
    for lane, shard, record, offset in items:
        slot = slots.get(lane, 0)
        while True:
            piece_shard, start, stop = clocks.lane_pieces[lane][slot]
            if piece_shard == shard and start <= record and (stop is None or record < stop):
                break
            slot += 1
        slots[lane] = slot
        within = offset if clocks.by_offset else record - start + 0.5
        keys.append((clocks.starts[lane][slot] + within) / (clocks.totals[lane] or 1.0))
    return keys


def lanes_of(rng: random.Random, by_offset: bool) -> tuple[Pieces, list[list[tuple]]]:
    """Random lanes of pieces (whole shards when ``by_offset``), and each lane's items in order:
    ``(shard, record, offset)``, some records left out (damage skipped)."""
    pieces: Pieces = []
    items = []
    for _ in range(rng.randint(1, 5)):
        lane, read = [], []
        for _ in range(rng.randint(1, 6)):
            shard = rng.randint(0, 3)  # pieces of one shard in a row, too
            start = 0 if by_offset else rng.choice([0, 16, 32])
            stop = None if by_offset or rng.random() < 0.3 else start + rng.randint(1, 40)
            lane.append((shard, start, stop))
            end = start + rng.randint(0, 40) if stop is None else stop
            records = [r for r in range(start, end) if rng.random() < 0.9]
            read += [(shard, r, 100 * r + rng.randint(0, 9)) for r in records]
        pieces.append(lane)
        items.append(read)
    return pieces, items


@pytest.mark.parametrize("seed", range(40))
def test_run_keys_are_the_item_keys(seed: int) -> None:
    rng = random.Random(seed)
    by_offset = seed % 4 == 0
    pieces, items = lanes_of(rng, by_offset)
    weights = [[float(rng.randint(1, 50)) for _ in lane] for lane in pieces]
    clocks = LaneClocks(pieces, weights, "bytes" if by_offset else "records")
    packed = PackedLanes([[Piece(*piece) for piece in lane] for lane in pieces])
    sent = pickle.loads(pickle.dumps(clocks.with_lanes(packed)))
    assert [list(map(tuple, lane)) for lane in sent.lane_pieces] == pieces
    assert sent.starts == clocks.starts and sent.totals == clocks.totals
    keys = MergeKeys(sent if seed % 2 else clocks)
    taken = [0] * len(items)
    chunk_items: list[tuple[int, int, int, int]] = []
    found: list[float] = []
    while any(at < len(lane) for at, lane in zip(taken, items, strict=True)):
        chunk = []
        for lane in rng.sample(range(len(items)), len(items)):  # lanes in any order
            turn = rng.randint(0, 30)
            chunk += [(lane, *item) for item in items[lane][taken[lane] : taken[lane] + turn]]
            taken[lane] += turn
        if not chunk:
            continue
        lanes, shards, records, offsets = (
            np.array(c, dtype=np.int64) for c in zip(*chunk, strict=True)
        )
        kept = np.ones(len(chunk), dtype=bool)
        found += keys.keys(lanes, records, offsets, shards, kept).tolist()
        chunk_items += chunk
    # Each lane's items are in its order however the chunks cut them; the keys are bit for bit.
    by_lane = sorted(range(len(chunk_items)), key=lambda i: chunk_items[i][0])
    expected = dict(
        zip(by_lane, item_by_item(clocks, [chunk_items[i] for i in by_lane]), strict=True)
    )
    assert found == [expected[i] for i in range(len(found))]
