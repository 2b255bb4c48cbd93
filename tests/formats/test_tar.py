"""Tests for shardmix.formats.tar: round trips, GNU tar golden files, webdataset parity, damage."""

from __future__ import annotations

import contextlib
import gzip
import inspect
import io
import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmix.errors import CorruptShardError, ShardmixError, TruncatedShardError
from shardmix.formats import ShardRead
from shardmix.formats.tar import TarReader, split_member_name
from shardmix.formats.tar_writer import TarWriter

import reads

GOLDEN = Path(__file__).parent.parent / "golden" / "tar"
BLOCK = 512


def make_samples(count: int, *, shard: int = 0, big: int = 0) -> list[dict[str, Any]]:
    """Samples whose contents say which (shard, record) they are."""
    samples = []
    for record in range(count):
        key = f"shard{shard}/r{record:05d}"
        sample = {"__key__": key, "txt": f"{shard}:{record}".encode()}
        if big:
            sample["bin"] = bytes([record % 251]) * big
        samples.append(sample)
    return samples


def write_tar(samples: list[dict[str, Any]], *, gzip: bool = False) -> bytes:
    buffer = io.BytesIO()
    with TarWriter(buffer, gzip=gzip) as writer:
        for sample in samples:
            writer.write(sample)
    return buffer.getvalue()


def read_all(data: bytes, url: str = "mem.tar", **kwargs: Any) -> list[dict[str, Any]]:
    return list(reads.tar_samples(io.BytesIO(data), url, **kwargs))


class NonSeekable(io.RawIOBase):
    """A pipe-like stream: no seek, and reads that return at most 700 bytes."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._inner.read(min(len(buffer), 700))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def webdataset_samples(path: Path) -> list[dict[str, Any]]:
    """How webdataset's own tar iterator groups a file."""
    from webdataset.tariterators import group_by_keys, tar_file_expander

    with open(path, "rb") as stream:
        files = tar_file_expander([{"url": str(path), "stream": stream}])
        return [
            {name: value for name, value in sample.items() if name != "__url__"}
            for sample in group_by_keys(files)
        ]


def expected_golden() -> list[dict[str, Any]]:
    spelled = json.loads((GOLDEN / "expected.json").read_text())["samples"]
    return [
        {
            name: bytes.fromhex(value["hex"])
            if isinstance(value, dict)
            else value.encode()
            if name != "__key__"
            else value
            for name, value in sample.items()
        }
        for sample in spelled
    ]


def field_multiset(samples: list[dict[str, Any]]) -> Counter[tuple[str, str, bytes]]:
    return Counter(
        (sample["__key__"], name, value)
        for sample in samples
        for name, value in sample.items()
        if name != "__key__"
    )


# -- writer and reader ----------------------------------------------------------------------


def test_round_trip_exact_contents() -> None:
    samples = make_samples(20, big=3000)
    samples.append({"__key__": "deep/" + "d" * 150 + "/x", "seg.png": b"\x00\xff", "cls": 7})
    samples.append({"__key__": "text", "txt": "héllo", "score": 0.25, "__source__": "dropped"})
    got = read_all(write_tar(samples))
    assert got[:20] == samples[:20]
    assert got[20] == {"__key__": "deep/" + "d" * 150 + "/x", "seg.png": b"\x00\xff", "cls": b"7"}
    assert got[21] == {"__key__": "text", "txt": "héllo".encode(), "score": b"0.25"}


def test_writer_is_deterministic_and_counts(tmp_path: Path) -> None:
    samples = make_samples(5)
    assert write_tar(samples) == write_tar(samples)
    assert write_tar(samples, gzip=True) == write_tar(samples, gzip=True)
    path = tmp_path / "out.tar.gz"
    with TarWriter(path, gzip=True) as writer:
        for sample in samples:
            writer.write(sample)
        assert writer.records == 5
    assert writer.bytes_written == len(write_tar(samples))
    assert path.read_bytes() == write_tar(samples, gzip=True)
    assert gzip.decompress(path.read_bytes()) == write_tar(samples)
    assert read_all(path.read_bytes(), "out.tar.gz", gzipped=True) == samples


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
def test_gnu_tar_lists_writer_output(tmp_path: Path) -> None:
    samples = make_samples(3) + [{"__key__": "l/" + "n" * 120, "seg.png": b"x"}]
    path = tmp_path / "out.tar"
    path.write_bytes(write_tar(samples))
    listed = subprocess.run(["tar", "-tf", str(path)], capture_output=True, text=True, check=True)
    assert listed.stderr == ""
    names = [f"{s['__key__']}.{field}" for s in samples for field in sorted(s) if field[0] != "_"]
    assert listed.stdout.splitlines() == names


