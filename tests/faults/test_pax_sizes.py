"""A pax ``size`` record past the end of the file: named (shard, member, offset, sizes), and
under ``on_error="skip"`` the rest of the shard skipped and counted, never a bare OSError."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

import shardmix
from shardmix.errors import CorruptShardError, TruncatedShardError
from shardmix.formats import ReadOptions

from faultkit import Reports, keys, read_shard


def _shard(path: Path, claimed: int) -> Path:
    """Members k0..k3 of 3 bytes each; k1's pax header claims ``claimed`` bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for number in range(4):
            info = tarfile.TarInfo(f"k{number}.txt")
            info.size = 3
            if number == 1:
                info.pax_headers = {"size": str(claimed)}
            archive.addfile(info, io.BytesIO(b"v%02d" % number))
    path.write_bytes(buffer.getvalue())
    return path


@pytest.mark.parametrize("claimed", [10**15, 10**17 + 3, 5 * 10**6])
def test_a_pax_size_past_the_file_is_a_named_truncation_when_skipped(tmp_path, claimed):
    path = _shard(tmp_path / "paxsize.tar", claimed)
    reports = Reports()
    options = ReadOptions(max_member_bytes=1 << 62)  # the size alone is no reason to refuse
    assert keys(read_shard(path, options=options, on_damage=reports)) == ["k0"]
    (report,) = reports
    assert isinstance(report.error, TruncatedShardError) and report.rest_of_shard
    assert report.record == 1
    message = str(report.error)
    assert str(path) in message and f"declares {claimed} bytes of data" in message
    assert "but the file ends after" in message and "byte offset" in message


def test_a_pax_size_past_the_file_stops_the_epoch_by_name(tmp_path):
    path = _shard(tmp_path / "paxsize.tar", 10**15)
    dataset = shardmix.ShardDataset([str(path)], shuffle_shards=False)
    with pytest.raises(CorruptShardError, match=r"paxsize\.tar: record 1 .* 1000000000000000"):
        list(dataset)


def test_skipping_past_a_pax_size_counts_what_it_leaves_out(tmp_path):
    path = _shard(tmp_path / "paxsize.tar", 10**15)
    loader = shardmix.MixingLoader(
        shardmix.ShardDataset([str(path)], shuffle_shards=False, on_error="skip"),
        batch_size=1,
        num_workers=0,
    )
    with pytest.warns(shardmix.SkippedDataWarning, match="1000000000000000"):
        batches = list(loader)
    assert [batch["__key__"] for batch in batches] == [["k0"]]
    skipped = loader.skipped
    assert skipped is not None and skipped["shards_cut"] == 1
    assert list(skipped["shards"]) == [str(path)]
