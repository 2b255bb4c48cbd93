"""The bounded cache (``cache_limit``) end to end: a 127.0.0.1 server, real DataLoader
workers, two epochs over a set three times the limit, two jobs on one folder, SIGKILL."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.errors import ConfigError
from shardmix.sources import ReadAhead, SourceOptions, open_shard
from shardmix.sources.cache.bounded import MIN_PART_BYTES, cache_counters
from shardmix.sources.cache.ledger import LEDGER_NAME, CacheLedger, alive
from shardmix.sources.cache.store import cache_path

from shards import expected_keys, write_manifest_beside, write_shards

SIZES = [40, 55, 30, 62, 47, 35, 58, 44, 51, 38, 60, 42]
PATTERN = "data/part-{0000..0011}.tar"


def cache_bytes(folder: Path) -> int:
    """What the files in the cache folder hold, beside the ledger itself."""
    total = 0
    for entry in os.scandir(folder) if folder.is_dir() else ():
        if not entry.name.startswith(LEDGER_NAME):
            with suppress(FileNotFoundError):  # evicted between the listing and the stat
                total += entry.stat().st_size
    return total


@contextmanager
def sampled(folder: Path) -> Iterator[list[int]]:
    """The cache folder's size, sampled every 100 ms while the block runs."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            samples.append(cache_bytes(folder))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()
        samples.append(cache_bytes(folder))


@pytest.fixture
def remote_set(server):
    base, state = server
    write_shards(state.root / "data", "tar", SIZES, payload_bytes=2000)
    write_manifest_beside(state.root / "data", "tar")
    sizes = [path.stat().st_size for path in sorted((state.root / "data").glob("*.tar"))]
    return f"{base}/{PATTERN}", state, sizes


def keys_of(loader: MixingLoader) -> Counter[str]:
    return Counter(key for batch in loader for key in batch["__key__"])


def check_ledger(folder: Path, limit: int) -> None:
    """No leftovers: every file the cache holds is a ready copy in the ledger, within the
    limit, and no dead process holds a lease, a plan or a copy being filled."""
    ledger = CacheLedger(str(folder))  # opening it reclaims what the dead held
    rows = dict(ledger._rows("SELECT path, size FROM entries WHERE state = 'ready'"))
    files = {
        str(folder / name): (folder / name).stat().st_size
        for name in os.listdir(folder)
        if not name.startswith(LEDGER_NAME)
    }
    assert files == rows
    assert sum(files.values()) <= limit
    assert ledger._rows("SELECT * FROM entries WHERE state != 'ready'") == []
    assert ledger._rows("SELECT * FROM leases") == []
    assert [owner for (owner,) in ledger._rows("SELECT owner FROM plans") if not alive(owner)] == []


@pytest.mark.parametrize("read_ahead", [None, ReadAhead(blocks=2, block_bytes=32 << 10)])
def test_two_epochs_over_a_set_three_times_the_limit(remote_set, tmp_path, read_ahead):
    url, state, sizes = remote_set
    limit = sum(sizes) // 3
    cache = tmp_path / "cache"
    options = SourceOptions(cache_dir=str(cache), cache_limit=limit, read_ahead=read_ahead)
    dataset = ShardDataset(url, source_options=options, num_lanes=4)
    # What read-ahead may fetch of shards the cache then serves: each lane's next shard's start.
    window = 0 if read_ahead is None else 4 * read_ahead.blocks * read_ahead.block_bytes
    loader = MixingLoader(dataset, batch_size=32, num_workers=2)
    fetched = []
    with sampled(cache) as samples:
        for epoch in range(2):
            before = state.sent
            loader.set_epoch(epoch)
            assert keys_of(loader) == expected_keys(SIZES)
            fetched.append(state.sent - before)
    assert max(samples) <= limit
    assert fetched[0] >= sum(sizes)
    # Epoch 2 fetches what the cache could not hold: the set less the limit, but for less
    # than a block of room under the limit that no copy could take.
    assert fetched[1] <= sum(sizes) - limit + MIN_PART_BYTES + window, (fetched, limit)
    check_ledger(cache, limit)
    print(f"set {sum(sizes):,} limit {limit:,} fetched {fetched} max {max(samples):,}")


JOB = """
import json, sys
from collections import Counter
from shardmix import MixingLoader, ShardDataset
from shardmix.sources import SourceOptions
options = SourceOptions(cache_dir={cache!r}, cache_limit={limit})
dataset = ShardDataset({url!r}, source_options=options, num_lanes=4, seed={seed})
loader = MixingLoader(dataset, batch_size=16, num_workers=2)
for epoch in range(2):
    loader.set_epoch(epoch)
    keys = Counter()
    for number, batch in enumerate(loader):
        keys.update(batch["__key__"])
        if {stop_after} and number == {stop_after}:
            print("reading", flush=True)
            sys.stdin.readline()  # held here, mid-epoch, until killed
    print(json.dumps(keys), flush=True)
"""