def test_webdataset_reads_writer_output(tmp_path: Path) -> None:
    samples = make_samples(4) + [{"__key__": "l/" + "n" * 120, "seg.png": b"x", "cls": 1}]
    path = tmp_path / "out.tar"
    path.write_bytes(write_tar(samples))
    assert webdataset_samples(path) == read_all(path.read_bytes())


def test_writer_aborted_by_exception_leaves_a_truncated_shard() -> None:
    buffer = io.BytesIO()
    with pytest.raises(RuntimeError), TarWriter(buffer) as writer:
        writer.write(make_samples(1)[0])
        raise RuntimeError("stop")
    with pytest.raises(TruncatedShardError, match="end-of-archive"):
        read_all(buffer.getvalue())


@pytest.mark.parametrize(
    ("sample", "error"),
    [
        ({"__key__": "a.b", "txt": b""}, ValueError),
        ({"__key__": "dir/", "txt": b""}, None),
        ({"__key__": "", "txt": b""}, ValueError),
        ({"__key__": "a", "TXT": b""}, ValueError),
        ({"__key__": "a", "x/y": b""}, ValueError),
        ({"__key__": "__meta__/a", "txt": b""}, ValueError),
        ({"__key__": 3, "txt": b""}, ValueError),
        ({"__key__": "a", "flag": True}, TypeError),
        ({"__key__": "a"}, ValueError),
    ],
)
def test_writer_rejects_samples_that_would_not_read_back(
    sample: dict[str, Any], error: type[Exception] | None
) -> None:
    writer = TarWriter(io.BytesIO())
    if error is None:
        writer.write(sample)
    else:
        with pytest.raises(error):
            writer.write(sample)


def test_writer_rejects_a_key_written_twice() -> None:
    writer = TarWriter(io.BytesIO())
    writer.write({"__key__": "a", "txt": b"1"})
    with pytest.raises(ValueError, match="already written"):
        writer.write({"__key__": "a", "cls": b"1"})


# -- start and counting ---------------------------------------------------------------------


@pytest.mark.parametrize("big", [0, 100_000])
@pytest.mark.parametrize("seekable", [True, False])
def test_start_gives_exactly_the_tail(big: int, seekable: bool) -> None:
    samples = make_samples(6, big=big)
    data = write_tar(samples)
    for start in range(len(samples) + 2):
        stream = io.BytesIO(data) if seekable else io.BufferedReader(NonSeekable(data))
        assert list(reads.tar_samples(stream, "m.tar", start=start)) == samples[start:]


def test_start_on_gzip_shard() -> None:
    samples = make_samples(7)
    assert read_all(write_tar(samples, gzip=True), gzipped=True, start=4) == samples[4:]


def test_count_tar_records() -> None:
    assert reads.tar_count(io.BytesIO(write_tar(make_samples(9))), "m.tar") == 9
    assert reads.tar_count(io.BytesIO(write_tar([])), "m.tar") == 0
    gzipped = io.BytesIO(write_tar(make_samples(3), gzip=True))
    assert reads.tar_count(gzipped, "m.tar.gz", gzipped=True) == 3


def test_unbuffered_file(tmp_path: Path) -> None:
    path = tmp_path / "x.tar"
    path.write_bytes(write_tar(make_samples(3, big=2000)))
    with open(path, "rb", buffering=0) as raw:
        assert list(reads.tar_samples(raw, str(path), start=1)) == make_samples(3, big=2000)[1:]


def test_negative_start_is_refused() -> None:
    with pytest.raises(ValueError):
        reads.tar_samples(io.BytesIO(b""), "m.tar", start=-1)


