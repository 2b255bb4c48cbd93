"""Chunks through shared memory: exactly the chunks the workers built, whatever fits the ring."""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest

import shardmix.workers.arena as arena_module
import shardmix.workers.pool as pool_module
from shardmix import MixingLoader, ShardDataset
from shardmix.reading.chunks import Chunk, ChunkBuilder
from shardmix.workers.arena import Arena, InArena

from shards import UNEVEN_SIZES, batch_keys, expected_keys, write_shards


def chunk_of(count: int, first: int) -> Chunk:
    samples = [
        {
            "__key__": f"k{first + i}",
            "data": bytes([i % 256]) * 40,
            "cls": str(first + i).encode(),
            "score": (first + i) / 3,
            "meta": {"i": first + i},
        }
        for i in range(count)
    ]
    return ChunkBuilder(None, None).build([(0, samples, False)])


def assert_same_chunk(got: Chunk, sent: Chunk) -> None:
    assert np.array_equal(got.items, sent.items)
    assert list(got.columns) == list(sent.columns)
    for name, column in sent.columns.items():
        mine = got.columns[name]
        assert mine.kind == column.kind, name
        if isinstance(column.values, np.ndarray):
            assert mine.values.dtype == column.values.dtype, name
            assert np.array_equal(mine.values, column.values), name
        else:
            assert mine.values == column.values, name
    assert (got.ended, got.skipped, got.derived) == (sent.ended, sent.skipped, sent.derived)


def through_pipe(sent: Chunk | InArena) -> Chunk:
    """``sent`` as the main process gets it, then stores it: its columns copied out, its
    ring freed."""
    got: Chunk = pickle.loads(pickle.dumps(sent))
    columns = {
        name: replace(column, values=column.values.copy())
        if isinstance(column.values, np.ndarray)
        else column
        for name, column in got.columns.items()
    }
    kept = replace(got, columns=columns, release=None)
    got.stored()
    return kept


def test_chunks_cross_the_ring_exactly_lap_after_lap():
    arena = Arena(2, ring_bytes=16 << 10)
    try:
        for number in range(40):
            chunk = chunk_of(20 + number % 7, number * 100)
            sent = arena.send(1, chunk)
            assert isinstance(sent, InArena)
            assert_same_chunk(through_pipe(sent), chunk)
        assert arena.received == 40
        assert int(arena.released.numpy()[1]) > 3 * (16 << 10)  # around the ring, three laps
        assert int(arena.released.numpy()[0]) == 0  # the other worker's ring, untouched
    finally:
        arena.close()


def test_a_chunk_the_free_ring_cannot_hold_goes_whole_through_the_pipe():
    arena = Arena(1, ring_bytes=16 << 10)
    try:
        chunks = [chunk_of(20, 100 * n) for n in range(20)]
        sent = [arena.send(0, chunk) for chunk in chunks]  # none received yet: the ring fills
        in_ring = [isinstance(one, InArena) for one in sent]
        assert in_ring[0] and not in_ring[-1]
        assert all(
            one is chunk
            for one, chunk in zip(sent, chunks, strict=True)
            if not isinstance(one, InArena)
        )
        for one, chunk in zip(sent, chunks, strict=True):
            assert_same_chunk(through_pipe(one), chunk)
        assert isinstance(arena.send(0, chunks[0]), InArena)  # received: room again
        big = chunk_of(1000, 0)  # more than the whole ring
        assert arena.send(0, big) is big
    finally:
        arena.close()


def test_a_received_chunk_holds_its_ring_until_it_is_stored():
    """The main process reads a chunk's columns in the ring until its store has copied them:
    receiving it frees nothing, storing it does."""
    arena = Arena(1, ring_bytes=16 << 10)
    try:
        chunks = [chunk_of(20, 100 * n) for n in range(20)]
        sent = [arena.send(0, chunk) for chunk in chunks]
        in_ring = sum(isinstance(one, InArena) for one in sent)
        assert 1 < in_ring < len(sent)
        got = [pickle.loads(pickle.dumps(one)) for one in sent[:in_ring]]  # not stored
        assert not isinstance(arena.send(0, chunks[0]), InArena)  # the ring is still full
        for one, chunk in zip(got, chunks, strict=False):
            assert_same_chunk(one, chunk)
            assert one.release is not None
        for one in got:
            one.stored()
            assert one.release is None
        assert isinstance(arena.send(0, chunks[0]), InArena)
    finally:
        arena.close()


