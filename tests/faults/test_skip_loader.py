"""on_error="skip" through MixingLoader's workers: counted in the main process, budgeted."""

from collections import Counter
from pathlib import Path

import pytest

from shardmix import CorruptShardError, MixingLoader, ShardDataset
from shardmix.errors import SkippedDataWarning, TooManySkipsError

from faultkit import tfrecord_offsets
from shards import expected_keys, write_shards

SIZES = [30, 12, 41, 25, 8, 33]


def damage_record(path: Path, record: int) -> None:
    data = bytearray(path.read_bytes())
    data[tfrecord_offsets(bytes(data))[record] + 12 + 5] ^= 0x10  # a payload byte
    path.write_bytes(bytes(data))


def damaged_set(tmp_path: Path) -> tuple[str, Path]:
    pattern = write_shards(tmp_path, "tfrecord", SIZES)
    victim = tmp_path / "part-0002.tfrecord"
    damage_record(victim, 7)
    return pattern, victim


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_delivers_everything_else_once_and_reports_the_skip(tmp_path, num_workers):
    pattern, victim = damaged_set(tmp_path)
    dataset = ShardDataset(pattern, on_error="skip")
    loader = MixingLoader(dataset, batch_size=16, num_workers=num_workers, shuffle_buffer=32)
    with pytest.warns(SkippedDataWarning, match=r"part-0002\.tfrecord.*record 7") as caught:
        keys = Counter(key for batch in loader for key in batch["__key__"])
    assert len(caught) == 1
    assert keys == expected_keys(SIZES) - Counter(["s002r00007"])
    skipped = loader.skipped
    assert skipped is not None
    assert (skipped["skips"], skipped["records"], skipped["shards_cut"]) == (1, 1, 0)
    assert list(skipped["shards"]) == [str(victim)]


def test_raise_is_the_default(tmp_path):
    pattern, _ = damaged_set(tmp_path)
    loader = MixingLoader(ShardDataset(pattern), batch_size=16, num_workers=2)
    with pytest.raises(CorruptShardError, match=r"part-0002\.tfrecord: record 7 at byte offset"):
        list(loader)
    assert loader.skipped is None


def test_skip_budget_stops_the_epoch_with_a_summary(tmp_path):
    pattern, _ = damaged_set(tmp_path)
    damage_record(tmp_path / "part-0003.tfrecord", 2)
    dataset = ShardDataset(pattern, on_error="skip", max_skips=1)
    loader = MixingLoader(dataset, batch_size=16, num_workers=2)
    with pytest.warns(SkippedDataWarning), pytest.raises(TooManySkipsError) as raised:
        list(loader)
    message = str(raised.value)
    assert "2 skips of damaged data, more than max_skips=1" in message
    assert "part-0002.tfrecord: record 7 at byte offset" in message
    assert "part-0003.tfrecord: record 2 at byte offset" in message
