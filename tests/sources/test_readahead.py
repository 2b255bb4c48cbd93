"""Read-ahead over a 127.0.0.1 HTTP server: shards fetched in blocks ahead of the reader, every
byte once, a lane's next shard fetched before the lane opens it, one version per shard."""

from __future__ import annotations

import time
import warnings
from collections import Counter
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.errors import ShardChangedError, UnvalidatedShardWarning
from shardmix.sources import ReadAhead, RetryPolicy, SourceOptions
from shardmix.sources.http.readahead import follow, forget, open_blocks
from shardmix.sources.http.validators import SEAM_BYTES
from shardmix.sources.traffic import take_traffic

from shards import expected_keys, write_shards

SIZES = [9, 30, 4, 17, 25, 1, 12, 20]
FAST = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05, read_timeout=5.0)
BLOCK = 4096  # a few blocks per shard


def shard_files(state) -> list[Path]:
    write_shards(state.root / "data", "tar", SIZES, payload_bytes=2000)
    return sorted((state.root / "data").glob("*.tar"))


def blocks_of(size: int, block: int) -> int:
    return -(-size // block)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_sample_once_and_every_byte_fetched_once(server, num_workers):
    base, state = server
    files = shard_files(state)
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=3, block_bytes=BLOCK))
    dataset = ShardDataset(f"{base}/data/part-{{0000..0007}}.tar", source_options=options)
    loader = MixingLoader(dataset, batch_size=8, num_workers=num_workers, shuffle_buffer=32)
    keys = Counter(key for batch in loader for key in batch["__key__"])
    assert keys == expected_keys(SIZES)
    total = sum(path.stat().st_size for path in files)
    assert state.sent == total  # no block fetched twice, none past a shard's end
    ranges = Counter(name for name, _ in state.requests if name.endswith(".tar"))
    assert ranges == {f"data/{p.name}": blocks_of(p.stat().st_size, BLOCK) for p in files}
    assert all(header is not None for name, header in state.requests if name.endswith(".tar"))
    assert loader.stats().bytes == {base: total}


def test_the_next_shard_is_fetched_before_the_lane_opens_it(server):
    base, state = server
    first, second = shard_files(state)[:2]
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=2, block_bytes=BLOCK))
    url_first, url_second = f"{base}/data/{first.name}", f"{base}/data/{second.name}"
    take_traffic()
    follow(url_first, url_second, options)
    with open_blocks(url_first, options) as stream:
        assert stream.read() == first.read_bytes()
    # Its last block asked for, the next shard's first one was asked for too: wait for it.
    from shardmix.sources.http import readahead

    waiting = readahead._waiting[url_second]
    waiting._futures[0].result(timeout=30)
    # Its size known from the first block, the window's other block is asked for too (by the
    # first block's callback, which may run after result() returned: wait for it).
    expected = min(2, blocks_of(second.stat().st_size, BLOCK))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        asked = [name for name, _ in state.requests]
        if asked.count(f"data/{second.name}") >= expected:
            break
        time.sleep(0.01)
    assert asked.count(f"data/{second.name}") == expected
    with open_blocks(url_second, options) as stream:
        assert stream.read() == second.read_bytes()
    traffic = take_traffic()
    assert traffic.stalls == 1  # the first shard's start only: the second was there
    assert traffic.bytes == {base: first.stat().st_size + second.stat().st_size}
    assert url_second not in readahead._waiting


def test_a_lane_that_ends_early_drops_the_shard_it_started(server):
    base, state = server
    first, second = shard_files(state)[:2]
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=1, block_bytes=1 << 20))
    url_first, url_second = f"{base}/data/{first.name}", f"{base}/data/{second.name}"
    from shardmix.sources.http import readahead

    follow(url_first, url_second, options)
    with open_blocks(url_first, options) as stream:
        stream.read(10)
    # One block holds the whole first shard: once it came, the second was started.
    deadline = time.monotonic() + 30
    while url_second not in readahead._waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    assert url_second in readahead._waiting
    forget(url_first)
    assert url_second not in readahead._waiting and url_first not in readahead._following


def test_a_shard_replaced_between_two_blocks_is_refused(server):
    base, state = server
    first = shard_files(state)[1]
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=1, block_bytes=BLOCK))
    with open_blocks(f"{base}/data/{first.name}", options) as stream:
        head = stream.read(BLOCK - 100)  # inside the first block: the second is not asked yet
        assert head == first.read_bytes()[: BLOCK - 100]
        state.etags[f"data/{first.name}"] = '"v2"'
        with pytest.raises(ShardChangedError, match=r"expected .*v1.*, found .*v2"):
            stream.read()


