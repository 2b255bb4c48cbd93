"""Tests for shardmix.formats.tar.pax: a pax header's shape answers as reading it would.

:class:`PaxShapes` answers from the shapes it has seen; every answer must be what reading the
header with ``read_pax`` gives, whatever came before. Archives with a pax header before every
member (``tarfile``'s PAX format with float mtimes, as webdataset writes them), damaged
anywhere, the pax data included (which no checksum covers), read the same in runs as member by
member.
"""

from __future__ import annotations

import io
import tarfile

from formats.test_tar_writers import differences
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmix.formats.tar.headers import read_pax
from shardmix.formats.tar.pax import PaxShapes


def _record(key: bytes, value: bytes) -> bytes:
    """One pax record, its length counting itself."""
    body = b" %s=%s\n" % (key, value)
    length = len(body) + 1
    while len(b"%d" % length) + len(body) != length:
        length += 1
    return b"%d%s" % (length, body)


def _changes_nothing(data: bytes) -> bool:
    records = read_pax(data)
    return records is not None and not any(
        key in ("path", "size") or key.startswith("GNU.sparse.") for key in records
    )


_HEADERS = [
    _record(b"mtime", b"1700000000.25"),
    _record(b"mtime", b"1700000123.75"),
    _record(b"mtime", b"1700000000.123456789")
    + _record(b"atime", b"1700000001.5")
    + _record(b"ctime", b"1700000002.5"),
    _record(b"comment", b"12 mtime=3\n"),
    _record(b"path", b"a/b1.txt") + _record(b"mtime", b"17"),
    _record(b"size", b"12") + _record(b"uid", b"1000"),
    _record(b"GNU.sparse.size", b"100"),
    _record(b"SCHILY.xattr.user.k9", b"v1"),
    _record(b"mtime", b"1") + b"\x00\x00",
    b"",
]
_POSITIONS = st.one_of(st.integers(0, 3), st.integers(0, 99))  # the first length, often
_MUTATIONS = st.lists(
    st.tuples(_POSITIONS, st.sampled_from(list(b"0123456789 =\n\x00a"))), max_size=3
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_HEADERS), _MUTATIONS), min_size=1, max_size=8))
def test_answers_are_what_read_pax_reads(
    headers: list[tuple[bytes, list[tuple[int, int]]]],
) -> None:
    """Headers of a few shapes, their digits and delimiters changed, one after another."""
    shapes = PaxShapes()
    for data, changes in headers:
        changed = bytearray(data)
        for position, value in changes:
            if position < len(changed):
                changed[position] = value
        for _ in range(2):  # unknown, then known
            assert shapes.changes_nothing(bytes(changed)) == _changes_nothing(bytes(changed))


def test_a_length_changed_within_the_shape_is_read_again() -> None:
    shapes = PaxShapes()
    good = _record(b"mtime", b"1700000000.25")
    assert good.startswith(b"23 ") and shapes.changes_nothing(good)
    assert not shapes.changes_nothing(b"24" + good[2:])  # the shape it knows, another length
    assert not shapes.changes_nothing(good.replace(b"mtime=", b"size=1"))
    assert shapes.changes_nothing(good.replace(b"0.25", b"9.75"))


def _pax_archive() -> bytes:
    """A pax header before every member (float mtimes), one with a path, one with a comment."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for number in range(10):
            for field, size in (("txt", 40), ("cls", 3)):
                info = tarfile.TarInfo(f"s/r{number}.{field}")
                info.size, info.mtime = size, 1_700_000_000.25 + number
                if number == 4 and field == "cls":
                    info.pax_headers = {"comment": "size=9 path=x"}
                if number == 6:
                    info.name = f"s/{'d' * 120}/r{number}.{field}"  # a pax path record
                archive.addfile(info, io.BytesIO(bytes([number]) * size))
    return out.getvalue()


_PAX_ARCHIVE = _pax_archive()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, len(_PAX_ARCHIVE) - 1),
            st.sampled_from(list(b"0123456789 =\n\x00a\xff")),
        ),
        max_size=3,
    ),
    st.booleans(),
)
def test_damaged_pax_archives_read_the_same_on_every_path(
    changes: list[tuple[int, int]], report: bool
) -> None:
    data = bytearray(_PAX_ARCHIVE)
    for position, value in changes:
        data[position] = value
    assert differences(bytes(data), report=report) == []


def test_pax_data_damaged_in_a_length_reads_the_same_on_every_path() -> None:
    """Each pax header's length field changed by one digit: no checksum covers it."""
    data = _PAX_ARCHIVE
    at = data.find(b" mtime=")
    assert at > 0
    for start in range(0, len(data), 512 * 4):
        found = data.find(b" mtime=", start)
        if found < 0:
            break
        changed = bytearray(data)
        changed[found - 1] ^= 1  # the length's last digit
        assert differences(bytes(changed), report=True) == []
        assert differences(bytes(changed), report=False) == []