# -- golden files from GNU tar --------------------------------------------------------------


GOLDEN_FILES = json.loads((GOLDEN / "expected.json").read_text())["files"]


@pytest.mark.parametrize("name", GOLDEN_FILES)
def test_golden_files_group_as_expected(name: str) -> None:
    data = (GOLDEN / name).read_bytes()
    assert read_all(data, name, gzipped=name.endswith(".gz")) == expected_golden()
    assert reads.tar_count(io.BytesIO(data), name, gzipped=name.endswith(".gz")) == 5


@pytest.mark.parametrize("name", GOLDEN_FILES)
def test_golden_files_group_as_webdataset_does(name: str) -> None:
    ours = read_all((GOLDEN / name).read_bytes(), name, gzipped=name.endswith(".gz"))
    theirs = webdataset_samples(GOLDEN / name)
    assert [s["__key__"] for s in ours] == [s["__key__"] for s in theirs]
    assert field_multiset(ours) == field_multiset(theirs)


def test_golden_start_skips_over_gnu_long_names() -> None:
    data = (GOLDEN / "gnu.tar").read_bytes()
    assert read_all(data, start=1) == expected_golden()[1:]


@pytest.mark.parametrize("tar_format", ["ustar", "gnu", "pax"])
def test_stdlib_tarfile_archives_group_as_webdataset_does(tmp_path: Path, tar_format: str) -> None:
    """Archives from Python's tarfile: a pax global header, links, long names, a directory."""
    import tarfile

    path = tmp_path / f"{tar_format}.tar"
    formats = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
    pax_headers = {"comment": "global"} if tar_format == "pax" else {}
    long_dir = "/".join(["d" * 40] * 3)  # 122 bytes, splittable for ustar
    with tarfile.open(path, "w", format=formats[tar_format], pax_headers=pax_headers) as archive:

        def add(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.type = len(data), kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "k/one.txt" if tar_format == "ustar" else "k/" + "t" * 120
            if kind == tarfile.LNKTYPE:
                info.linkname = "k/one.txt"
            archive.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("k", kind=tarfile.DIRTYPE)
        add("k/one.txt", b"1")
        add("k/one.seg.png", b"png")
        add("k/one.link", kind=tarfile.SYMTYPE)
        add(f"{long_dir}/two.txt", b"2" * 700)
        add(f"{long_dir}/two.hard", kind=tarfile.LNKTYPE)
        add("three.cls", b"3")
    ours = read_all(path.read_bytes(), str(path))
    assert [s["__key__"] for s in ours] == ["k/one", f"{long_dir}/two", "three"]
    # As webdataset groups them, and the hard link with its target's data (webdataset drops it).
    hard_link = Counter([(f"{long_dir}/two", "hard", b"1")])
    assert field_multiset(ours) == field_multiset(webdataset_samples(path)) + hard_link


_NAMES = st.text(alphabet="ab._/", max_size=12)


@settings(max_examples=300, deadline=None)
@given(_NAMES)
def test_member_names_split_as_webdataset_splits(name: str) -> None:
    from webdataset.tariterators import base_plus_ext, tar_file_iterator

    skip_meta = inspect.signature(tar_file_iterator).parameters["skip_meta"].default
    top_meta = "/" not in name and name.startswith("__") and name.endswith("__")
    if top_meta or re.match(skip_meta, name):
        expected = None
    else:
        key, field = base_plus_ext(name)
        expected = None if key is None else (key, field.lower())
    assert split_member_name(name) == expected


# -- damage ---------------------------------------------------------------------------------


def small_shard(count: int = 4) -> bytes:
    """``count`` records of two members, each member exactly two blocks (header + data)."""
    return write_tar(make_samples(count, big=100))


def test_bad_checksum_mid_archive_names_file_and_offset() -> None:
    data = bytearray(small_shard())
    header = 5 * 2 * BLOCK  # member 5: record 2's second member
    data[header + 3] ^= 0x01
    with pytest.raises(CorruptShardError, match=r"bad checksum") as caught:
        read_all(bytes(data), "s/x.tar")
    assert caught.value.url == "s/x.tar" and caught.value.offset == header
    assert f"s/x.tar: at byte offset {header}" in str(caught.value)
    assert "member 5" in str(caught.value)


def test_non_octal_size_is_corrupt() -> None:
    data = bytearray(small_shard())
    header = 2 * 2 * BLOCK
    data[header + 124 : header + 136] = b"0000000009x\x00"
    checksum = sum(data[header : header + 148]) + 256 + sum(data[header + 156 : header + 512])
    data[header + 148 : header + 156] = b"%06o\x00 " % checksum
    with pytest.raises(CorruptShardError, match="invalid size") as caught:
        read_all(bytes(data))
    assert caught.value.offset == header


def test_signed_checksum_and_base256_size_are_accepted() -> None:
    samples = [{"__key__": "ünï", "txt": b"abc"}]
    data = bytearray(write_tar(samples))
    data[124:136] = b"\x80" + (3).to_bytes(11, "big")
    signed = sum(b - 256 if b >= 128 else b for b in data[:512]) - sum(data[148:156]) + 256
    data[148:156] = b"%06o\x00 " % signed
    assert read_all(bytes(data)) == samples


@pytest.mark.parametrize("cut", [2 * BLOCK + 50, 3 * BLOCK + 100, 3 * BLOCK + 511])
def test_cut_mid_member_is_truncated(cut: int) -> None:
    data = small_shard()
    with pytest.raises(TruncatedShardError, match="expected|declares") as caught:
        read_all(data[:cut], "x.tar")
    assert caught.value.url == "x.tar"


@pytest.mark.parametrize("seekable", [True, False])
def test_cut_mid_skipped_member_is_truncated(seekable: bool) -> None:
    data = write_tar(make_samples(3, big=200_000))
    cut = data[: len(data) // 2]
    stream = io.BytesIO(cut) if seekable else io.BufferedReader(NonSeekable(cut))
    with pytest.raises(TruncatedShardError, match="declares 200000 bytes"):
        list(reads.tar_samples(stream, "x.tar", start=3))


@pytest.mark.parametrize("members", [0, 1, 2, 3, 8])
def test_cut_between_members_is_truncated(members: int) -> None:
    data = small_shard()
    with pytest.raises(TruncatedShardError, match="without its end-of-archive") as caught:
        read_all(data[: members * 2 * BLOCK])
    assert caught.value.offset == members * 2 * BLOCK


def test_one_zero_block_then_eof_is_accepted() -> None:
    data = small_shard()
    assert read_all(data[: 8 * 2 * BLOCK + BLOCK]) == make_samples(4, big=100)


def test_zero_padding_after_end_is_accepted_but_junk_is_not() -> None:
    data = small_shard()
    assert read_all(data + bytes(9 * BLOCK)) == make_samples(4, big=100)
    with pytest.raises(CorruptShardError, match="follow the end-of-archive") as caught:
        read_all(data + bytes(700) + b"junk")
    assert caught.value.offset == len(data) + 700


def test_lone_zero_block_followed_by_data_is_corrupt() -> None:
    data = bytearray(small_shard())
    data[4 * BLOCK : 5 * BLOCK] = bytes(BLOCK)
    with pytest.raises(CorruptShardError, match="lone zero block"):
        read_all(bytes(data))


def without_end(data: bytes) -> bytes:
    return data[: -2 * BLOCK]


def test_key_reappearing_is_corrupt() -> None:
    first = without_end(write_tar([{"__key__": "a", "txt": b"1"}, {"__key__": "b", "txt": b"2"}]))
    data = first + write_tar([{"__key__": "a", "cls": b"3"}])
    with pytest.raises(CorruptShardError, match="'a' appears again") as caught:
        read_all(data)
    assert "record 0" in str(caught.value) and caught.value.record == 2
    with pytest.raises(CorruptShardError, match="appears again"):
        reads.tar_count(io.BytesIO(data), "m.tar")


def test_duplicate_field_is_corrupt() -> None:
    data = without_end(write_tar([{"__key__": "a", "txt": b"1"}]))
    data += write_tar([{"__key__": "a", "txt": b"2"}])
    with pytest.raises(CorruptShardError, match="repeats field 'txt'"):
        read_all(data)
    with pytest.raises(CorruptShardError, match="repeats field 'txt'"):
        read_all(data, start=1)


def test_truncated_gzip_shard() -> None:
    data = write_tar(make_samples(30, big=3000), gzip=True)
    with pytest.raises(TruncatedShardError):
        read_all(data[: len(data) // 2], "x.tar.gz", gzipped=True)


def test_gzip_errors_say_offsets_are_decompressed() -> None:
    inner = small_shard()
    data = gzip.compress(inner[: 3 * 2 * BLOCK], mtime=0)
    with pytest.raises(TruncatedShardError, match="decompressed stream"):
        read_all(data, "x.tar.gz", gzipped=True)


# -- fuzzing --------------------------------------------------------------------------------


def read_or_shardmix_error(data: bytes, **kwargs: Any) -> None:
    with contextlib.suppress(ShardmixError):
        read_all(data, **kwargs)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096))
def test_random_bytes_raise_only_shardmix_errors(data: bytes) -> None:
    read_or_shardmix_error(data)
    read_or_shardmix_error(data, start=1)


_VALID = write_tar(make_samples(3, big=700) + [{"__key__": "p/" + "q" * 110, "txt": b"x"}])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), max_size=6),
    st.integers(0, len(_VALID)),
    st.integers(0, 4),
)
def test_mutated_archives_raise_only_shardmix_errors(
    changes: list[tuple[int, int]], length: int, start: int
) -> None:
    data = bytearray(_VALID)
    for position, value in changes:
        data[position] = value
    read_or_shardmix_error(bytes(data[:length]), start=start)
    read_or_shardmix_error(bytes(data), start=start)