@pytest.mark.parametrize("blocks", [1, 3])
def test_without_validator_a_shard_replaced_between_two_blocks_is_refused_at_the_seam(
    server, blocks
):
    base, state = server
    path = shard_files(state)[1]
    name = f"data/{path.name}"
    state.etags[name] = ""  # the server gives no ETag (nor Last-Modified)
    old = path.read_bytes()
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=blocks, block_bytes=BLOCK))
    read = b""
    with (
        pytest.warns(UnvalidatedShardWarning),
        open_blocks(f"{base}/{name}", options) as stream,
    ):
        read += stream.read(BLOCK - 100)  # inside the first block
        replacement = path.with_suffix(".new")
        replacement.write_bytes(bytes(byte ^ 0xFF for byte in old))  # same size, other bytes
        replacement.replace(path)  # at once: no answer sees a file half written
        with pytest.raises(ShardChangedError) as caught:
            while part := stream.read(1000):
                read += part
    assert read == old[: len(read)]  # never a byte of the new version
    seam = caught.value.offset  # where the block fetched from the new version begins
    assert seam % BLOCK == 0 and len(read) <= seam < len(old)
    assert str(caught.value) == (
        f"{base}/{name}: at byte offset {seam}: the shard changed while it was being read "
        f"(expected the {SEAM_BYTES} bytes before this offset as first read, found other bytes "
        "there (the server gives no validator; the shard was replaced by one of the same "
        "size)); nothing of the new version was used. Read it again from the start (a new "
        "epoch plans it anew), or restore the version that was read"
    )
    asked = [wanted for at, wanted in state.requests if at == name]
    assert asked[0] == f"bytes=0-{BLOCK - 1}"
    assert f"bytes={seam - SEAM_BYTES}-{seam + BLOCK - 1}" in asked


@pytest.mark.parametrize("num_workers", [0, 2])
def test_without_validator_every_sample_arrives_once(server, num_workers):
    base, state = server
    for path in shard_files(state):
        state.etags[f"data/{path.name}"] = ""
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=2, block_bytes=BLOCK))
    dataset = ShardDataset(f"{base}/data/part-{{0000..0007}}.tar", source_options=options)
    loader = MixingLoader(dataset, batch_size=8, num_workers=num_workers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnvalidatedShardWarning)
        keys = Counter(key for batch in loader for key in batch["__key__"])
    loader.close()
    assert keys == expected_keys(SIZES)
    seams = [wanted for _, wanted in state.requests if wanted and not wanted.endswith("-0")]
    assert any(int(wanted[6:].split("-")[0]) % BLOCK == BLOCK - SEAM_BYTES for wanted in seams)


def test_seeks_start_the_blocks_again_where_the_reader_goes(server):
    base, state = server
    data = shard_files(state)[4].read_bytes()
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=2, block_bytes=BLOCK))
    with open_blocks(f"{base}/data/part-0004.tar", options, offset=3 * BLOCK + 7) as stream:
        assert stream.seek(3 * BLOCK + 7) == 3 * BLOCK + 7
        assert stream.read(100) == data[3 * BLOCK + 7 : 3 * BLOCK + 107]
        stream.seek(5)
        assert stream.read(BLOCK) == data[5 : BLOCK + 5]
        stream.seek(-10, 2)
        assert stream.read() == data[-10:]


def test_a_resumed_epoch_over_read_ahead_yields_the_rest(server):
    base, state = server
    shard_files(state)
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=2, block_bytes=BLOCK))
    pattern = f"{base}/data/part-{{0000..0007}}.tar"
    loader = MixingLoader(
        ShardDataset(pattern, source_options=options), batch_size=8, num_workers=2
    )
    seen: Counter[str] = Counter()
    iterator = iter(loader)
    for _ in range(5):
        seen.update(next(iterator)["__key__"])
    state_dict = loader.state_dict()
    del iterator
    resumed = MixingLoader(
        ShardDataset(pattern, source_options=options), batch_size=8, num_workers=2
    )
    resumed.load_state_dict(state_dict)
    seen.update(key for batch in resumed for key in batch["__key__"])
    assert seen == expected_keys(SIZES)


def test_a_cached_set_downloads_through_read_ahead(server, tmp_path):
    base, state = server
    files = shard_files(state)
    options = SourceOptions(
        retry=FAST, cache_dir=str(tmp_path / "cache"), read_ahead=ReadAhead(2, BLOCK)
    )
    loader = MixingLoader(
        ShardDataset(f"{base}/data/part-{{0000..0007}}.tar", source_options=options),
        batch_size=8,
        num_workers=2,
    )
    for _ in range(2):
        assert Counter(key for batch in loader for key in batch["__key__"]) == expected_keys(SIZES)
    assert state.sent == sum(path.stat().st_size for path in files)
