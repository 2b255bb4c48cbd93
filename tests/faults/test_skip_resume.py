"""A state saved after on_error="skip" passed over a damaged record resumes: the resumed epoch
gives the batches an uninterrupted one gives, damaged record left out, on one rank or two."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import pytest

from shardmix import ConfigError, MixingLoader, ShardDataset

from faultkit import tfrecord_offsets
from shards import expected_keys, write_shards

SIZES = [30, 12, 41, 25, 8, 33]
DAMAGED = "s002r00007"


def damaged_set(tmp_path: Path) -> str:
    pattern = write_shards(tmp_path, "tfrecord", SIZES)
    victim = tmp_path / "part-0002.tfrecord"
    data = bytearray(victim.read_bytes())
    data[tfrecord_offsets(bytes(data))[7] + 12 + 5] ^= 0x10  # a payload byte: its CRC fails
    victim.write_bytes(bytes(data))
    return pattern


def keys_of(loader: MixingLoader) -> list[list[str]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [list(batch["__key__"]) for batch in loader]


def saved_after(loader: MixingLoader, steps: int) -> tuple[list[list[str]], dict]:
    """The first ``steps`` batches' keys, and the state taken inside the loop after them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = iter(loader)
        keys = [list(next(batches)["__key__"]) for _ in range(steps)]
        return keys, json.loads(json.dumps(loader.state_dict()))


def on_ranks(
    pattern: str, rank: int, world_size: int, even_ranks: str, batch_size: int
) -> MixingLoader:
    """A loader of ``pattern`` skipping damage, as rank ``rank`` of ``world_size``."""
    return MixingLoader(
        ShardDataset(pattern, on_error="skip"),
        batch_size=batch_size,
        num_workers=0,
        shuffle_buffer=2 * batch_size,
        rank=rank,
        world_size=world_size,
        even_ranks=even_ranks,
    )


@pytest.mark.parametrize(("piece_records", "num_workers"), [(32, 0), (None, 0), (32, 2)])
def test_one_rank_resumes_after_a_skip(tmp_path, piece_records, num_workers):
    pattern = damaged_set(tmp_path)

    def make() -> MixingLoader:
        dataset = ShardDataset(pattern, on_error="skip", piece_records=piece_records)
        return MixingLoader(dataset, batch_size=16, num_workers=num_workers, shuffle_buffer=32)

    whole = keys_of(make())
    assert Counter(key for batch in whole for key in batch) == expected_keys(SIZES) - Counter(
        [DAMAGED]
    )
    for steps in (1, 4, len(whole) - 1):
        before, state = saved_after(make(), steps)
        resumed = make()
        resumed.load_state_dict(state)
        assert before + keys_of(resumed) == whole, steps


@pytest.mark.parametrize("even_ranks", ["pad", "drop", "none"])
def test_two_ranks_resume_after_a_skip(tmp_path, even_ranks):
    pattern = damaged_set(tmp_path)

    def make(rank: int) -> MixingLoader:
        return on_ranks(pattern, rank, 2, even_ranks, batch_size=8)

    for rank in (0, 1):
        whole = keys_of(make(rank))
        for steps in (1, 3, len(whole) - 1):
            before, state = saved_after(make(rank), steps)
            resumed = make(rank)
            resumed.load_state_dict(state)
            assert before + keys_of(resumed) == whole, (rank, steps)


def test_a_skip_in_the_rest_of_a_resized_epoch_is_refused_never_padded_over(tmp_path):
    pattern = damaged_set(tmp_path)

    def make(rank: int, world_size: int) -> MixingLoader:
        return on_ranks(pattern, rank, world_size, "none", batch_size=4)

    before, state = saved_after(make(0, 1), 3)  # the damaged record is read after the resize
    seen = Counter(key for batch in before for key in batch)
    refused = []
    for rank in range(3):
        resumed = make(rank, 3)
        resumed.load_state_dict(state)
        batches = iter(resumed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                for batch in batches:
                    seen.update(batch["__key__"])
            except ConfigError as error:
                refused.append((rank, str(error)))
    assert len(refused) == 1 and 'on_error="skip" skipped a sample on rank' in refused[0][1]
    assert max(seen.values()) == 1 and DAMAGED not in seen
    assert set(seen) <= set(expected_keys(SIZES))