_VALID_GZ = write_tar(make_samples(3, big=700), gzip=True)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(_VALID_GZ) - 1), st.integers(1, 255)), max_size=4),
    st.integers(0, len(_VALID_GZ)),
    st.integers(0, 4),
)
def test_mutated_gzip_archives_raise_only_shardmix_errors(
    changes: list[tuple[int, int]], length: int, start: int
) -> None:
    data = bytearray(_VALID_GZ)  # damage the compressed bytes, as on disk
    for position, mask in changes:
        data[position] ^= mask
    read_or_shardmix_error(bytes(data[:length]), url="x.tar.gz", gzipped=True, start=start)
    one_way = io.BufferedReader(NonSeekable(bytes(data[:length])))
    with contextlib.suppress(ShardmixError):
        list(reads.tar_samples(one_way, "x.tar.gz", gzipped=True, start=start))  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), max_size=6),
    st.integers(0, len(_VALID)),
    st.booleans(),
)
def test_mutated_archives_with_a_damage_handler_never_raise(
    changes: list[tuple[int, int]], length: int, compress: bool
) -> None:
    """With ``on_damage`` every damage is reported, none raised; indices stay file positions."""
    data = bytearray(_VALID)
    for position, value in changes:
        data[position] = value
    raw = bytes(data[:length])
    reports: list[Any] = []
    located = reads.tar_located(
        io.BytesIO(gzip.compress(raw, mtime=0) if compress else raw),
        "x.tar",
        gzipped=compress,
        on_damage=reports.append,
    )
    indexed = [(index, sample) for index, _, sample in located]
    indices = [index for index, _ in indexed]
    assert indices == sorted(set(indices))
    assert sum(report.rest_of_shard for report in reports) <= 1
    if not reports:
        assert list(reads.tar_samples(io.BytesIO(raw), "x.tar")) == [s for _, s in indexed]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(_VALID) - 1), st.integers(0, 255))