def test_pax_header_blocks_known_plain_give_the_runs_a_cold_walk_gives() -> None:
    """A pax header block found plain once is not checked again, only compared: every byte of
    one changed (its checksum then wrong, or a size, a name), the run a walk with the blocks
    known finds is the one a walk knowing nothing finds."""
    from shardmix.formats.tar.runs import plain_members

    data = _PAX_ARCHIVE
    warm = PaxShapes()
    found = plain_members(data, 0, 1 << 30, warm)
    assert found is not None and found == plain_members(data, 0, 1 << 30, PaxShapes())
    assert [block for block in warm.blocks.values() if block is not None]
    pax = [at for at in range(0, len(data), 512) if data[at + 156] == ord("x")]
    assert len(pax) == 20
    for header in pax[2:4]:
        for position in range(header, header + 512):
            for value in (data[position] ^ 1, ord("0")):
                changed = bytearray(data)
                changed[position] = value
                cold = plain_members(bytes(changed), 0, 1 << 30, PaxShapes())
                assert plain_members(bytes(changed), 0, 1 << 30, warm) == cold, position


def test_pax_header_blocks_that_differ_in_one_size_are_compared_no_more() -> None:
    """Blocks of one size that differ (a name in each, as one tool writes them) are each
    checked, and the size is not compared again; the runs are what a cold walk finds."""
    from shardmix.formats.tar.runs import plain_members

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for number in range(8):
            info = tarfile.TarInfo(f"r{number}.txt")
            info.size, info.mtime = 5, 1_700_000_000.5
            info.pax_headers = {"comment": f"c{number}"}
            archive.addfile(info, io.BytesIO(b"12345"))
    data = bytearray(out.getvalue())
    pax = [at for at in range(0, len(data), 512) if data[at + 156] == ord("x")]
    for number, at in enumerate(pax):  # each pax header its own name, its checksum made good
        data[at : at + 16] = (b"PaxHeaders/r%d" % number).ljust(16, b"\0")
        data[at + 148 : at + 156] = b"        "
        data[at + 148 : at + 155] = b"%06o\0" % sum(data[at : at + 512])
    shapes = PaxShapes()
    cold = plain_members(bytes(data), 0, 1 << 30, PaxShapes())
    assert cold is not None and len(cold[0]) == 8
    assert plain_members(bytes(data), 0, 1 << 30, shapes) == cold
    assert plain_members(bytes(data), 0, 1 << 30, shapes) == cold
    assert list(shapes.blocks.values()) == [None]


