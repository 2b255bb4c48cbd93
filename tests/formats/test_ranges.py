"""Range reads: records [a, b) of a shard, seeking to a sparse index entry instead of byte 0."""

import pytest

from shardmix.formats import Format, ShardRead, reader_for

from shards import record_key, write_shards


@pytest.mark.parametrize("every", [1, 5, 8])
def test_a_range_read_from_an_index_entry_matches_a_full_read(tmp_path, fmt, every):
    write_shards(tmp_path, fmt, [37])
    path = str(tmp_path / f"part-0000.{fmt}")
    reader = reader_for(Format(fmt))
    with open(path, "rb") as stream:
        count, index = reader.index(stream, path, every)
    with open(path, "rb") as stream:
        full = [
            (record, offset, s["__key__"]) for record, offset, s in reader.records(stream, path)
        ]
    assert count == 37
    assert index == [full[record][1] for record in range(0, 37, every)]
    for start, stop in [(0, 5), (9, 20), (17, 37), (36, 37), (8, 16), (3, 3)]:
        entry = start // every
        with open(path, "rb") as stream:
            read = ShardRead(start, stop, seek_from=(entry * every, index[entry]))
            found = reader.records(stream, path, read)
            got = [(record, offset, s["__key__"]) for record, offset, s in found]
        assert got == full[start:stop]
        assert [key for _, _, key in got] == [record_key(0, r) for r in range(start, stop)]


def test_seek_from_past_start_is_refused():
    with pytest.raises(ValueError, match="not at or before record 2"):
        ShardRead(2, seek_from=(4, 0))