def test_mutated_headers_raise_only_shardmix_errors(block: int, value: int) -> None:
    """Mutations aimed at header fields, with the checksum fixed so the field is parsed."""
    data = with_header_field(_VALID, block, value)
    read_or_shardmix_error(data)
    read_or_shardmix_error(data, start=2)


def with_header_field(valid: bytes, position: int, value: int) -> bytes:
    """``valid`` with the byte at ``position`` set to ``value`` (the typeflag instead, where
    that is in a checksum field) and its header's checksum made to match."""
    data = bytearray(valid)
    header = (position // BLOCK) * BLOCK
    within = position % 500
    data[header + (156 if 148 <= within < 156 else within)] = value
    data[header + 148 : header + 156] = b" " * 8
    data[header + 148 : header + 156] = b"%06o\x00 " % sum(data[header : header + BLOCK])
    return bytes(data)


# -- runs: the fast path reads exactly what the member-by-member path reads -----------------


def _stdlib_archive(tar_format: int) -> bytes:
    """Members the fast path must hand over: directories, links, pax and long names, a ustar
    prefix, an old-style directory, beside plain members."""
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tar_format) as archive:

        def add(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.type = len(data), kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "a/one.txt"
            archive.addfile(
                info, io.BytesIO(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else None
            )

        for record in range(3):
            add(f"a/r{record}.txt", b"%d" % record * 300)
            add(f"a/r{record}.cls", b"%d" % record)
        add("a", kind=tarfile.DIRTYPE)
        add("a/old/", kind=tarfile.AREGTYPE)  # type NUL and a trailing slash: a directory
        add("a/one.link", kind=tarfile.SYMTYPE)
        add("/".join(["d" * 40] * 3) + "/two.txt", b"2" * 700)  # prefix (ustar) or long name
        add("a/r9.txt", b"nine", kind=tarfile.AREGTYPE)
        for record in range(3, 6):
            add(f"a/r{record}.txt", b"%d" % record * 1100)
    return out.getvalue()


def _reading(stream: Any, **kwargs: Any) -> tuple[list[Any], list[Any], Any]:
    """What a reader gives: located samples, damage reports, and the error it ended with."""
    reports: list[Any] = []
    if kwargs.pop("report", False):
        kwargs["on_damage"] = reports.append
    located: list[Any] = []
    ended: Any = None
    try:
        for record, offset, sample in reads.tar_located(stream, "x.tar", **kwargs):
            located.append((record, offset, sample))
    except ShardmixError as error:
        ended = (type(error), str(error))
    reported = [
        (type(r.error), str(r.error), r.record, r.offset, r.size, r.rest_of_shard) for r in reports
    ]
    return located, reported, ended


def _reading_blocks(stream: Any, **kwargs: Any) -> tuple[list[Any], list[Any], Any]:
    """As :func:`_reading`, through record blocks (each checked whole), expanded again."""
    reports: list[Any] = []
    if kwargs.pop("report", False):
        kwargs["on_damage"] = reports.append
    limits = {name: kwargs.pop(name) for name in ("max_member_bytes",) if name in kwargs}
    located: list[Any] = []
    ended: Any = None
    try:
        for block in TarReader(**limits).blocks(stream, "x.tar", ShardRead(**kwargs)):
            width = len(block.fields)
            assert block.records and len(set(block.fields)) == width == len(block.values)
            assert {len(block.offsets), len(block.keys)} | set(map(len, block.values)) == {
                len(block.records)
            }
            located.extend(block.located())
    except ShardmixError as error:
        ended = (type(error), str(error))
    reported = [
        (type(r.error), str(r.error), r.record, r.offset, r.size, r.rest_of_shard) for r in reports
    ]
    return located, reported, ended


def assert_runs_read_as_members_do(data: bytes, **kwargs: Any) -> None:
    """Buffered streams (runs) of several buffer sizes, seekable or not, read ``data`` as a
    stream without a buffer to look into (member by member) does, errors included, in samples
    and in record blocks."""
    expected = _reading(io.BytesIO(data), **kwargs)
    assert _reading_blocks(io.BytesIO(data), **kwargs) == expected
    for size in (1024, 1536, 4096, 1 << 16):
        assert _reading(io.BufferedReader(io.BytesIO(data), size), **kwargs) == expected
        one_way = io.BufferedReader(NonSeekable(data), size)
        assert _reading(one_way, **kwargs) == expected
        buffered = io.BufferedReader(io.BytesIO(data), size)
        assert _reading_blocks(buffered, **kwargs) == expected
        assert _reading_blocks(io.BufferedReader(NonSeekable(data), size), **kwargs) == expected


@pytest.mark.parametrize("tar_format", ["ustar", "gnu", "pax"])
def test_runs_hand_other_members_to_the_member_by_member_path(tar_format: str) -> None:
    import tarfile

    formats = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
    data = _stdlib_archive(formats[tar_format])
    located, reported, ended = _reading(io.BufferedReader(io.BytesIO(data), 4096))
    keys = [sample["__key__"] for _, _, sample in located]
    assert keys == ["a/r0", "a/r1", "a/r2", "/".join(["d" * 40] * 3) + "/two", "a/r9"] + [
        f"a/r{record}" for record in range(3, 6)
    ]
    assert located[5][2]["txt"] == b"3" * 1100 and ended is None and not reported
    for start in (0, 2, 5):
        assert_runs_read_as_members_do(data, start=start)


_RUNS = write_tar(make_samples(12, big=300) + make_samples(4, shard=1, big=2000))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(_RUNS) - 1), st.integers(0, 255)), max_size=4),
    st.integers(0, len(_RUNS)),
    st.integers(0, 6),
    st.booleans(),
)
def test_runs_read_damaged_archives_as_members_do(
    changes: list[tuple[int, int]], length: int, start: int, report: bool
) -> None:
    data = bytearray(_RUNS)
    for position, value in changes:
        data[position] = value
    assert_runs_read_as_members_do(bytes(data[:length]), start=start, report=report)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(_RUNS) - 1), st.integers(0, 255), st.booleans())
