"""What a restore over HTTP asks of the server before its first batch: the first batch's
residents and the lanes' reads, never the rest of the buffer (which follows behind it).

A real server on 127.0.0.1 that waits before each answer and logs each request as it arrives,
real DataLoader workers. The bound is a count, not a time: whatever the load, the requests
the server has seen when the first restored batch arrives are at most one per resident of
that batch (the first wave's ranges) plus one per shard the lanes still read (a shard here is
smaller than a read-ahead block), where asking for the whole buffer at once sent one request
per range of every resident before it. The restored epoch still holds exactly the keys the
interrupted one had not yielded.
"""

from __future__ import annotations

from collections import Counter

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.state.codec import unpack_refs
from shardmix.testing import checkpoint_after

from shards import expected_keys, write_shards

SIZES = [60, 52, 64, 48, 56, 60]
BATCH = 8


def _loader(urls: list[str], shuffle_buffer: int) -> MixingLoader:
    dataset = ShardDataset(urls, seed=3)
    return MixingLoader(
        dataset, batch_size=BATCH, num_workers=2, seed=3, shuffle_buffer=shuffle_buffer
    )


def _keys(batch) -> list[str]:
    return [str(key) for key in batch["__key__"]]


@pytest.mark.parametrize(
    ("share", "shuffle_buffer"),
    [(0.9, 8192), (0.5, 96)],  # the lanes ended (the rest is the buffer), or still reading
)
def test_a_restore_asks_for_its_first_batch_only_before_it(server, tmp_path, share, shuffle_buffer):
    base, served = server
    write_shards(tmp_path / "data", "tar", SIZES, payload_bytes=4096)  # few residents share a range
    urls = [f"{base}/data/part-{shard:04d}.tar" for shard in range(len(SIZES))]
    loader = _loader(urls, shuffle_buffer)
    batches, state = checkpoint_after(loader, 1, int(len(loader) * share))
    loader.close()
    seen = Counter(key for batch in batches for key in _keys(batch))
    residents = unpack_refs(state["buffer"]["items"])
    assert len(residents) > 4 * BATCH  # far more residents than the first batch needs

    resumed = _loader(urls, shuffle_buffer)
    resumed.load_state_dict(state)
    served.latency = 0.05  # every range of the buffer, if asked for at once, arrives first
    served.requests.clear()
    rest = iter(resumed)
    first = next(rest)
    before = [asked for asked in served.requests if asked[0].endswith(".tar")]
    found = Counter(_keys(first))
    for batch in rest:
        found.update(_keys(batch))
    resumed.close()

    assert found + seen == expected_keys(SIZES)
    assert served.heads == []
    lanes = state["mixer"]["lanes"]
    lanes_read = len({lanes[lane][3] for lane in state["mixer"]["live"] if lanes[lane][3] >= 0})
    assert len(before) <= BATCH + lanes_read, before
    assert len(served.requests) > len(before)  # the rest of the buffer came behind the batch