def big_chunk(data_bytes: int, first: int) -> Chunk:
    """A chunk of 4 KiB records whose columns hold about ``data_bytes``."""
    samples = [
        {"__key__": f"k{first + i:09d}", "data": bytes([i % 256]) * 4096}
        for i in range(data_bytes // 4096)
    ]
    return ChunkBuilder(None, None).build([(0, samples, False)])


def test_the_largest_chunks_a_worker_has_in_flight_stay_in_the_ring():
    # A worker has up to prefetch_factor (2) chunks in flight, each up to CHUNK_BYTES and a
    # lane's turn (64 samples) past it; the main process receives the oldest as the next
    # is sent. Whatever their offsets in the ring, every chunk goes through the ring.
    from shardmix.reading.lanechunks import CHUNK_BYTES, MIN_TURN

    arena = Arena(1)
    try:
        in_flight: list[tuple[Chunk, InArena]] = []
        for number in range(12):
            extra = (number % 3) * MIN_TURN * 4096 // 2  # the sizes vary, the laps shift
            chunk = big_chunk(CHUNK_BYTES + extra, number * 10_000)
            sent = arena.send(0, chunk)
            assert isinstance(sent, InArena), number
            in_flight.append((chunk, sent))
            if len(in_flight) == 2:
                oldest, placed = in_flight.pop(0)
                assert_same_chunk(through_pipe(placed), oldest)
        assert int(arena.released.numpy()[0]) > 2 * arena_module.RING_BYTES  # laps
    finally:
        arena.close()


def test_a_chunk_of_a_closed_pool_is_refused():
    arena = Arena(1, ring_bytes=16 << 10)
    sent = pickle.dumps(arena.send(0, chunk_of(5, 0)))
    arena.close()
    with pytest.raises(RuntimeError, match="closed worker pool"):
        pickle.loads(sent)


def epochs_read(pattern: str, epochs: int, **kwargs) -> tuple[list[list[str]], MixingLoader]:
    # Whole shards: their chunks are of several sizes, some past the ring's room.
    loader = MixingLoader(
        ShardDataset(pattern, seed=5, num_lanes=6, piece_records=None),
        batch_size=8,
        num_workers=2,
        shuffle_buffer=32,
        seed=3,
        **kwargs,
    )
    read = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        read.append([key for keys in batch_keys(loader) for key in keys])
    return read, loader


@pytest.mark.parametrize(
    ("ring_bytes", "through"),
    [(2 << 10, "pipe"), (32 << 10, "both"), (None, "ring")],
)
def test_workers_send_the_same_batches_through_the_ring_or_the_pipe(
    tmp_path, monkeypatch, ring_bytes, through
):
    pattern = write_shards(tmp_path / "shards", "tar", UNEVEN_SIZES, payload_bytes=200)
    with monkeypatch.context() as patched:
        patched.setattr(Arena, "create", classmethod(lambda cls, workers: None))
        piped, _ = epochs_read(pattern, 2)
    assert sorted(piped[0]) == sorted(expected_keys(UNEVEN_SIZES).elements())

    monkeypatch.setattr(arena_module, "RING_BYTES", ring_bytes or arena_module.RING_BYTES)
    chunks = []
    pulled = pool_module.WorkerPool._chunks

    def counted(self, iterator, generation):
        for chunk in pulled(self, iterator, generation):
            chunks.append(len(chunk))
            yield chunk

    monkeypatch.setattr(pool_module.WorkerPool, "_chunks", counted)
    read, loader = epochs_read(pattern, 2)
    arena = loader.pool._arena
    assert read == piped
    assert arena is not None
    if through == "pipe":
        assert arena.received == 0 and chunks
    elif through == "ring":
        assert arena.received == len(chunks)
    else:
        assert 0 < arena.received < len(chunks)
    loader.close()
    assert loader.pool._arena is None


def test_spawned_workers_map_the_same_rings(tmp_path):
    pattern = write_shards(tmp_path / "shards", "tfrecord", UNEVEN_SIZES)
    forked, _ = epochs_read(pattern, 1)
    spawned, loader = epochs_read(pattern, 1, multiprocessing_context="spawn")
    assert spawned == forked
    assert loader.pool._arena.received > 0
    loader.close()


def test_an_epochs_own_workers_send_through_rings_closed_with_them(tmp_path, monkeypatch):
    pattern = write_shards(tmp_path / "shards", "tar", UNEVEN_SIZES, payload_bytes=200)
    with monkeypatch.context() as patched:
        patched.setattr(Arena, "create", classmethod(lambda cls, workers: None))
        piped, _ = epochs_read(pattern, 2, persistent_workers=False)
    made: list[Arena] = []
    create = Arena.create.__func__

    def recorded(cls, workers):
        made.append(create(cls, workers))
        return made[-1]

    monkeypatch.setattr(Arena, "create", classmethod(recorded))
    read, loader = epochs_read(pattern, 2, persistent_workers=False)
    assert read == piped
    assert sorted(read[0]) == sorted(expected_keys(UNEVEN_SIZES).elements())
    assert len(made) == 2  # one epoch's workers each, never a pool
    assert all(arena.received > 0 for arena in made)
    assert not any(arena.token in arena_module._OPEN for arena in made)  # closed with them
    assert loader.pools == {}