def test_runs_read_damaged_header_fields_as_members_do(
    position: int, value: int, report: bool
) -> None:
    """A header field changed and its checksum made to match, so that the fast path's own
    checks (type, layout, size, name) see the change."""
    data = with_header_field(_RUNS, position, value)
    assert_runs_read_as_members_do(data, report=report)
    assert_runs_read_as_members_do(data, start=3, max_member_bytes=1000, report=report)


def test_an_empty_pax_header_is_part_of_the_entry_of_the_member_after_it() -> None:
    """A pax header that holds no record (the first member's typeflag made 'x': its data, all
    zeros, holds none) still begins the next member's entry, on both paths: the record starts
    at the pax header, and the two headers share one member number."""
    data = with_header_field(_RUNS, 156, ord("x"))
    assert data[512:1024] == bytes(512)  # the first member's data: no pax record in it
    for stream in (io.BytesIO(data), io.BufferedReader(io.BytesIO(data), 1 << 16)):
        located, reported, ended = _reading(stream)
        assert located[0] == (0, 0, {"__key__": "shard0/r00000", "txt": b"0:0"})
        assert not reported and ended is None
    assert_runs_read_as_members_do(data)


@pytest.mark.parametrize("report", [False, True])
def test_runs_report_a_reappearing_key_and_a_repeated_field_as_members_do(report: bool) -> None:
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name in ["a/r0.txt", "a/r1.txt", "a/r1.txt", "a/r2.txt", "a/r0.cls", "a/r3.txt"]:
            info = tarfile.TarInfo(name)
            info.size = 100
            archive.addfile(info, io.BytesIO(bytes(100)))
    located, reported, ended = _reading(
        io.BufferedReader(io.BytesIO(out.getvalue()), 8192), report=report
    )
    if report:
        assert [sample["__key__"] for _, _, sample in located] == ["a/r0", "a/r2", "a/r3"]
        assert ["repeats field" in r[1] for r in reported] == [True, False]
        assert (
            "appears again at member 4 after its record 0 (which began at byte offset 0)"
            in reported[1][1]
        )
    else:
        assert ended[0] is CorruptShardError and "repeats field 'txt'" in ended[1]
    assert_runs_read_as_members_do(out.getvalue(), report=report)