def test_pax_records_after_a_block_known_plain_give_the_runs_a_cold_walk_gives() -> None:
    """A pax header's one record after a block found plain is taken by its length, keyword and
    end alone: every byte of one record changed (to another digit, a delimiter, a NUL, a
    ``path`` or a second record), the run a walk with the block known finds is the one a walk
    knowing nothing finds, and a record of a size known, unchanged, keeps its block known."""
    from shardmix.formats.tar.runs import plain_members

    data = _PAX_ARCHIVE
    warm = PaxShapes()
    found = plain_members(data, 0, 1 << 30, warm)
    assert found is not None and found == plain_members(data, 0, 1 << 30, PaxShapes())
    pax = [at for at in range(0, len(data), 512) if data[at + 156] == ord("x")]
    record = pax[3] + 512
    size = int(data[pax[3] + 124 : pax[3] + 135], 8)
    known = warm.blocks[data[pax[3] + 124 : pax[3] + 135]]
    assert known is not None and known[3] is not None  # its one record is compared
    variants = [
        b"%d path=%s\n" % (size, b"a" * (size - 9)),
        b"%d size=%s\n" % (size, b"1" * (size - 9)),
    ]
    variants.append(b"12 mtime=12\n%d mtime=%s\n" % (size - 12, b"1" * (size - 22)))
    for value in variants:
        assert len(value) == size
        changed = bytearray(data)
        changed[record : record + size] = value
        cold = plain_members(bytes(changed), 0, 1 << 30, PaxShapes())
        assert plain_members(bytes(changed), 0, 1 << 30, warm) == cold, value
    for position in range(record, record + size + 2):
        for value in (data[position] ^ 1, ord("0"), ord(" "), ord("="), ord("\n"), 0):
            changed = bytearray(data)
            changed[position] = value
            cold = plain_members(bytes(changed), 0, 1 << 30, PaxShapes())
            assert plain_members(bytes(changed), 0, 1 << 30, warm) == cold, (position, value)
    assert plain_members(data, 0, 1 << 30, warm) == found


def _paired_archive() -> bytes:
    """A pax header of one record before every member, its length alternating (webdataset's
    float mtimes have 16 or 17 digits), with a GNU long name, a directory and a hard link
    among them."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for number in range(12):
            info = tarfile.TarInfo(f"s/r{number}.data")
            info.size, info.mtime = 100 + 300 * (number % 3), 1_700_000_000.5 + number * 0.25
            if number == 5:
                info.type = tarfile.DIRTYPE
                info.size = 0
            if number == 7:
                info.type, info.linkname, info.size = tarfile.LNKTYPE, "s/r1.data", 0
            archive.addfile(info, io.BytesIO(bytes([number]) * info.size))
    data = out.getvalue()
    long_name = tarfile.TarInfo("s/" + "n" * 120 + ".cls")
    long_name.size = 3
    gnu = long_name.tobuf(tarfile.GNU_FORMAT) + b"abc".ljust(512, b"\0")
    at = [at for at in range(0, len(data), 512) if data[at + 156] == ord("x")][9]
    return data[:at] + gnu + data[at:]


def test_members_after_a_pax_block_known_plain_give_the_runs_a_cold_walk_gives() -> None:
    """Where the same pax block and record come before member after member, the walk takes
    them in pairs: every byte of the members' headers changed, and the buffer cut at every
    block, the run a walk with the blocks known finds is the one a walk knowing nothing
    finds."""
    from shardmix.formats.tar.runs import plain_members

    data = _paired_archive()
    warm = PaxShapes()
    found = plain_members(data, 0, 1 << 30, warm)
    assert found is not None and found == plain_members(data, 0, 1 << 30, PaxShapes())
    assert len([block for block in warm.blocks.values() if block and block[3]]) == 2
    assert plain_members(data, 0, 1 << 30, warm) == found
    for cut in range(512, len(data), 512):
        cold = plain_members(data[:cut], 0, 1 << 30, PaxShapes())
        assert plain_members(data[:cut], 0, 1 << 30, warm) == cold, cut
    for cut in (0, 512, 1024, 4096):  # the largest member size a run may take
        for max_size in (0, 100, 399):
            cold = plain_members(data[cut:], 0, max_size, PaxShapes())
            assert plain_members(data[cut:], 0, max_size, warm) == cold, (cut, max_size)
    members = [at for at in range(0, len(data), 512) if data[at + 156] in b"05"][:6]
    for header in members:
        for position in range(header, header + 512):
            for value in (data[position] ^ 1, ord("0"), ord("x"), 0):
                changed = bytearray(data)
                changed[position] = value
                cold = plain_members(bytes(changed), 0, 1 << 30, PaxShapes())
                assert plain_members(bytes(changed), 0, 1 << 30, warm) == cold, position
    for report in (True, False):  # a hard link's data needs a stream that can seek
        assert differences(data, report=report, one_way=False) == []
