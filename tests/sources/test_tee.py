"""TeeStream: the lane's reads and seeks see the shard's bytes; the copy gets each byte once."""

from __future__ import annotations

import hashlib
import io
import os
import random
from pathlib import Path

import pytest

from shardmix.sources.cache.tee import DRAIN_BYTES, TeeStream

DATA = random.Random(5).randbytes(3 * DRAIN_BYTES + 1234)


class Counting(io.BytesIO):
    """DATA, counting what was read from it."""

    def __init__(self) -> None:
        super().__init__(DATA)
        self.taken = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.taken += len(chunk)
        return chunk


def tee(tmp_path: Path, keep: int = len(DATA)) -> tuple[TeeStream, Counting, list[str], Path]:
    part = tmp_path / "copy.part"
    out = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    ends: list[str] = []
    source = Counting()
    stream = TeeStream(
        "https://host/copy.tar",
        source,
        out,
        len(DATA),
        keep,
        lambda sha256, filled: ends.append(f"{filled} {sha256}"),
        lambda: ends.append("partial"),
    )
    return stream, source, ends, part


@pytest.mark.parametrize("seed", range(4))
def test_random_seeks_and_reads_see_the_shard_and_fetch_each_byte_once(tmp_path, seed):
    stream, source, ends, part = tee(tmp_path)
    reads_and_seeks(stream, seed)
    assert source.taken == len(DATA)
    assert ends == [f"{len(DATA)} {hashlib.sha256(DATA).hexdigest()}"]
    assert part.read_bytes() == DATA


@pytest.mark.parametrize("seed", range(2))
def test_a_copy_of_the_first_part_only(tmp_path, seed):
    keep = DRAIN_BYTES + 4321
    stream, source, ends, part = tee(tmp_path, keep)
    reads_and_seeks(stream, seed)
    assert ends == [f"{keep} {hashlib.sha256(DATA[:keep]).hexdigest()}"]
    assert part.read_bytes() == DATA[:keep]


def reads_and_seeks(stream: TeeStream, seed: int) -> None:
    rng = random.Random(seed)
    buffered = io.BufferedReader(stream, 64 * 1024)
    for _ in range(40):
        where = rng.randrange(len(DATA))
        buffered.seek(where)
        count = rng.randrange(1, 300_000)
        assert buffered.read(count) == DATA[where : where + count]
    buffered.seek(0)
    assert buffered.read() == DATA
    buffered.close()


def test_a_lane_that_stops_near_the_end_finishes_the_copy(tmp_path):
    stream, source, ends, part = tee(tmp_path)
    stream.seek(len(DATA) - DRAIN_BYTES // 2)
    assert stream.read(10) == DATA[len(DATA) - DRAIN_BYTES // 2 :][:10]
    stream.close()
    assert ends == [f"{len(DATA)} {hashlib.sha256(DATA).hexdigest()}"]
    assert part.read_bytes() == DATA


def test_a_lane_that_stops_early_leaves_no_copy(tmp_path):
    stream, source, ends, part = tee(tmp_path)
    assert stream.read(1000) == DATA[:1000]
    stream.close()
    assert ends == ["partial"] and source.taken < 2 * DRAIN_BYTES
