"""The tar reader on the archives other tools write: every path reads what ``tarfile`` lists.

Archives come from webdataset's TarWriter, Python's ``tarfile`` (PAX, GNU, USTAR), GNU tar
(posix and gnu formats) and shardmix's writer (:mod:`tar_archives`). Each is read member by
member (a stream without a read buffer), in runs (buffered streams of several sizes, seekable
or not) and in record blocks: all must give the same located samples, reports and errors, and
the samples that ``tarfile`` groups.
"""

from __future__ import annotations

import io
import random
import shutil
from typing import Any

import pytest
from tar_archives import GNU_WRITERS, WRITERS, random_archive, tarfile_samples, write_as

from shardmix.errors import CorruptShardError, ShardmixError
from shardmix.formats import ShardRead
from shardmix.formats.tar import TarReader
from shardmix.formats.tar.members import TarMembers

import reads

_GNU = pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
_ALL_WRITERS = WRITERS + [pytest.param(writer, marks=_GNU) for writer in GNU_WRITERS]


class OneWay(io.RawIOBase):
    """A pipe-like stream: no seek, reads of at most 700 bytes."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._inner.read(min(len(buffer), 700))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def reading(stream: Any, *, blocks: bool, report: bool) -> tuple[list[Any], list[Any], Any]:
    """Located samples, damage reports and the error a read ends with."""
    reports: list[Any] = []
    on_damage = reports.append if report else None
    located: list[Any] = []
    ended: Any = None
    try:
        if blocks:
            for block in TarReader().blocks(stream, "x.tar", ShardRead(on_damage=on_damage)):
                located.extend(block.located())
        else:
            located.extend(reads.tar_located(stream, "x.tar", on_damage=on_damage))
    except ShardmixError as error:
        ended = (type(error), str(error))
    return located, [(str(r.error), r.record, r.offset, r.size) for r in reports], ended


def differences(data: bytes, *, report: bool = False, one_way: bool = True) -> list[str]:
    """The ways of reading ``data`` whose outcome differs from the member-by-member path's
    (``one_way``: streams that cannot seek too)."""
    expected = reading(io.BytesIO(data), blocks=False, report=report)
    ways = {"blocks": lambda: io.BytesIO(data)}
    for size in (1024, 4096, 1 << 16):
        ways[f"runs {size}"] = lambda size=size: io.BufferedReader(io.BytesIO(data), size)
        if one_way:
            ways[f"one-way {size}"] = lambda size=size: io.BufferedReader(OneWay(data), size)
    found = []
    for name, stream in ways.items():
        for blocks in (False, True):
            if reading(stream(), blocks=blocks, report=report) != expected:
                found.append(f"{name}{' in blocks' if blocks else ''}")
    return found


def samples(count: int, big: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "__key__": f"s/r{record:04d}",
            "txt": f"{record}".encode(),
            "cls": bytes([record % 251]) * (200 + big),
        }
        for record in range(count)
    ]


def runs_of(data: bytes) -> int:
    """How many runs a read of ``data`` from a 64 KiB buffer takes."""
    members = TarMembers(io.BufferedReader(io.BytesIO(data), 1 << 16), "x.tar", gzipped=False)
    return sum(1 for _ in members.runs(1 << 30))


@pytest.mark.parametrize("writer", _ALL_WRITERS)
def test_every_writer_reads_back_the_same_samples_in_runs(writer: str) -> None:
    written = samples(300)
    data = write_as(writer, written)
    stream = io.BufferedReader(io.BytesIO(data), 1 << 16)
    read = [sample for _, _, sample in reads.tar_located(stream, "x.tar")]
    assert read == written == tarfile_samples(data)
    assert differences(data) == []
    # Runs as long as the buffer holds (and the member the buffer's end cuts, read on its own):
    # pax and long-name headers do not end them.
    assert runs_of(data) <= 2 * (len(data) // (1 << 16)) + 3


@pytest.mark.parametrize("writer", ["webdataset", "tarfile-pax", "tarfile-gnu", "tarfile-ustar"])
def test_long_names_and_members_over_the_buffer_read_as_tarfile_lists(writer: str) -> None:
    written = [
        {"__key__": "/".join(["dir" * 20] * 2) + f"/r{record}", "txt": b"t", "bin": b"b" * 70_000}
        for record in range(4)
    ]
    data = write_as(writer, written)
    assert tarfile_samples(data) == written
    assert differences(data) == []


def test_a_hard_link_gives_its_target_data_and_names_its_error_on_a_pipe() -> None:
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        info = tarfile.TarInfo("a/r0.jpg")
        info.size = 5
        archive.addfile(info, io.BytesIO(b"image"))
        link = tarfile.TarInfo("a/r1.jpg")
        link.type, link.linkname = tarfile.LNKTYPE, "a/r0.jpg"
        archive.addfile(link)
    data = out.getvalue()
    read = [sample for _, _, sample in reads.tar_located(io.BytesIO(data), "x.tar")]
    assert read == [{"__key__": "a/r0", "jpg": b"image"}, {"__key__": "a/r1", "jpg": b"image"}]
    assert read == tarfile_samples(data)
    with pytest.raises(CorruptShardError) as caught:
        list(reads.tar_located(io.BufferedReader(OneWay(data), 4096), "x.tar"))
    assert "tar member 1 'a/r1.jpg' is a hard link to 'a/r0.jpg', which a stream" in str(
        caught.value
    )
    assert caught.value.offset == 1024


@pytest.mark.parametrize("seed", range(20))
def test_random_archives_read_the_same_on_every_path_and_as_tarfile_groups(seed: int) -> None:
    data = random_archive(random.Random(seed))
    located, _, ended = reading(io.BytesIO(data), blocks=False, report=False)
    assert ended is None
    assert [sample for _, _, sample in located] == tarfile_samples(data)
    assert differences(data, one_way=not has_hard_links(data)) == []


def has_hard_links(data: bytes) -> bool:
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return any(info.islnk() for info in archive.getmembers())
