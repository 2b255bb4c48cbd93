"""``timeout=`` is time without progress, as DataLoader's: a slow transform over big chunks
does not trip it; a worker that reads nothing for ``timeout`` seconds does, named.

A chunk of 512 samples at 3 ms each takes about 1.5 s, three times ``timeout=0.5``.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset, WorkerError
from shardmix.workers import dataloader as workers_module

from shards import record_key, write_shards

CHUNK = 512
SLOW_SECONDS = 0.003


class Slow:
    """3 ms per sample; at the sample keyed ``stall`` (if any), a minute."""

    def __init__(self, stall: str | None = None) -> None:
        self.stall = stall

    def __call__(self, sample: dict) -> dict:
        time.sleep(60 if sample["__key__"] == self.stall else SLOW_SECONDS)
        return sample


def keys_of(loader: MixingLoader) -> Counter[str]:
    return Counter(key for batch in loader for key in batch["__key__"])


@pytest.fixture
def pattern(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(workers_module, "CHUNK_SAMPLES", CHUNK)
    return write_shards(tmp_path / "shards", "tar", [600])


@pytest.mark.parametrize("persistent", [True, False])
def test_a_slow_transform_over_a_big_chunk_does_not_trip_the_timeout(
    pattern: str, persistent: bool
) -> None:
    dataset = ShardDataset(pattern, transform=Slow(), num_lanes=1)
    loader = MixingLoader(
        dataset,
        batch_size=50,
        num_workers=1,
        shuffle_buffer=0,
        timeout=0.5,
        persistent_workers=persistent,
    )
    try:
        assert keys_of(loader) == Counter(record_key(0, record) for record in range(600))
    finally:
        loader.close()


def test_a_worker_that_reads_nothing_trips_the_timeout_named(pattern: str) -> None:
    dataset = ShardDataset(pattern, transform=Slow(stall=record_key(0, 5)), num_lanes=1)
    loader = MixingLoader(dataset, batch_size=50, num_workers=1, shuffle_buffer=0, timeout=0.5)
    try:
        with pytest.raises(WorkerError) as raised:
            keys_of(loader)
    finally:
        loader.close()
    message = str(raised.value)
    assert message.startswith(
        "epoch 0: DataLoader timed out after 0.5 seconds without progress: worker 0 (pid "
    )
    assert message.endswith(
        ", which owes the next chunk, read no sample in that time; raise timeout= if one "
        "sample can take longer, or pass 0 to wait forever"
    )
