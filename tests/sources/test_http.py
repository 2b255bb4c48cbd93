"""http(s):// shards against a real threaded server on 127.0.0.1 that misbehaves on request."""

from __future__ import annotations

import io
import pickle
import random
import re
import socket
import time
from pathlib import Path

import pytest

from shardmix.errors import ConfigError, ShardNotFoundError
from shardmix.formats import Format
from shardmix.reading.reader import ReadRequest, read_shard
from shardmix.sources import (
    RemoteAccessError,
    RemoteReadError,
    RetryPolicy,
    SourceOptions,
    open_shard,
)
from shardmix.sources.http.stream import SKIP_BY_READING, HttpShardStream

from servers import ServerState
from shards import record_key, write_shards

FAST = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05, read_timeout=5.0)


def put(state: ServerState, name: str, size: int) -> bytes:
    data = random.Random(size).randbytes(size)
    (state.root / name).write_bytes(data)
    return data


def read_all(url: str, retry: RetryPolicy = FAST) -> bytes:
    with open_shard(url, options=SourceOptions(retry=retry)) as stream:
        return stream.read()


def test_reads_every_byte(server: tuple[str, ServerState]) -> None:
    base, state = server
    data = put(state, "a.bin", 300_000)
    put(state, "empty.bin", 0)
    assert read_all(f"{base}/a.bin") == data
    assert read_all(f"{base}/empty.bin") == b""
    assert state.requests == [("a.bin", None), ("empty.bin", None)]


@pytest.mark.parametrize("fault", ["cut", "reset"])
@pytest.mark.parametrize("ignore_range", [False, True])
def test_dropped_connection_resumes_exactly(
    server: tuple[str, ServerState], fault: str, ignore_range: bool
) -> None:
    base, state = server
    data = put(state, "a.bin", 1_000_000)
    state.faults["a.bin"].append(fault)
    state.ignore_range = ignore_range
    assert read_all(f"{base}/a.bin") == data
    assert len(state.requests) == 2
    resumed_at = state.requests[1][1]
    assert resumed_at is not None and 0 < int(resumed_at[len("bytes=") : -1]) <= len(data) // 2


def test_503_twice_then_success(server: tuple[str, ServerState]) -> None:
    base, state = server
    data = put(state, "a.bin", 50_000)
    state.faults["a.bin"].extend(["503", "503"])
    assert read_all(f"{base}/a.bin") == data
    assert [request[0] for request in state.requests] == ["a.bin"] * 3


def test_retry_after_is_capped_by_max_backoff(server: tuple[str, ServerState]) -> None:
    base, state = server
    data = put(state, "a.bin", 1000)
    state.faults["a.bin"].append("429")  # asks for 100 s; max_backoff is 0.05 s
    started = time.monotonic()
    assert read_all(f"{base}/a.bin") == data
    assert time.monotonic() - started < 10


def test_503_forever_gives_up_naming_url_offset_and_attempts(
    server: tuple[str, ServerState],
) -> None:
    base, state = server
    put(state, "a.bin", 1000)
    state.faults["a.bin"].extend(["503"] * 10)
    with pytest.raises(
        RemoteReadError, match=r"a\.bin: at byte offset 0: gave up after 4 attempts"
    ):
        read_all(f"{base}/a.bin")
    assert len(state.requests) == FAST.max_attempts


def test_missing_shard_fails_at_once(server: tuple[str, ServerState]) -> None:
    base, state = server
    url = f"{base}/missing.tar"
    started = time.monotonic()
    with pytest.raises(ShardNotFoundError, match=re.escape(url)) as caught:
        open_shard(url)
    assert time.monotonic() - started < 1
    assert caught.value.url == url and "404" in str(caught.value)
    assert len(state.requests) == 1


def test_forbidden_is_an_access_error_without_retry(server: tuple[str, ServerState]) -> None:
    base, state = server
    put(state, "a.bin", 10)
    state.faults["a.bin"].append("403")
    with pytest.raises(RemoteAccessError, match="403"):
        open_shard(f"{base}/a.bin")
    assert len(state.requests) == 1


