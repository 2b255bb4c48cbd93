"""Resuming over remote storage costs the checkpoint's records, not the data set.

A restore at 90% of an epoch over HTTP (with Range support) and over moto's S3 server yields
exactly the uninterrupted run's remaining batches, and before its first batch the server sends
at most the buffer residents' bytes plus a tenth of the data set. Each live lane resumes with one
request at its offset; residents are read with bounded ranges. gzip shards and ``pipe:``
streams, which cannot seek, still resume exactly by walking.
"""

from collections.abc import Callable
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.formats import Format
from shardmix.sources import RetryPolicy, SourceOptions
from shardmix.state.codec import unpack_refs
from shardmix.testing import batch_fingerprint, checkpoint_after

import reads
from shards import write_shards

SIZES = [40, 31, 47, 38, 44, 29, 50, 36, 42, 33, 45, 39, 30, 48, 35, 41]
PAYLOAD = 4096
FAST = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05, read_timeout=5.0)


def loader_for(pattern: str, options: SourceOptions | None = None) -> MixingLoader:
    dataset = ShardDataset(pattern, seed=3, num_lanes=8, source_options=options)
    return MixingLoader(dataset, batch_size=16, num_workers=2, shuffle_buffer=32, seed=3)


def record_sizes(folder: Path) -> dict[tuple[int, int], int]:
    """``(shard, record) -> bytes`` of every record, its framing included."""
    sizes = {}
    for shard in range(len(SIZES)):
        path = folder / f"part-{shard:04d}.tar"
        with path.open("rb") as stream:
            offsets = [offset for _, offset, _ in reads.located(stream, "x", Format.TAR)]
        ends = [*offsets[1:], path.stat().st_size]
        for record, (begin, end) in enumerate(zip(offsets, ends, strict=True)):
            sizes[shard, record] = end - begin
    return sizes


def checkpoint_at_90(make: Callable[[], MixingLoader]) -> tuple[dict, list, list]:
    """The state after 90% of the batches, and the batches before and after it."""
    batches = [batch_fingerprint(batch) for batch in make()]
    stop = int(len(batches) * 0.9)
    loader = make()
    _, state = checkpoint_after(loader, 1, stop)
    loader.close()
    return state, batches[:stop], batches[stop:]


def restore(make: Callable[[], MixingLoader], state: dict, sent: Callable[[], int]) -> tuple:
    """The restored run's batches, and the bytes sent before its first batch."""
    restored = make()
    restored.load_state_dict(state)
    before = sent()
    batches = iter(restored)  # starts the workers and re-reads the buffer's residents
    first = next(batches)
    sent_before_first = sent() - before
    return [batch_fingerprint(first), *map(batch_fingerprint, batches)], sent_before_first


def bound(state: dict, folder: Path, urls: list[str]) -> int:
    """The residents' bytes plus a tenth of the data set's."""
    sizes = record_sizes(folder)
    names = {url: int(url.rsplit("-", 1)[1].split(".")[0]) for url in urls}
    residents = unpack_refs(state["buffer"]["items"])
    resident_bytes = sum(sizes[names[urls[shard]], record] for shard, record, _ in residents)
    data_bytes = sum(path.stat().st_size for path in folder.glob("*.tar"))
    return resident_bytes + data_bytes // 10


def test_http_restore_is_exact_cheap_and_one_request_per_lane(server):
    base, state_of_server = server
    folder = state_of_server.root / "data"
    write_shards(folder, "tar", SIZES, payload_bytes=PAYLOAD)
    pattern = f"{base}/data/part-{{0000..{len(SIZES) - 1:04d}}}.tar"

    def make() -> MixingLoader:
        return loader_for(pattern, SourceOptions(retry=FAST))

    state, _, remaining = checkpoint_at_90(make)
    assert state["buffer"]["items"] and any(lane[1] for lane in state["mixer"]["lanes"])
    state_of_server.requests.clear()
    batches, sent = restore(make, state, lambda: state_of_server.sent)
    assert batches == remaining
    dataset = make().dataset
    assert sent <= bound(state, folder, dataset.urls)

    # Each lane that resumes inside a shard asks once, at the offset the state holds.
    plan = dataset.plan.lane_shards(state["epoch"])
    resumed = {}
    for lane in state["mixer"]["live"]:
        slot, record, offset, *_ = state["mixer"]["lanes"][lane]
        if record > 0 and slot < len(plan[lane]):
            name = "data/" + dataset.urls[plan[lane][slot]].rsplit("/", 1)[1]
            resumed[name] = offset
    assert resumed
    for name, offset in resumed.items():
        open_ended = [r for n, r in state_of_server.requests if n == name and r and r[-1] == "-"]
        assert open_ended == [f"bytes={offset}-"]
    # Nothing is streamed from a shard's start; residents are bounded ranges.
    assert all(r is not None for n, r in state_of_server.requests if n in resumed)
    bounded = [r for _, r in state_of_server.requests if r and r[-1] != "-"]
    assert len(bounded) >= 1


def test_s3_restore_is_exact_and_cheap(s3_server, tmp_path, monkeypatch):
    from servers import counting_relay

    endpoint, client = s3_server
    client.create_bucket(Bucket="resume-set")
    folder = tmp_path / "data"
    write_shards(folder, "tar", SIZES, payload_bytes=PAYLOAD)
    for path in sorted(folder.glob("*.tar")):
        client.put_object(Bucket="resume-set", Key=path.name, Body=path.read_bytes())
    s3fs = pytest.importorskip("s3fs")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with counting_relay(endpoint) as (relay, counter):
        monkeypatch.setenv("AWS_ENDPOINT_URL", relay)
        s3fs.S3FileSystem.clear_instance_cache()
        pattern = f"s3://resume-set/part-{{0000..{len(SIZES) - 1:04d}}}.tar"

        def make() -> MixingLoader:
            return loader_for(pattern)

        state, _, remaining = checkpoint_at_90(make)
        s3fs.S3FileSystem.clear_instance_cache()
        batches, sent = restore(make, state, lambda: counter.sent)
        assert batches == remaining
        assert sent <= bound(state, folder, make().dataset.urls)
        s3fs.S3FileSystem.clear_instance_cache()


def test_pipe_streams_resume_exactly_by_walking(tmp_path, caplog):
    folder = tmp_path / "data"
    write_shards(folder, "tar", SIZES[:6], payload_bytes=64)
    urls = [f"pipe:cat {folder}/part-{shard:04d}.tar" for shard in range(6)]
    options = SourceOptions(allow_pipe=True)

    def make() -> MixingLoader:
        dataset = ShardDataset(urls, format="tar", seed=3, num_lanes=4, source_options=options)
        return MixingLoader(dataset, batch_size=8, num_workers=0, shuffle_buffer=16, seed=3)

    state, _, remaining = checkpoint_at_90(make)
    assert any(lane[2] >= 0 for lane in state["mixer"]["lanes"])
    with caplog.at_level("DEBUG", logger="shardmix.reading.reader"):
        batches, _ = restore(make, state, lambda: 0)
    assert batches == remaining
    assert "walking the framing from the start" in caplog.text