# Member names that group in every way a shard can: records of two or three fields, fields out
# of a block's order or repeated, keys that come back, a field named like the key, names that
# are not samples (no dot, metadata), directories.
_MEMBER_NAMES = st.sampled_from(
    ["a/r0.txt", "a/r0.cls", "a/r1.txt", "a/r1.cls", "a/r1.seg.png", "a/r2.cls", "a/r2.txt"]
    + ["a/r3.TXT", "a/r3.__key__", "README", "__meta__/x.json", "a/.json", "b/r0.txt"]
)


def _archive_of(names: list[str], sizes: list[int]) -> bytes:
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for number, (name, size) in enumerate(zip(names, sizes, strict=True)):
            info = tarfile.TarInfo(name)
            info.size = size
            archive.addfile(info, io.BytesIO(bytes([number % 251]) * size))
    return out.getvalue()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_MEMBER_NAMES, st.integers(0, 1500)), max_size=24),
    st.integers(0, 4),
    st.booleans(),
)
def test_records_of_any_grouping_read_the_same_in_runs_and_blocks(
    members: list[tuple[str, int]], start: int, report: bool
) -> None:
    """The fast loop's records and blocks, on names that end its blocks and hand members to
    the loop that handles every case, are what the member-by-member path reads."""
    data = _archive_of([name for name, _ in members], [size for _, size in members])
    assert_runs_read_as_members_do(data, start=start, report=report)
    assert_runs_read_as_members_do(data, start=start, max_member_bytes=1000, report=report)