def job(url: str, cache: Path, limit: int, seed: int = 0, stop_after: int = 0) -> subprocess.Popen:
    script = JOB.format(url=url, cache=str(cache), limit=limit, seed=seed, stop_after=stop_after)
    return subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a SIGKILL reaches its workers too
    )


@pytest.mark.slow  # processes started and killed
def test_two_jobs_on_one_folder_stay_within_the_limit_together(remote_set, tmp_path):
    url, state, sizes = remote_set
    limit = sum(sizes) // 3
    cache = tmp_path / "cache"
    with sampled(cache) as samples:
        jobs = [job(url, cache, limit, seed=seed) for seed in (1, 2)]
        outputs = [process.communicate(timeout=300)[0] for process in jobs]
    assert [process.returncode for process in jobs] == [0, 0]
    for output in outputs:
        epochs = [Counter(json.loads(line)) for line in output.splitlines()]
        assert epochs == [expected_keys(SIZES)] * 2
    assert max(samples) <= limit
    check_ledger(cache, limit)


def _open_ledger(folder: str, start: Any, results: Any) -> None:
    start.wait()
    try:
        CacheLedger(folder)
        results.put("opened")
    except Exception as error:  # reported to the test, which names it
        results.put(repr(error))


@pytest.mark.slow  # 40 processes
def test_processes_that_open_a_new_folder_at_once_all_open_it(tmp_path):
    # Two jobs that start on an empty folder race to make its ledger; the one that lost the race
    # to switch SQLite's log on used to delete the database under the other.
    context = multiprocessing.get_context("fork")
    for round_ in range(10):
        folder = str(tmp_path / f"cache-{round_}")
        start, results = context.Barrier(4), context.Queue()
        processes = [
            context.Process(target=_open_ledger, args=(folder, start, results)) for _ in range(4)
        ]
        for process in processes:
            process.start()
        outcomes = [results.get(timeout=120) for _ in processes]
        for process in processes:
            process.join()
        assert outcomes == ["opened"] * 4, f"round {round_}"
        assert [process.exitcode for process in processes] == [0] * 4


@pytest.mark.slow  # processes started and killed
def test_a_job_killed_mid_epoch_leaves_nothing_a_rerun_trips_on(remote_set, tmp_path):
    url, state, sizes = remote_set
    limit = sum(sizes) // 3
    cache = tmp_path / "cache"
    killed = job(url, cache, limit, stop_after=3)
    assert killed.stdout is not None and killed.stdout.readline() == "reading\n"
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=60)
    rerun = job(url, cache, limit)
    output = rerun.communicate(timeout=300)[0]
    assert rerun.returncode == 0
    assert [Counter(json.loads(line)) for line in output.splitlines()] == [expected_keys(SIZES)] * 2
    check_ledger(cache, limit)


