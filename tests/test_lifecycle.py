"""A MixingLoader's life like a DataLoader's: lazy iter(), persistent workers, len(), arguments.

Worker processes are counted by the pids that ``worker_init_fn`` records in a file: one line
per worker process started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.data import IterableDataset

from shardmix import ConfigError, MixingLoader, ShardDataset, UnknownLengthError
from shardmix.testing import check_resume

from shards import UNEVEN_SIZES, batch_keys, expected_keys, write_shards


class RecordPid:
    """A worker_init_fn that appends the worker's pid to a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, worker_id: int) -> None:
        with open(self.path, "a") as out:
            out.write(f"{os.getpid()}\n")


def started(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def make(pattern: str, **kwargs) -> MixingLoader:
    options = {"batch_size": 8, "num_workers": 2, "shuffle_buffer": 32, "seed": 3, **kwargs}
    return MixingLoader(ShardDataset(pattern, seed=5, num_lanes=4), **options)


def keys_of(batches) -> list[str]:
    return [key for keys in batch_keys(batches) for key in keys]


@pytest.fixture
def pattern(tmp_path) -> str:
    return write_shards(tmp_path / "shards", "tar", UNEVEN_SIZES)


def test_iter_starts_nothing_and_a_dropped_iterator_uses_no_epoch(pattern, tmp_path):
    pids = tmp_path / "pids"
    loader = make(pattern, worker_init_fn=RecordPid(pids))
    reference = [keys_of(make(pattern)) for _ in range(1)]
    start = loader.state_dict()
    iterator = iter(loader)
    assert started(pids) == [] and loader.epoch == 0
    assert loader.state_dict() == start
    del iterator
    assert keys_of(loader) == reference[0]  # epoch 0, not epoch 1
    assert loader.epoch == 1 and len(started(pids)) == 2


def test_persistent_workers_serve_every_epoch_and_read_what_fresh_ones_would(pattern, tmp_path):
    persistent, fresh = tmp_path / "persistent", tmp_path / "fresh"
    loader = make(pattern, worker_init_fn=RecordPid(persistent))
    per_epoch = make(pattern, worker_init_fn=RecordPid(fresh), persistent_workers=False)
    for _ in range(3):
        epoch = keys_of(loader)
        assert epoch == keys_of(per_epoch)
        assert sorted(epoch) == sorted(expected_keys(UNEVEN_SIZES).elements())
    assert len(started(persistent)) == 2  # the same two processes, three epochs
    assert len(started(fresh)) == 6
    loader.close()
    assert loader.pool is not None and not loader.pool.started
    assert keys_of(loader) == keys_of(per_epoch)  # after close(), new workers read on
    assert len(started(persistent)) == 4


def test_breaking_mid_epoch_then_iterating_again_is_exact(pattern):
    reference = make(pattern)
    epochs = [keys_of(reference) for _ in range(3)]
    loader = make(pattern)
    for step, _ in enumerate(loader):
        if step == 2:
            break
    assert keys_of(loader) == epochs[1]  # the next iter() is the next epoch, nothing stale
    iterator = iter(loader)
    first = next(iterator)
    state = loader.state_dict()
    restored = make(pattern)
    restored.load_state_dict(state)
    assert keys_of([first]) + keys_of(restored) == epochs[2]


def open_shards(folder: Path) -> list[str]:
    """The files under ``folder`` this process holds open."""
    fds = Path("/proc/self/fd")
    targets = []
    for fd in fds.iterdir():
        try:
            targets.append(os.readlink(fd))
        except OSError:  # the listing's own descriptor, closed since
            continue
    return sorted(target for target in targets if target.startswith(str(folder)))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_close_shuts_the_shards_an_epoch_read_in_this_process(tmp_path):
    # Shards long enough that the lanes are mid-shard after three batches.
    pattern = write_shards(tmp_path / "shards", "tar", [900, 700, 800, 600])
    reference = make(pattern, num_workers=0)
    epochs = [keys_of(reference) for _ in range(2)]
    loader = make(pattern, num_workers=0)
    batches = iter(loader)
    first = [next(batches) for _ in range(3)]
    assert keys_of(first) == epochs[0][: len(keys_of(first))]
    assert open_shards(tmp_path / "shards")  # the lanes' shards, open mid-epoch
    loader.close()
    assert open_shards(tmp_path / "shards") == []
    assert keys_of(loader) == epochs[1]  # the next iter() is the next epoch, whole
    assert open_shards(tmp_path / "shards") == []  # an epoch read to its end closed them too


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_script_that_leaves_its_loader_open_exits_without_a_word(tmp_path, num_workers):
    pattern = write_shards(tmp_path / "shards", "tar", [900, 700, 800, 600])
    script = f"""
from shardmix import MixingLoader, ShardDataset
loader = MixingLoader(ShardDataset({pattern!r}, seed=5), batch_size=8, num_workers={num_workers})
seen = sum(len(batch["__key__"]) for batch in loader)  # a whole epoch
batches = iter(loader)
next(batches)  # and one begun, left open
print(seen)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stdout.split(), done.stderr) == (0, ["3000"], "")


@pytest.mark.parametrize("persistent", [True, False])
def test_resume_is_exact_with_persistent_workers_or_not(pattern, persistent):
    check_resume(lambda: make(pattern, persistent_workers=persistent), steps=[1, 5, 11, 20, 25])


def test_a_state_after_the_last_batch_is_the_next_epochs_start(pattern):
    # Lightning stops after len(loader) batches without asking for the StopIteration.
    loader = make(pattern)
    iterator = iter(loader)
    last = [next(iterator) for _ in range(len(loader))][-1]
    assert last is not None
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0)
    restored = make(pattern)
    restored.load_state_dict(state)
    reference = make(pattern)
    reference.set_epoch(1)
    assert keys_of(restored) == keys_of(reference)


@pytest.mark.parametrize(
    ("kwargs", "world"),
    [({}, None), ({"drop_last": True}, None)]
    + [({"even_ranks": even}, (rank, 4)) for even in ("drop", "pad") for rank in range(4)],
)
def test_len_is_the_number_of_batches_yielded(pattern, kwargs, world):
    if world is not None:
        kwargs = {**kwargs, "rank": world[0], "world_size": world[1]}
    for batch_size in (5, 8):
        loader = make(pattern, batch_size=batch_size, num_workers=0, **kwargs)
        for _ in range(2):
            length = len(loader)
            assert length == len(list(loader)) > 0


class Numbers(IterableDataset):
    def __iter__(self):
        return iter({"x": i} for i in range(10))


def test_len_without_record_counts_says_how_to_get_them():
    loader = MixingLoader(Numbers(), batch_size=4)
    with pytest.raises(UnknownLengthError, match=r"ShardDataset\(urls, record_counts=") as error:
        len(loader)
    assert isinstance(error.value, TypeError)  # what len() callers (Lightning) expect


@pytest.mark.parametrize(
    ("name", "instead"),
    [
        ("shuffle", r"ShardDataset\(shuffle_shards=\.\.\.\).*MixingLoader\(shuffle_buffer"),
        ("sampler", r"ShardDataset\(shuffle_shards"),
        ("batch_sampler", r"MixingLoader\(batch_size=\.\.\., drop_last"),
        ("generator", r"MixingLoader\(seed=\.\.\.\)"),
    ],
)
def test_dataloader_arguments_name_the_shardmix_equivalent(pattern, name, instead):
    with pytest.raises(ConfigError, match=f"DataLoader's {name}= argument; use {instead}"):
        make(pattern, **{name: True})
    with pytest.raises(ConfigError, match="unexpected keyword argument 'shufle'"):
        make(pattern, shufle=True)


def test_a_simulated_ranks_state_resumes_that_rank_only(pattern):
    loader = make(pattern, rank=0, world_size=2, num_workers=0)
    next(iter(loader))
    state = loader.state_dict()
    assert state["rank"] == 0 and state["ranks"] == {}
    other = make(pattern, rank=1, world_size=2, num_workers=0)
    with pytest.raises(ConfigError, match="cannot resume rank 1: .* called on every rank"):
        other.load_state_dict(state)