@pytest.mark.parametrize("fault", ["stall", "stall-body"])
def test_stalled_server_raises_within_the_timeouts(
    server: tuple[str, ServerState], fault: str
) -> None:
    base, state = server
    put(state, "a.bin", 100_000)
    state.faults["a.bin"].extend([fault] + ["stall"] * 4)  # progress once, then none
    retry = RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.01, read_timeout=0.3)
    delivered = 0
    started = time.monotonic()
    options = SourceOptions(retry=retry)
    with (
        pytest.raises(RemoteReadError, match=r"gave up after 2 attempts") as caught,
        open_shard(f"{base}/a.bin", options=options) as stream,
    ):
        while chunk := stream.read1(4096):
            delivered += len(chunk)
    assert time.monotonic() - started < 0.3 * 2 + 2.0  # the stall alone would take 10 s
    assert delivered == (0 if fault == "stall" else 50_000)
    assert caught.value.offset == delivered
    assert f"at byte offset {delivered}" in str(caught.value)


def test_refused_connection_is_retried_then_reported(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nobody listens there
    with pytest.raises(RemoteReadError, match="gave up after 4 attempts"):
        read_all(f"http://127.0.0.1:{port}/a.bin")


def test_seek_and_tell(server: tuple[str, ServerState]) -> None:
    base, state = server
    data = put(state, "a.bin", 3 * SKIP_BY_READING)
    with open_shard(f"{base}/a.bin", options=SourceOptions(retry=FAST)) as stream:
        assert stream.seekable()
        assert stream.read(10) == data[:10]
        stream.seek(100_000, io.SEEK_CUR)  # near: read and dropped
        assert stream.tell() == 100_010
        assert stream.read(5) == data[100_010:100_015]
        stream.seek(2 * SKIP_BY_READING)  # far: a new range request
        assert stream.read(7) == data[2 * SKIP_BY_READING : 2 * SKIP_BY_READING + 7]
        stream.seek(3)  # backwards
        assert stream.read(4) == data[3:7]
        assert stream.seek(-6, io.SEEK_END) == len(data) - 6
        assert stream.read() == data[-6:]
        stream.seek(len(data) + 10)
        assert stream.read(1) == b""


def test_raw_stream_reports_size(server: tuple[str, ServerState]) -> None:
    base, state = server
    put(state, "a.bin", 1234)
    with HttpShardStream(f"{base}/a.bin", FAST) as stream:
        assert stream.size == 1234 and stream.tell() == 0


@pytest.mark.parametrize("start", [0, 7])
def test_tar_shard_over_http_matches_local(
    server: tuple[str, ServerState], tmp_path: Path, start: int
) -> None:
    base, state = server
    write_shards(tmp_path, "tar", [20], payload_bytes=70_000)
    state.faults["part-0000.tar"].append("cut")
    keys = [
        sample["__key__"]
        for sample in read_shard(f"{base}/part-0000.tar", Format.TAR, ReadRequest(start=start))
    ]
    assert keys == [record_key(0, record) for record in range(start, 20)]


@pytest.mark.parametrize(
    "fields",
    [
        {"max_attempts": 0},
        {"max_attempts": 1.5},
        {"initial_backoff": -1.0},
        {"initial_backoff": 20.0},
        {"read_timeout": 0.0},
        {"connect_timeout": float("nan")},
    ],
)
def test_retry_policy_rejects_bad_values(fields: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**fields)  # type: ignore[arg-type]


def test_source_options_validate_copy_and_pickle() -> None:
    storage = {"headers": {"Authorization": "Bearer secret"}}
    options = SourceOptions(storage_options=storage, retry=FAST, cache_dir=Path("/tmp/c"))
    storage["headers"] = {}
    assert options.storage_options == {"headers": {"Authorization": "Bearer secret"}}
    assert options.cache_dir == "/tmp/c" and "secret" not in repr(options)
    assert pickle.loads(pickle.dumps(options)) == options
    with pytest.raises(ConfigError):
        SourceOptions(storage_options=[("key", "x")])  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        SourceOptions(allow_pipe="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"storage_options\['headers'\] must be a mapping"):
        SourceOptions(storage_options={"headers": ["Authorization: x"]})


def test_remote_errors_survive_pickling() -> None:
    error = pickle.loads(pickle.dumps(RemoteReadError("lost", url="http://h/a", offset=9)))
    assert isinstance(error, OSError) and (error.url, error.offset) == ("http://h/a", 9)
