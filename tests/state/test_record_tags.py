"""Each position a checkpoint holds carries its record's tag (state version 11): a lane's offset
moved onto another record, or residents whose record indices were shifted, are refused by
name on restore, never read as other samples; an untouched state resumes exactly."""

from __future__ import annotations

import copy
from collections import Counter

import pytest

from shardmix import ConfigError, MixingLoader, ShardDataset
from shardmix.formats import infer_format
from shardmix.reading.reader import read_shard
from shardmix.state.codec import pack_refs, unpack_refs, unpack_tags
from shardmix.testing import checkpoint_after

from shards import batch_keys, expected_keys, write_shards

SIZES = [14, 9, 17, 11]
STEP = 4  # batches before the checkpoint


@pytest.fixture(scope="module", params=["tar", "tfrecord"])
def shards(request, tmp_path_factory):
    fmt = request.param
    return write_shards(tmp_path_factory.mktemp(f"tags-{fmt}"), fmt, SIZES)


def make(pattern: str, num_workers: int = 0, transform=None) -> MixingLoader:
    dataset = ShardDataset(pattern, seed=5, num_lanes=4, transform=transform)
    return MixingLoader(dataset, batch_size=4, num_workers=num_workers, seed=5, shuffle_buffer=6)


def saved(pattern: str, num_workers: int = 0, transform=None) -> tuple[list, dict]:
    loader = make(pattern, num_workers, transform)
    before, state = checkpoint_after(loader, 1, STEP)
    loader.close()
    return batch_keys(before), state


def resumed_keys(pattern: str, state: dict, num_workers: int = 0, transform=None) -> list:
    loader = make(pattern, num_workers, transform)
    loader.load_state_dict(state)
    try:
        return batch_keys(loader)
    finally:
        loader.close()


def keep_key(sample):
    return {"__key__": sample["__key__"]}  # read sample by sample: no record blocks


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_untouched_state_resumes_with_every_sample_once(shards, num_workers):
    before, state = saved(shards, num_workers)
    assert state["version"] >= 11  # tags since version 11
    assert all(lane[6] for lane in state["mixer"]["lanes"] if lane[1] > 0)
    tags = unpack_tags(state["buffer"]["tags"], len(unpack_refs(state["buffer"]["items"])))
    assert tags and all(tags)
    after = resumed_keys(shards, state, num_workers)
    whole = make(shards, num_workers)
    uninterrupted = Counter(key for batch in batch_keys(whole) for key in batch)
    whole.close()
    assert Counter(key for batch in before + after for key in batch) == uninterrupted
    assert uninterrupted == expected_keys(SIZES)


def _offsets(pattern: str, state: dict, shard: int) -> list[int]:
    url = pattern.replace("{0000..0003}", f"{shard:04d}")
    return [sample["__offset__"] for sample in read_shard(url, infer_format(url))]


@pytest.mark.parametrize(("num_workers", "transform"), [(0, None), (2, None), (0, keep_key)])
def test_a_lane_offset_moved_onto_another_record_is_refused(shards, num_workers, transform):
    _, state = saved(shards, num_workers, transform)
    lanes = state["mixer"]["lanes"]
    lane = next(at for at, lane in enumerate(lanes) if lane[1] >= 2 and lane[2] > 0)
    slot, record, offset, shard = lanes[lane][:4]
    moved = _offsets(shards, state, shard)[record - 2]  # the record before the last delivered
    assert moved != offset
    edited = copy.deepcopy(state)
    edited["mixer"]["lanes"][lane][2] = moved
    url = shards.replace("{0000..0003}", f"{shard:04d}")
    with pytest.raises(ConfigError, match="lane resumes after record") as caught:
        resumed_keys(shards, edited, num_workers, transform)
    message = str(caught.value)
    assert url in message
    assert f"record {record - 1} " in message and f"byte offset {moved}" in message
    assert f"tag {lanes[lane][6]:#06x}" in message
    assert "resume from an untouched checkpoint" in message


@pytest.mark.parametrize("edit", ["records", "offsets"])
def test_residents_shifted_onto_other_records_are_refused(shards, edit):
    _, state = saved(shards)
    refs = unpack_refs(state["buffer"]["items"])
    if edit == "records":  # every index one up, the offsets left: each names the next record
        shifted = [(shard, record + 1, offset) for shard, record, offset in refs]
    else:  # the offsets one resident along: each names another resident's record
        offsets = [offset for _, _, offset in refs]
        shifted = [
            (shard, record, offset)
            for (shard, record, _), offset in zip(refs, offsets[1:] + offsets[:1], strict=True)
        ]
    edited = copy.deepcopy(state)
    edited["buffer"]["items"] = pack_refs(shifted)
    with pytest.raises(ConfigError) as caught:
        resumed_keys(shards, edited)
    message = str(caught.value)
    if "'buffer.items' should hold" in message:  # a resident the lanes will read, or a twin
        assert edit == "records" and "the state was edited or damaged" in message
        return
    assert "shuffle buffer holds record" in message
    assert "but the record read there has tag" in message
    assert "resume from an untouched checkpoint over the same data" in message


def test_a_state_without_tags_is_refused_by_name(shards):
    _, state = saved(shards)
    edited = copy.deepcopy(state)
    edited["buffer"]["tags"] = edited["buffer"]["tags"][:-4]
    with pytest.raises(ConfigError, match="'buffer.tags'"):
        resumed_keys(shards, edited)
    del edited["buffer"]["tags"]
    with pytest.raises(ConfigError, match="no 'buffer.tags' field"):
        resumed_keys(shards, edited)


def test_no_batch_sample_or_transform_sees_a_tag(shards):
    seen = []

    def look(sample):
        seen.append(set(sample))
        return sample

    for transform in (None, look):
        dataset = ShardDataset(shards, seed=5, transform=transform)
        assert all("__tag__" not in sample for sample in dataset)
        loader = MixingLoader(dataset, batch_size=4, num_workers=0, seed=5)
        batches = list(loader)
        loader.close()
        assert all("__tag__" not in batch for batch in batches)
        assert Counter(key for batch in batch_keys(batches) for key in batch) == expected_keys(
            SIZES
        )
    assert seen and all("__tag__" not in fields for fields in seen)