def test_blocks_hold_records_of_one_layout() -> None:
    """A record whose fields differ from its block's comes in a block of its own; the others
    share blocks, which end only where a run of the stream's buffer does (a few here)."""
    names, sizes = [], []
    for record in range(40):
        fields = ["cls", "txt", "seg.png"] if record == 20 else ["cls", "txt"]
        for field in fields:
            names.append(f"a/r{record:02d}.{field}")
            sizes.append(10)
    data = _archive_of(names, sizes)
    blocks = list(TarReader().blocks(io.BufferedReader(io.BytesIO(data), 1 << 16), "x.tar"))
    odd = [block for block in blocks if 20 in block.records]
    assert len(odd) == 1 and odd[0].records == [20] and odd[0].keys == ["a/r20"]
    assert odd[0].fields == ("cls", "txt", "seg.png")
    assert odd[0].values[2] == [bytes([42]) * 10]  # member 42 of the archive
    assert all(block.fields == ("cls", "txt") for block in blocks if block is not odd[0])
    assert [record for block in blocks for record in block.records] == list(range(40))
    assert len(blocks) <= 6 and len(blocks[0]) >= 16


def test_a_few_headers_are_checked_as_many_are():
    """Up to a handful of headers are checked one by one in Python, more at once with numpy:
    both say how many of the first headers are plain, whichever bytes a damage changed."""
    import random

    from shardmix.formats.tar.headers import BLOCK, plain_count

    buffer = io.BytesIO()
    with TarWriter(buffer) as writer:
        for index in range(12):
            writer.write({"__key__": f"k{index:02d}", "bin": bytes(index * 37 % 700)})
    data = buffer.getvalue()
    headers, at = [], 0
    while data[at : at + BLOCK] != bytes(BLOCK):
        headers.append(at)
        at += BLOCK + -(-int(data[at + 124 : at + 135], 8) // BLOCK) * BLOCK
    assert len(headers) == 12
    chance = random.Random(5)
    mismatched = []
    for trial in range(400):
        damaged = bytearray(data)
        for _ in range(chance.randrange(3)):
            where = chance.choice(headers[:4]) + chance.choice(
                [0, 100, 135, 148, 150, 153, 154, 156]
            )
            damaged[where] = chance.randrange(256)
        damaged_bytes = bytes(damaged)
        every = plain_count(damaged_bytes, 0, headers)  # the numpy path
        for few in range(1, 5):
            if plain_count(damaged_bytes, 0, headers[:few]) != min(few, every):
                mismatched.append((trial, few))
    assert mismatched == []


def test_a_buffer_far_larger_than_a_run_reads_as_members_do():
    """A range read's buffer holds the whole range: runs walk it a window at a time."""
    buffer = io.BytesIO()
    with TarWriter(buffer) as writer:
        for index in range(300):
            writer.write({"__key__": f"k{index:03d}", "bin": bytes(index % 9000), "cls": b"1"})
    data = buffer.getvalue()
    expected = _reading(io.BytesIO(data))
    assert len(expected[0]) == 300
    assert _reading(io.BufferedReader(io.BytesIO(data), 1 << 24)) == expected
    assert _reading_blocks(io.BufferedReader(io.BytesIO(data), 1 << 24)) == expected
