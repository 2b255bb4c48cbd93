"""on_error="skip" and a tar key met again in a later piece of its shard: the record is
skipped and counted, as a read of the whole shard does, never delivered a second time."""

from __future__ import annotations

import io
import tarfile
import warnings
from collections import Counter
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset

RECORDS = 100
AGAIN = {40: 5, 90: 70}  # record: the earlier record whose key it carries


def key_of(record: int) -> str:
    return f"k{AGAIN.get(record, record):03d}"


def write_shard(path: Path) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for record in range(RECORDS):
            for field in ("txt", "cls"):
                data = f"{record} {field}".encode()
                member = tarfile.TarInfo(f"{key_of(record)}.{field}")
                member.size = len(data)
                archive.addfile(member, io.BytesIO(data))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("piece_records", [16, 32, None])
def test_a_key_met_again_is_skipped_and_counted_whatever_the_pieces(
    tmp_path: Path, num_workers: int, piece_records: int | None
) -> None:
    write_shard(tmp_path / "part-0000.tar")
    dataset = ShardDataset(
        str(tmp_path / "part-0000.tar"), on_error="skip", num_lanes=4, piece_records=piece_records
    )
    loader = MixingLoader(dataset, batch_size=10, num_workers=num_workers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = list(loader)
    texts = Counter(text.decode() for batch in batches for text in batch["txt"])
    assert texts == Counter(f"{record} txt" for record in range(RECORDS) if record not in AGAIN)
    keys = Counter(key for batch in batches for key in batch["__key__"])
    assert keys == Counter(key_of(record) for record in range(RECORDS) if record not in AGAIN)
    skipped = loader.skipped
    assert skipped is not None and (skipped["skips"], skipped["records"]) == (2, 2)


@pytest.mark.parametrize("piece_records", [32, None])
def test_a_resume_between_the_two_records_skips_the_second_too(tmp_path, piece_records):
    write_shard(tmp_path / "part-0000.tar")

    def make() -> MixingLoader:
        dataset = ShardDataset(
            str(tmp_path / "part-0000.tar"),
            on_error="skip",
            num_lanes=4,
            piece_records=piece_records,
        )
        return MixingLoader(dataset, batch_size=10, num_workers=0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = [list(batch["__key__"]) for batch in make()]
        for steps in range(1, len(whole)):
            loader = make()
            batches = iter(loader)
            before = [list(next(batches)["__key__"]) for _ in range(steps)]
            resumed = make()
            resumed.load_state_dict(loader.state_dict())
            assert before + [list(batch["__key__"]) for batch in resumed] == whole, steps
