"""Exact mid-epoch resume, through JSON, into fresh loaders (and a fresh process)."""

import json
import subprocess
import sys

import pytest

from shardmix import ConfigError, MixingLoader, ShardDataset
from shardmix.state.codec import unpack_refs
from shardmix.testing import batch_fingerprint, check_resume, checkpoint_after, run_steps

from shards import write_shards


def loader_factory(pattern, *, num_workers=2, shuffle_buffer=20, batch_size=8, seed=0):
    def make():
        dataset = ShardDataset(pattern, seed=seed, num_lanes=4)
        return MixingLoader(
            dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            shuffle_buffer=shuffle_buffer,
            seed=seed,
        )

    return make


def test_resume_after_every_batch_of_two_epochs(uneven_shards):
    report = check_resume(loader_factory(uneven_shards, num_workers=2), epochs=2)
    assert report.steps_checked == report.total_steps - 1 > 40


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_after_every_batch_while_the_buffer_warms_up(uneven_shards, num_workers):
    """A buffer of 100 at batch 4 emits from 16 residents on and would be full only after 200
    samples: each epoch of 185 runs in its warm-up, and resumes exactly from every batch."""
    make = loader_factory(uneven_shards, num_workers=num_workers, shuffle_buffer=100, batch_size=4)
    held = []
    loader = make()
    for _ in zip(range(8), loader, strict=False):
        held.append(len(unpack_refs(loader.state_dict()["buffer"]["items"])))
    loader.close()
    # 16 (4 batches) before the first sample leaves; from 32 taken in on, half of them.
    assert held == [16, 16, 16, 16, 18, 22, 26, 30]
    steps = None if num_workers == 0 else [1, 2, 3, 4, 5, 9, 20, 46, 47, 48, 60]
    report = check_resume(make, epochs=2, steps=steps)
    assert report.total_steps == 2 * 47


def test_resume_in_process_without_workers(uneven_shards):
    check_resume(loader_factory(uneven_shards, num_workers=0, shuffle_buffer=0), epochs=2)


def test_state_from_two_workers_resumes_with_four(uneven_shards):
    two = loader_factory(uneven_shards, num_workers=2)
    four = loader_factory(uneven_shards, num_workers=4)
    reference = [batch_fingerprint(b) for _, b in run_steps(two(), 2)]
    interrupted = two()
    _, state = checkpoint_after(interrupted, 2, 9)
    restored = four()
    restored.load_state_dict(state)
    assert [batch_fingerprint(b) for _, b in run_steps(restored, 2)] == reference[9:]


def test_state_between_epochs_resumes_at_the_next_epoch(uneven_shards):
    make = loader_factory(uneven_shards)
    reference = [batch_fingerprint(b) for _, b in run_steps(make(), 3)]
    loader = make()
    first_epoch = list(loader)
    restored = make()
    restored.load_state_dict(loader.state_dict())
    assert restored.epoch == 1
    assert [batch_fingerprint(b) for _, b in run_steps(restored, 3)] == reference[
        len(first_epoch) :
    ]


@pytest.mark.parametrize(
    ("change", "field"),
    [({"seed": 1}, "dataset_seed"), ({"shuffle_buffer": 10}, "shuffle_buffer")],
)
def test_state_from_other_settings_is_refused_naming_the_field(uneven_shards, change, field):
    loader = loader_factory(uneven_shards)()
    next(iter(loader))
    state = loader.state_dict()
    other = loader_factory(uneven_shards, **change)()
    with pytest.raises(ConfigError, match=rf"checkpoint's {field} is"):
        other.load_state_dict(state)


def test_state_from_other_data_is_refused(tmp_path):
    loader = loader_factory(write_shards(tmp_path / "a", "tar", [5, 5]))()
    next(iter(loader))
    other = loader_factory(write_shards(tmp_path / "b", "tar", [5, 5]))()
    with pytest.raises(ConfigError, match=r"checkpoint's shards is 'sha256:"):
        other.load_state_dict(loader.state_dict())


def test_resume_in_a_fresh_process(tmp_path):
    pattern = write_shards(tmp_path / "d", "tfrecord", [13, 2, 30, 8, 21])
    make = loader_factory(pattern)
    reference = [batch_fingerprint(b) for _, b in run_steps(make(), 2)]
    interrupted = make()
    _, state = checkpoint_after(interrupted, 2, 5)
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(state))
    script = f"""
import json, sys
from shardmix import MixingLoader, ShardDataset
from shardmix.testing import batch_fingerprint, run_steps
loader = MixingLoader(ShardDataset({pattern!r}, seed=0, num_lanes=4), batch_size=8,
                      num_workers=2, shuffle_buffer=20, seed=0)
loader.load_state_dict(json.load(open({str(state_file)!r})))
print(json.dumps([batch_fingerprint(b) for _, b in run_steps(loader, 2)]))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    ).stdout
    assert [tuple(map(tuple, batch)) for batch in json.loads(out)] == reference[5:]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_resume_with_a_large_buffer_on_32_shards(tmp_path, fmt):
    sizes = [500 + 37 * (i % 9) for i in range(32)]
    pattern = write_shards(tmp_path, fmt, sizes, payload_bytes=8)

    def make():
        return MixingLoader(
            ShardDataset(pattern, seed=3), batch_size=64, num_workers=2, shuffle_buffer=10_000
        )

    total = -(-sum(sizes) // 64)
    report = check_resume(make, epochs=1, steps=[1, 37, total // 2, total - 1])
    assert report.total_steps == total
    assert report.steps_checked == 4
    # The buffer's 10,000 references and their record tags are in the state (an empty buffer
    # packs to ~1 KiB; the tags, 2 bytes each before base64, add ~27 KiB).
    assert 5_000 < report.largest_state_bytes < 96 * 1024
