"""pipe: URLs: off unless allowed, exact bytes, and a failing command is an error."""

from __future__ import annotations

import random
import shlex
import sys
from pathlib import Path

import pytest

from shardmix.errors import UnsupportedURLError
from shardmix.plan.urls import check_sources, expand_urls
from shardmix.sources import SourceOptions, open_shard
from shardmix.sources.pipe import PipeCommandError

ALLOWED = SourceOptions(allow_pipe=True)


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[Path, bytes]:
    data = random.Random(7).randbytes(700_000)
    path = tmp_path / "a b.tar"  # a space, so the command must quote it
    path.write_bytes(data)
    return path, data


def test_pipe_is_off_by_default(data_file: tuple[Path, bytes], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(UnsupportedURLError, match=r"allow_pipe=True"):
        open_shard(f"pipe:touch {shlex.quote(str(marker))}")
    assert not marker.exists()


def test_pipe_reads_the_command_output(data_file: tuple[Path, bytes]) -> None:
    path, data = data_file
    with open_shard(f"pipe:cat {shlex.quote(str(path))}", options=ALLOWED) as stream:
        assert not stream.seekable()
        assert stream.read() == data


def test_failing_command_raises_after_its_output(data_file: tuple[Path, bytes]) -> None:
    path, data = data_file
    command = f"cat {shlex.quote(str(path))}; echo broken >&2; exit 3"
    read = bytearray()
    with (
        pytest.raises(PipeCommandError, match=r"exited with status 3.*broken") as caught,
        open_shard(f"pipe:{command}", options=ALLOWED) as stream,
    ):
        while chunk := stream.read1(65536):
            read += chunk
    assert bytes(read) == data
    assert caught.value.offset == len(data) and command in str(caught.value)


def test_closing_early_stops_the_command() -> None:
    endless = (
        f"{shlex.quote(sys.executable)} -c 'import sys\nwhile True: sys.stdout.write(\"x\" * 4096)'"
    )
    with open_shard(f"pipe:{endless}", options=ALLOWED) as stream:
        assert stream.read(10) == b"x" * 10


def test_empty_command_is_rejected() -> None:
    with pytest.raises(UnsupportedURLError, match="needs a command"):
        open_shard("pipe:  ", options=ALLOWED)


def test_pipe_urls_are_neither_globbed_nor_checked_as_files() -> None:
    urls = expand_urls("pipe:cat shard-*.tar")
    assert urls == ["pipe:cat shard-*.tar"]
    check_sources(urls, ALLOWED)  # not a local file: nothing to check
    with pytest.raises(UnsupportedURLError, match="allow_pipe=True"):
        check_sources(urls, SourceOptions())