KILLED_WHILE_FILLING = """
import os, signal
from shardmix.sources import ReadAhead, SourceOptions, open_shard
options = SourceOptions(cache_dir={cache!r}, cache_limit={limit})
leased = open_shard({first!r}, options=options)  # a copy made by the first run, leased
filling = open_shard({second!r}, options=options)
filling.read(5000)  # half a copy written, its reservation held
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow  # processes started and killed
def test_a_kill_while_filling_and_leasing_is_reclaimed(remote_set, tmp_path):
    url, state, sizes = remote_set
    base = url.rsplit("/", 1)[0]
    first, second = f"{base}/part-0000.tar", f"{base}/part-0001.tar"
    cache = tmp_path / "cache"
    options = SourceOptions(cache_dir=str(cache), cache_limit=sum(sizes))
    with open_shard(first, options=options) as stream:
        assert len(stream.read()) == sizes[0]
    script = KILLED_WHILE_FILLING.format(
        cache=str(cache), limit=sum(sizes), first=first, second=second
    )
    result = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert result.returncode == -signal.SIGKILL
    assert any(name.endswith(".part") for name in os.listdir(cache))  # left by the kill
    check_ledger(cache, sizes[0])
    assert os.path.isfile(cache_path(str(cache), first))  # the first run's copy stays


def test_a_leased_copy_is_never_evicted(remote_set, tmp_path):
    url, state, sizes = remote_set
    base = url.rsplit("/", 1)[0]
    cache = tmp_path / "cache"
    options = SourceOptions(cache_dir=str(cache), cache_limit=max(sizes[:3]) + 1)
    shards = [f"{base}/part-{index:04d}.tar" for index in range(3)]
    with open_shard(shards[0], options=options) as stream:
        stream.read()
    before = cache_counters()
    with open_shard(shards[0], options=options) as held:  # a hit: leased while open
        for shard, size in zip(shards[1:], sizes[1:3], strict=True):
            with open_shard(shard, options=options) as other:
                assert len(other.read()) == size  # streamed, not cached: less than a block free
        assert held.read() == (state.root / "data" / "part-0000.tar").read_bytes()
    after = cache_counters()
    assert (after.hits - before.hits, after.uncached - before.uncached) == (1, 2)
    copies = sorted(name for name in os.listdir(cache) if not name.startswith(LEDGER_NAME))
    assert copies == [os.path.basename(cache_path(str(cache), shards[0]))]
    # Released, it gives way to the next shard read.
    with open_shard(shards[1], options=options) as stream:
        stream.read()
    copies = sorted(name for name in os.listdir(cache) if not name.startswith(LEDGER_NAME))
    assert copies == [os.path.basename(cache_path(str(cache), shards[1]))]


def test_a_limit_needs_a_folder():
    with pytest.raises(ConfigError, match="cache_dir is not set"):
        SourceOptions(cache_limit=1 << 30)
    with pytest.raises(ConfigError, match="cache_limit must be a number of bytes > 0"):
        SourceOptions(cache_dir="/tmp/c", cache_limit=0)


def test_local_shards_in_the_folder_are_never_touched(tmp_path, remote_set):
    url, state, sizes = remote_set
    cache = tmp_path / "cache"
    write_shards(cache, "tar", [5, 6])  # a user's own shards, in the cache folder
    own = {path.name: path.read_bytes() for path in cache.glob("*.tar")}
    options = SourceOptions(cache_dir=str(cache), cache_limit=max(sizes) + 1)
    local = ShardDataset(str(cache / "part-{0000..0001}.tar"), source_options=options)
    assert Counter(sample["__key__"] for sample in local) == expected_keys([5, 6])
    remote = ShardDataset(url, source_options=options, num_lanes=2)
    assert Counter(sample["__key__"] for sample in remote) == expected_keys(SIZES)
    assert {path.name: path.read_bytes() for path in cache.glob("part-*.tar")} == own


def test_a_shard_rewritten_at_the_server_is_fetched_again(remote_set, tmp_path, monkeypatch):
    import shardmix.sources.version as version

    url, state, sizes = remote_set
    base = url.rsplit("/", 1)[0]
    shard = f"{base}/part-0000.tar"
    options = SourceOptions(cache_dir=str(tmp_path / "cache"), cache_limit=sum(sizes))
    with open_shard(shard, options=options) as stream:
        stream.read()
    (state.root / "data" / "part-0000.tar").write_bytes(b"new bytes")
    state.etags["data/part-0000.tar"] = '"v2"'
    monkeypatch.setattr(version, "_REVALIDATED", {})  # a new job: the version asked anew
    with open_shard(shard, options=options) as stream:
        assert stream.read() == b"new bytes"
    with open_shard(shard, options=options) as stream:  # and the new copy is kept
        assert stream.read() == b"new bytes"
    assert Path(cache_path(str(tmp_path / "cache"), shard)).read_bytes() == b"new bytes"


def test_fsspec_shards_go_through_the_bounded_cache(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    data = {f"/bounded/s{index}.bin": bytes([index]) * 3000 for index in range(4)}
    for path, body in data.items():
        memory.pipe(path, body)
    cache = tmp_path / "cache"
    options = SourceOptions(cache_dir=str(cache), cache_limit=6500)
    before = cache_counters()
    for _ in range(2):
        for path, body in data.items():
            with open_shard(f"memory://{path}", options=options) as stream:
                assert stream.read() == body
            assert cache_bytes(cache) <= 6500
    after = cache_counters()
    assert after.misses - before.misses == 8 - (after.hits - before.hits)
    assert after.evictions > before.evictions


def test_a_resume_mid_shard_fetches_the_rest_only(remote_set, tmp_path):
    url, state, sizes = remote_set
    shard = f"{url.rsplit('/', 1)[0]}/part-0002.tar"
    data = (state.root / "data" / "part-0002.tar").read_bytes()
    cache = tmp_path / "cache"
    options = SourceOptions(cache_dir=str(cache), cache_limit=sum(sizes))
    with open_shard(shard, options=options, offset=10240) as stream:
        stream.seek(10240)
        assert stream.read() == data[10240:]
    assert state.requests == [("data/part-0002.tar", "bytes=10240-")]
    assert not os.path.exists(cache_path(str(cache), shard))  # a part of a shard is no copy
    with open_shard(shard, options=options) as stream:
        assert stream.read() == data
    with open_shard(shard, options=options, offset=10240) as stream:  # from the copy now
        stream.seek(10240)
        assert stream.read() == data[10240:]
    assert [name for name, _ in state.requests] == ["data/part-0002.tar"] * 2


def test_every_dataset_of_a_mixture_shares_the_limit(server, tmp_path):
    base, state = server
    # Records of 4 KB: half the two sets is still the 7 lanes' blocks (cacheroom's minimum).
    write_shards(state.root / "web", "tar", [30, 45, 25, 40], payload_bytes=4000)
    write_shards(state.root / "code", "tar", [35, 20, 50], payload_bytes=4000)
    sizes = [path.stat().st_size for path in sorted(state.root.glob("*/part-*"))]

    def mixture_keys(options: SourceOptions) -> Counter[tuple[str, str]]:
        datasets = {
            "web": ShardDataset(f"{base}/web/part-{{0000..0003}}.tar", source_options=options),
            "code": ShardDataset(f"{base}/code/part-{{0000..0002}}.tar", source_options=options),
        }
        loader = MixingLoader(  # every dataset read whole at least once
            datasets,
            weights={"web": 1, "code": 1},
            batch_size=8,
            num_workers=1,
            seed=3,
            stopping="all_exhausted",
        )
        return Counter(
            pair
            for batch in loader
            for pair in zip(batch["__dataset__"], batch["__key__"], strict=True)
        )

    expected = mixture_keys(SourceOptions())
    assert len(expected) > 0
    for limit in (sum(sizes) // 2, sum(sizes)):  # half the two sets, then room for both
        cache = tmp_path / f"cache-{limit}"
        with sampled(cache) as samples:
            cached = mixture_keys(SourceOptions(cache_dir=str(cache), cache_limit=limit))
        assert cached == expected
        assert max(samples) <= limit
        check_ledger(cache, limit)
    urls = {row[0] for row in CacheLedger(str(cache))._rows("SELECT url FROM entries")}
    assert {url.split("/")[3] for url in urls} == {"web", "code"}  # both datasets cached


def test_a_shard_larger_than_the_room_left_is_cached_in_part(remote_set, tmp_path):
    url, state, sizes = remote_set
    base = url.rsplit("/", 1)[0]
    shards = [f"{base}/part-{index:04d}.tar" for index in range(2)]
    data = [(state.root / "data" / f"part-{index:04d}.tar").read_bytes() for index in range(2)]
    cache = tmp_path / "cache"
    room = sizes[0] + MIN_PART_BYTES + 1000  # the first shard, and a part of the second
    options = SourceOptions(cache_dir=str(cache), cache_limit=room)
    with open_shard(shards[0], options=options) as first:  # leased: it stays
        assert first.read() == data[0]
        with open_shard(shards[1], options=options) as second:
            assert second.read() == data[1]
    part = Path(cache_path(str(cache), shards[1]))
    assert part.read_bytes() == data[1][: MIN_PART_BYTES + 1000]
    del state.requests[:]
    for offset in (0, 5000, MIN_PART_BYTES + 3000):
        with open_shard(shards[1], options=options) as stream:
            stream.seek(offset)
            assert stream.read() == data[1][offset:]
    # The copy's part is read from disk; only the rest is asked for, once per read.
    assert state.requests == [("data/part-0001.tar", f"bytes={MIN_PART_BYTES + 1000}-")] * 2 + [
        ("data/part-0001.tar", f"bytes={MIN_PART_BYTES + 3000}-")
    ]
    assert cache_bytes(cache) <= room
    check_ledger(cache, room)


FULL_DISK = """
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({cap}, {cap}))
from shardmix.errors import CacheFullError
from shardmix.sources import SourceOptions, open_shard
options = SourceOptions(cache_dir={cache!r}, cache_limit=1 << 30)
try:
    with open_shard({url!r}, options=options) as stream:
        stream.read()
except CacheFullError as error:
    print(error.offset, error)
"""


@pytest.mark.slow  # processes started and killed
def test_a_full_disk_is_named_and_leaves_no_partial_copy(server, tmp_path):
    base, state = server
    (state.root / "big.bin").write_bytes(os.urandom(1_000_000))
    cache, cap = tmp_path / "cache", 300_000
    script = FULL_DISK.format(cap=cap, cache=str(cache), url=f"{base}/big.bin")
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    offset, message = result.stdout.split(" ", 1)
    assert int(offset) <= cap
    assert message.startswith(f"{base}/big.bin: the cache's disk is full")
    assert "the partial copy is removed" in message
    check_ledger(cache, 0)  # no copy, no reservation, nothing of the dead process
