"""Tar damage in real shards: never a silently short shard; errors name file, member, offset."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from shardmix.errors import CorruptShardError, TruncatedShardError
from shardmix.formats import ReadOptions
from shardmix.formats.tar_writer import TarWriter

from faultkit import BLOCK, Reports, keys, peak_memory, read_shard, set_tar_size, tar_members
from shards import record_key, write_shards

RECORDS = 10  # each record: members <key>.bin (300 bytes) and <key>.txt, three blocks in all
MiB = 1 << 20


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    write_shards(tmp_path, "tar", [RECORDS], payload_bytes=300)
    return tmp_path / "part-0000.tar"


def expected(records: range | list[int]) -> list[str]:
    return [record_key(0, r) for r in records]


def edit(path: Path, position: int, value: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] = value
    path.write_bytes(bytes(data))


def cut(path: Path, length: int) -> None:
    path.write_bytes(path.read_bytes()[:length])


def test_damaged_header_mid_archive(shard: Path) -> None:
    offset, name, _ = tar_members(shard.read_bytes())[9]  # record 4's second member
    edit(shard, offset + 40, ord("?"))
    with pytest.raises(CorruptShardError, match="bad checksum") as info:
        read_shard(shard)
    assert f"{shard}: at byte offset {offset}" in str(info.value)
    assert "member 9" in str(info.value)
    assert (info.value.url, info.value.offset) == (str(shard), offset)


@pytest.mark.parametrize("member", [1, 2, 7, 2 * RECORDS])
def test_cut_between_members(shard: Path, member: int) -> None:
    members = tar_members(shard.read_bytes())
    end = members[member][0] if member < len(members) else shard.stat().st_size - 2 * BLOCK
    cut(shard, end)
    with pytest.raises(TruncatedShardError, match="without its end-of-archive blocks") as info:
        read_shard(shard)
    assert f"{shard}: at byte offset {end}" in str(info.value)
    assert f"ends after {member} members" in str(info.value)


@pytest.mark.parametrize("into", [1, 300, 450])
def test_cut_mid_member(shard: Path, into: int) -> None:
    offset, name, size = tar_members(shard.read_bytes())[6]  # record 3's .bin, 300 bytes
    cut(shard, offset + BLOCK + into)
    with pytest.raises(TruncatedShardError) as info:
        read_shard(shard)
    message = str(info.value)
    assert f"{shard}: at byte offset {offset + BLOCK + into}" in message
    assert f"tar member 6 '{name}' (header at byte offset {offset}) declares {size}" in message
    assert f"but the file ends after {into}" in message


@pytest.mark.parametrize("into", [1, 511])
def test_cut_mid_header(shard: Path, into: int) -> None:
    offset, _, _ = tar_members(shard.read_bytes())[5]
    cut(shard, offset + into)
    with pytest.raises(TruncatedShardError) as info:
        read_shard(shard)
    assert f"{shard}: at byte offset {offset}" in str(info.value)
    assert f"expected a 512-byte tar header, found {into} bytes" in str(info.value)


def test_missing_end_of_archive_blocks(shard: Path) -> None:
    cut(shard, shard.stat().st_size - 2 * BLOCK)
    with pytest.raises(TruncatedShardError, match="without its end-of-archive"):
        read_shard(shard)


def test_one_end_block_is_enough(shard: Path) -> None:
    cut(shard, shard.stat().st_size - BLOCK)
    assert keys(read_shard(shard)) == expected(range(RECORDS))


def test_junk_after_the_end(shard: Path) -> None:
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes() + bytes(300) + b"junk")
    with pytest.raises(CorruptShardError, match="non-zero bytes follow the end") as info:
        read_shard(shard)
    assert info.value.offset == size + 300
    assert f"{shard}: at byte offset {size + 300}" in str(info.value)


def test_zero_byte_tar_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.tar"
    path.write_bytes(b"")
    with pytest.raises(TruncatedShardError, match="the tar shard is empty") as info:
        read_shard(path)
    assert str(path) in str(info.value)


def test_archive_with_no_members_is_empty_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "none.tar"
    TarWriter(path).close()
    assert read_shard(path) == []


def test_key_reappearing(tmp_path: Path) -> None:
    path = tmp_path / "again.tar"
    first = tar_bytes([("a", "txt"), ("b", "txt")], end=False)
    path.write_bytes(first + tar_bytes([("a", "cls")]))
    with pytest.raises(CorruptShardError, match="key 'a' appears again at member 2") as info:
        read_shard(path)
    assert (info.value.record, info.value.offset) == (2, len(first))
    assert f"{path}: record 2 at byte offset {len(first)}" in str(info.value)


def test_duplicate_field(tmp_path: Path) -> None:
    path = tmp_path / "twice.tar"
    first = tar_bytes([("a", "txt")], end=False)
    path.write_bytes(first + tar_bytes([("a", "txt"), ("b", "txt")]))
    with pytest.raises(CorruptShardError, match="member 1 'a.txt' repeats field 'txt'") as info:
        read_shard(path)
    assert (info.value.record, info.value.offset) == (0, len(first))


def tar_bytes(members: list[tuple[str, str]], *, end: bool = True) -> bytes:
    """An archive of one-member samples ``(key, field)``, optionally without its end blocks."""
    import io

    buffer = io.BytesIO()
    with TarWriter(buffer) as writer:
        for key, field in members:
            writer.write({"__key__": key, field: f"{key}.{field}"})
    data = buffer.getvalue()
    return data if end else data[: -2 * BLOCK]


# -- size limits ------------------------------------------------------------------------------


def test_member_over_max_member_bytes_is_refused(shard: Path) -> None:
    offset, name, size = tar_members(shard.read_bytes())[0]  # the first .bin, 300 bytes
    with pytest.raises(CorruptShardError) as info:
        read_shard(shard, options=ReadOptions(max_member_bytes=200))
    message = str(info.value)
    assert f"{shard}: record 0 at byte offset {offset}" in message
    assert f"tar member 0 '{name}' declares {size} bytes of data" in message
    assert "more than max_member_bytes=200" in message


def test_huge_member_size_is_refused_before_allocating(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    offset, name, _ = tar_members(bytes(data))[8]
    set_tar_size(data, offset, 5 << 30)  # a valid header that claims 5 GiB
    shard.write_bytes(bytes(data))
    with peak_memory() as peak, pytest.raises(CorruptShardError) as info:
        read_shard(shard)
    assert f"tar member 8 '{name}' declares {5 << 30} bytes" in str(info.value)
    assert f"max_member_bytes={1 << 30}" in str(info.value)
    assert info.value.offset == offset and info.value.record == 4
    assert peak[0] < 4 * MiB


def test_member_size_past_the_end_is_truncation_with_flat_memory(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    offset, _, _ = tar_members(bytes(data))[8]
    set_tar_size(data, offset, (1 << 30) - 1)  # under the limit, far more than the file
    shard.write_bytes(bytes(data))
    with peak_memory() as peak, pytest.raises(TruncatedShardError, match="declares 1073741823"):
        read_shard(shard)
    assert peak[0] < 40 * MiB  # at most one read chunk (16 MiB)


# -- gzip -------------------------------------------------------------------------------------


@pytest.fixture
def gz_shard(tmp_path: Path, shard: Path) -> Path:
    path = tmp_path / "part-0000.tar.gz"
    path.write_bytes(gzip.compress(shard.read_bytes(), mtime=0))
    return path


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9])
def test_truncated_tar_gz(gz_shard: Path, keep: float) -> None:
    cut(gz_shard, int(gz_shard.stat().st_size * keep))
    with pytest.raises(TruncatedShardError) as info:
        read_shard(gz_shard)
    assert str(gz_shard) in str(info.value)


def test_tar_gz_with_bad_crc(gz_shard: Path) -> None:
    data = bytearray(gz_shard.read_bytes())
    data[-7] ^= 0xFF  # the gzip trailer's CRC32
    gz_shard.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match="damaged gzip data") as info:
        read_shard(gz_shard)
    assert str(gz_shard) in str(info.value)


def test_tar_gz_bomb_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.tar.gz"
    with TarWriter(path, gzip=True) as writer:
        writer.write({"__key__": "zeros", "bin": bytes(16 * MiB)})
    assert path.stat().st_size < 100_000
    with peak_memory() as peak, pytest.raises(CorruptShardError) as info:
        read_shard(path, options=ReadOptions(max_inflated_bytes=MiB))
    assert f"{path}: the gzip stream inflates past max_inflated_bytes={MiB}" in str(info.value)
    assert peak[0] < 40 * MiB
    with pytest.raises(CorruptShardError, match=f"declares {16 * MiB} bytes"):
        read_shard(path, options=ReadOptions(max_member_bytes=MiB))


# -- reports instead of errors ----------------------------------------------------------------


def test_damaged_header_is_reported_and_ends_the_shard(shard: Path) -> None:
    members = tar_members(shard.read_bytes())
    offset = members[9][0]  # record 4's .txt header
    edit(shard, offset + 40, ord("?"))
    reports = Reports()
    indexed = read_shard(shard, on_damage=reports)
    assert keys(indexed) == expected(range(4))
    (report,) = reports
    assert report.rest_of_shard and report.record == 4
    assert report.offset == members[8][0]  # where record 4 began
    assert "bad checksum" in str(report.error)


def test_duplicate_field_is_reported_and_its_record_skipped(tmp_path: Path) -> None:
    path = tmp_path / "twice.tar"
    head = tar_bytes([("a", "txt"), ("b", "txt")], end=False)
    body = tar_bytes([("b", "txt")], end=False)
    path.write_bytes(head + body + tar_bytes([("b", "cls"), ("c", "txt")]))
    reports = Reports()
    indexed = read_shard(path, on_damage=reports)
    assert [(i, s["__key__"]) for i, s in indexed] == [(0, "a"), (2, "c")]
    (report,) = reports
    assert (report.record, report.rest_of_shard) == (1, False)
    assert report.offset == 2 * BLOCK and report.size == 3 * 2 * BLOCK  # b.txt, b.txt, b.cls
    assert "repeats field 'txt'" in str(report.error)


def test_reappearing_key_is_reported_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "again.tar"
    path.write_bytes(tar_bytes([("a", "txt"), ("b", "txt")], end=False) + tar_bytes([("a", "x")]))
    reports = Reports()
    assert [(i, s["__key__"]) for i, s in read_shard(path, on_damage=reports)] == [
        (0, "a"),
        (1, "b"),
    ]
    assert [(r.record, r.size) for r in reports] == [(2, 2 * BLOCK)]


def test_oversized_member_is_reported_and_its_record_skipped(tmp_path: Path) -> None:
    path = tmp_path / "big.tar"
    with TarWriter(path) as writer:
        writer.write({"__key__": "a", "txt": "small"})
        writer.write({"__key__": "b", "bin": bytes(900), "txt": "small"})
        writer.write({"__key__": "c", "txt": "small"})
    reports = Reports()
    indexed = read_shard(path, options=ReadOptions(max_member_bytes=800), on_damage=reports)
    assert [(i, s["__key__"]) for i, s in indexed] == [(0, "a"), (2, "c")]
    (report,) = reports
    assert (report.record, report.offset, report.size) == (1, 2 * BLOCK, 5 * BLOCK)
    assert "declares 900 bytes of data, more than max_member_bytes=800" in str(report.error)


def test_junk_after_the_end_keeps_every_record(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes() + b"junk")
    reports = Reports()
    assert keys(read_shard(shard, on_damage=reports)) == expected(range(RECORDS))
    (report,) = reports
    assert report.rest_of_shard and report.record == RECORDS


def test_missing_end_blocks_drop_the_last_record(shard: Path) -> None:
    """Without the end blocks the last record may have lost members: it is not delivered."""
    cut(shard, shard.stat().st_size - 2 * BLOCK)
    reports = Reports()
    assert keys(read_shard(shard, on_damage=reports)) == expected(range(RECORDS - 1))
    (report,) = reports
    assert report.rest_of_shard and report.record == RECORDS - 1


def test_zero_byte_tar_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "empty.tar"
    path.write_bytes(b"")
    reports = Reports()
    assert read_shard(path, on_damage=reports) == []
    (report,) = reports
    assert report.rest_of_shard and (report.record, report.offset) == (0, 0)
