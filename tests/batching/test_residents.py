"""A restore holds the buffer's residents as references and reads them in waves, when needed.

The first batch reads the first wave only; the byte budget counts the sizes the state carries,
so resume stays exact where the budget binds; a resident that cannot be read again raises the
ConfigError naming its shard and record, at the latest when it is needed.
"""

import json

import pytest

from shardmix import ConfigError, MixingLoader, ShardDataset
from shardmix.batching.residents import ResidentReads
from shardmix.reading.reader import sample_bytes
from shardmix.reading.shardreads import ShardReads
from shardmix.state.codec import pack_sizes, unpack_refs, unpack_sizes
from shardmix.testing import batch_fingerprint, check_resume, checkpoint_after, run_steps

from shards import UNEVEN_SIZES, write_shards


def loader_factory(pattern, *, num_workers=0, buffer_bytes=None, shuffle_buffer=64):
    def make():
        dataset = ShardDataset(pattern, seed=1, num_lanes=4)
        return MixingLoader(
            dataset,
            batch_size=8,
            num_workers=num_workers,
            shuffle_buffer=shuffle_buffer,
            shuffle_buffer_bytes=buffer_bytes,
            seed=1,
        )

    return make


def state_after(make, steps):
    loader = make()
    _, state = checkpoint_after(loader, 1, steps)
    loader.close()
    return state


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_is_exact_where_the_byte_budget_binds(uneven_shards, num_workers):
    one = sample_bytes(next(iter(ShardDataset(uneven_shards, seed=1))))
    make = loader_factory(uneven_shards, num_workers=num_workers, buffer_bytes=12 * one)
    state = state_after(make, 5)
    sizes = unpack_sizes(state["buffer"]["sizes"])
    assert len(sizes) == len(unpack_refs(state["buffer"]["items"])) < 64  # the budget binds
    assert sum(sizes) <= 13 * one and min(sizes) > 0
    check_resume(make, epochs=2, steps=[1, 3, 6, 9, 13, 17, 20])


# Batch 3: the buffer (warm-up 4 batches, 32 samples) is growing, half of what it took in;
# batch 10: it is full.
@pytest.mark.parametrize("steps, held", [(3, 32), (10, 64)], ids=["warming-up", "full"])
def test_the_first_batch_reads_the_first_wave_only(tmp_path, monkeypatch, steps, held):
    pattern = write_shards(tmp_path / "d", "tar", UNEVEN_SIZES, payload_bytes=16)
    make = loader_factory(pattern)
    state = state_after(make, steps)
    residents = len(unpack_refs(state["buffer"]["items"]))
    assert residents == held
    read = []
    original = ShardReads.read_records

    def spy(self, url, positions, **kwargs):
        for sample in original(self, url, positions, **kwargs):
            read.append((url, sample["__index__"]))
            yield sample

    monkeypatch.setattr(ShardReads, "read_records", spy)
    restored = make()
    restored.load_state_dict(state)
    batches = iter(restored)
    first = next(batches)
    assert len(read) == 8  # local shards: one batch of residents, those the first batch takes
    rest = [batch_fingerprint(batch) for batch in batches]
    assert len(read) == len(set(read)) == residents  # then every one, once
    reference = [batch_fingerprint(batch) for _, batch in run_steps(make(), 1)]
    assert [batch_fingerprint(first), *rest] == reference[steps:]


def test_a_resident_that_cannot_be_read_fails_when_its_wave_is_needed(tmp_path):
    pattern = write_shards(tmp_path / "d", "tar", UNEVEN_SIZES, payload_bytes=16)
    dataset = ShardDataset(pattern, seed=1)
    refs = [(3, 4, -1), (3, 5, -1), (1, 99, -1)]  # shard 1 has 23 records: no record 99
    reads = ResidentReads(dataset.reads, refs, [1, 1, 1], [0, 1, 2], first_wave=1, epoch=0)
    first, second, missing = reads.residents
    assert (first.wave, second.wave, missing.wave) == (0, 1, 1)
    assert reads.sample(first)["__index__"] == 4
    with pytest.raises(ConfigError, match=r"holds record 99 of .*part-0001\.tar") as caught:
        reads.sample(second)  # the same wave
    assert caught.value.url.endswith("part-0001.tar") and caught.value.record == 99


def test_a_state_whose_sizes_do_not_match_its_residents_is_refused(uneven_shards):
    make = loader_factory(uneven_shards)
    state = state_after(make, 4)
    state["buffer"]["sizes"] = pack_sizes([1, 2])
    restored = make()
    restored.load_state_dict(state)
    with pytest.raises(ConfigError, match=r"names \d+ residents but gives 2 sizes"):
        next(iter(restored))


def test_a_state_taken_before_the_residents_are_read_names_them_again(uneven_shards):
    make = loader_factory(uneven_shards)
    state = state_after(make, 4)
    restored = make()
    restored.load_state_dict(state)
    held = iter(restored)
    epoch = restored._start_epoch(held)  # what the first next() does, without taking a batch
    assert (epoch.buffer.slots < 0).any()  # residents not read yet: held by reference
    again = json.loads(json.dumps(restored.state_dict()))
    restored.close()
    assert again["buffer"] == state["buffer"]
