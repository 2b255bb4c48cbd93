"""From a server without ETag or Last-Modified, a tar shard replaced by one of the same size
(other keys, other payloads) while it is read is refused at a member boundary too, where the
bytes just before are a member's zero padding, alike in both versions."""

from __future__ import annotations

import io
import os
import warnings

import pytest
from test_http_versions import Shard, _read_all, serve  # noqa: F401 (serve: a fixture)

from shardmix import ShardChangedError, UnvalidatedShardWarning
from shardmix.formats.tar_writer import TarWriter
from shardmix.sources import ReadAhead, RetryPolicy, SourceOptions
from shardmix.sources.http.readahead import open_blocks

RECORDS, RECORD_BYTES = 200, 2048  # each record: bin and txt, a header and a 512-byte block each


def tar_version(version: int, trailer: int = 1024) -> bytes:
    """``RECORDS`` records keyed by ``version``, their payloads random, ``trailer`` zero bytes
    at the end (1,024 or more)."""
    buffer = io.BytesIO()
    with TarWriter(buffer) as writer:
        for record in range(RECORDS):
            key = f"v{version}-{record:04d}"
            writer.write({"__key__": key, "txt": f"{record}", "bin": os.urandom(16)})
    data = buffer.getvalue()
    assert len(data) == RECORDS * RECORD_BYTES + 1024
    return data + bytes(trailer - 1024)


def test_a_resume_at_a_member_boundary_is_refused(serve):  # noqa: F811
    # The first answer ends halfway, at a record's start: the bytes before it are the padding
    # of the record before's last member.
    trailer = 2 * 101 * RECORD_BYTES - RECORDS * RECORD_BYTES
    old, new = tar_version(1, trailer), tar_version(2, trailer)
    half = len(old) // 2
    assert half == 101 * RECORD_BYTES and old[half - 64 : half] == new[half - 64 : half]
    url = serve(Shard(old, "none", replace_with=new))
    with pytest.warns(UnvalidatedShardWarning), pytest.raises(ShardChangedError) as caught:
        _read_all(url)
    assert caught.value.offset == 101 * RECORD_BYTES


def test_a_block_that_starts_at_a_member_boundary_is_refused(server):
    base, state = server
    path = state.root / "a.tar"
    old = tar_version(1)
    path.write_bytes(old)
    state.etags["a.tar"] = ""  # the server gives no ETag (nor Last-Modified)
    block = 4 * RECORD_BYTES  # each block starts at a record, after a member's padding
    retry = RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.02)
    options = SourceOptions(retry=retry, read_ahead=ReadAhead(blocks=1, block_bytes=block))
    read = b""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnvalidatedShardWarning)
        with open_blocks(f"{base}/a.tar", options) as stream:
            read += stream.read(13 * RECORD_BYTES)  # into the fourth block
            path.write_bytes(tar_version(2))  # same size, every member another
            with pytest.raises(ShardChangedError) as caught:
                while part := stream.read(1000):
                    read += part
    assert read == old[: len(read)]  # never a byte of the new version
    assert caught.value.offset % block == 0 and len(read) <= caught.value.offset  # a block's start
