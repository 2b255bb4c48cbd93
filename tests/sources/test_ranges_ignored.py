"""Read-ahead from a 127.0.0.1 server that ignores Range: its first whole-shard answer is read
as the shard, the host is asked for no more ranges, and one warning says so."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest

from shardmix import MixingLoader, RangesIgnoredWarning, ShardDataset
from shardmix.sources import ReadAhead, RetryPolicy, SourceOptions, open_shard

from shards import expected_keys, write_shards

SIZES = [9, 30, 4, 17, 25, 1, 12, 20]
FAST = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05, read_timeout=5.0)
BLOCK = 4096  # many blocks per shard: each block a whole shard would cost many times the set


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_server_ignoring_range_serves_the_set_about_once(server, num_workers):
    base, state = server
    state.ignore_range = True
    write_shards(state.root / "data", "tar", SIZES, payload_bytes=2000)
    total = sum(path.stat().st_size for path in (state.root / "data").glob("*.tar"))
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=3, block_bytes=BLOCK))
    dataset = ShardDataset(f"{base}/data/part-{{0000..0007}}.tar", source_options=options)
    loader = MixingLoader(dataset, batch_size=8, num_workers=num_workers, shuffle_buffer=32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = Counter(key for batch in loader for key in batch["__key__"])
    assert keys == expected_keys(SIZES)
    assert state.sent <= 1.5 * total, (state.sent, total)
    ranged = [name for name, header in state.requests if name.endswith(".tar") and header]
    assert len(ranged) <= 1 + num_workers  # each process asks once, then never again
    if num_workers == 0:
        ignored = [w for w in caught if issubclass(w.category, RangesIgnoredWarning)]
        assert len(ignored) == 1 and base in str(ignored[0].message)


def test_the_whole_shard_answer_is_read_once_and_seeks_still_work(server):
    base, state = server
    state.ignore_range = True
    data = bytes(range(256)) * 100
    (state.root / "one.bin").write_bytes(data)
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=2, block_bytes=1000))
    with pytest.warns(RangesIgnoredWarning), open_shard(f"{base}/one.bin", options=options) as f:
        assert f.read() == data
        assert state.sent == len(data) and len(state.requests) == 1, state.requests
        f.seek(12_345)
        assert f.read(100) == data[12_345:12_445]
