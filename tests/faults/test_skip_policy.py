"""on_error="skip" at the format level: a SkipLedger as the readers' on_damage callback."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import pytest

from shardmix.errors import (
    ConfigError,
    CorruptShardError,
    ShardmixError,
    SkippedDataWarning,
    TooManySkipsError,
)
from shardmix.plan.urls import expand_urls
from shardmix.policy import Damage, ErrorPolicy, OnError, SkipLedger

from faultkit import read_shard, tar_members, tfrecord_offsets
from shards import expected_keys, record_key, write_shards

SIZES = [30, 25, 40, 10, 35, 20]


def read_set(pattern: str, ledger: SkipLedger) -> list[tuple[str, int, str]]:
    """Every delivered sample as ``(shard, index, key)``."""
    return [
        (url, index, sample["__key__"])
        for url in expand_urls(pattern)
        for index, sample in read_shard(url, on_damage=ledger)
    ]


@pytest.mark.parametrize("fmt", ["tfrecord", "tar"])
def test_one_damaged_record_among_many(tmp_path: Path, fmt: str) -> None:
    pattern = write_shards(tmp_path, fmt, SIZES)
    damaged = tmp_path / f"part-0002.{fmt}"
    data = bytearray(damaged.read_bytes())
    if fmt == "tfrecord":
        offsets = tfrecord_offsets(bytes(data))
        data[offsets[17] + 12 + 9] ^= 0x40  # a payload byte: the data CRC catches it
        span = offsets[18] - offsets[17]
    else:  # repeat record 17's first member name in record 18: a repeated field
        members = tar_members(bytes(data))
        first, second = members[2 * 17], members[2 * 18]
        data[second[0] : second[0] + 100] = data[first[0] : first[0] + 100]
        data[second[0] + 148 : second[0] + 156] = b" " * 8
        checksum = sum(data[second[0] : second[0] + 512])
        data[second[0] + 148 : second[0] + 156] = b"%06o\x00 " % checksum
        span = members[2 * 18 + 1][0] - members[2 * 17][0]  # 17.bin, 17.txt, "17.bin"
    damaged.write_bytes(bytes(data))
    ledger = SkipLedger(max_skips=100)
    with pytest.warns(SkippedDataWarning) as caught:
        delivered = read_set(pattern, ledger)

    lost = "s002r00017"
    assert Counter(key for _, _, key in delivered) == expected_keys(SIZES) - Counter([lost])
    for url, index, key in delivered:  # __index__ stays the position in the file
        assert key == record_key(int(Path(url).stem.split("-")[1]), index)
    summary = ledger.summary()
    assert summary == {
        "skips": 1,
        "records": 1,
        "bytes": span,
        "shards_cut": 0,
        "uncounted_cuts": 0,
        "shards": {
            str(damaged): {
                "skips": 1,
                "records": 1,
                "bytes": span,
                "cut": 0,
                "uncounted": 0,
                "first": summary["shards"][str(damaged)]["first"],
            }
        },
    }
    first = summary["shards"][str(damaged)]["first"]
    assert f"{damaged}: record 17 at byte offset" in first and "record 17 was skipped" in first
    assert json.loads(json.dumps(summary)) == summary
    (warning,) = caught
    assert str(damaged) in str(warning.message) and "record 17" in str(warning.message)


def test_warns_once_per_shard(tmp_path: Path) -> None:
    write_shards(tmp_path, "tfrecord", [20, 20])
    urls = [tmp_path / "part-0000.tfrecord", tmp_path / "part-0001.tfrecord"]
    for path in urls:
        data = bytearray(path.read_bytes())
        for offset in tfrecord_offsets(bytes(data))[::4]:
            data[offset + 14] ^= 1
        path.write_bytes(bytes(data))
    ledger = SkipLedger()
    with pytest.warns(SkippedDataWarning) as caught:
        for path in urls:
            read_shard(path, on_damage=ledger)
    assert [str(url) in str(w.message) for url, w in zip(urls, caught, strict=True)] == [True] * 2
    assert ledger.skips == 10 and ledger.summary()["records"] == 10


def test_too_many_skips_summarises_everything(tmp_path: Path) -> None:
    write_shards(tmp_path, "tfrecord", [12])
    path = tmp_path / "part-0000.tfrecord"
    data = bytearray(path.read_bytes())
    for offset in tfrecord_offsets(bytes(data))[:6]:
        data[offset + 14] ^= 1
    path.write_bytes(bytes(data))
    ledger = SkipLedger(max_skips=4, warn=False)
    with pytest.raises(TooManySkipsError) as info:
        read_shard(path, on_damage=ledger)
    message = str(info.value)
    assert message.startswith("5 skips of damaged data, more than max_skips=4")
    assert "5 records" in message and f"{path}: 5 skips" in message
    assert f"first: {path}: record 0 at byte offset 0" in message
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ShardmixError)


def test_cut_shards_count_against_the_budget(tmp_path: Path) -> None:
    write_shards(tmp_path, "tar", [5, 5, 5])
    paths = sorted(tmp_path.glob("*.tar"))
    for path in paths:
        path.write_bytes(path.read_bytes()[:-1024])  # no end-of-archive blocks
    ledger = SkipLedger(max_skips=2, warn=False)
    read_shard(paths[0], on_damage=ledger)
    read_shard(paths[1], on_damage=ledger)
    assert ledger.summary()["shards_cut"] == 2
    with pytest.raises(TooManySkipsError, match="3 shards cut short"):
        read_shard(paths[2], on_damage=ledger)


def fake_damage(url: str, record: int, *, rest: bool = False) -> Damage:
    error = CorruptShardError(f"{url}: record {record}: damaged", url=url, record=record)
    return Damage(error, record, 100 * record, None if rest else 40, rest_of_shard=rest)


def test_worker_ledgers_merge_in_the_main_process() -> None:
    workers = [SkipLedger(warn=False), SkipLedger(warn=False)]
    main = SkipLedger(max_skips=5)
    workers[0](fake_damage("a.tfrecord", 1))
    workers[1](fake_damage("b.tfrecord", 3, rest=True))
    with pytest.warns(SkippedDataWarning) as caught:
        for worker in workers:
            delta = worker.take()
            assert delta is not None
            main.merge(json.loads(json.dumps(delta)))  # as it travels between processes
    assert [str(w.message).split(" (")[0] for w in caught] == [
        "skipping damaged data in a.tfrecord",
        "skipping damaged data in b.tfrecord",
    ]
    assert workers[0].take() is None  # a delta is handed out once
    workers[0](fake_damage("a.tfrecord", 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a.tfrecord was warned about already
        main.merge(workers[0].take() or {})
    assert main.summary()["skips"] == 3
    assert main.summary()["shards"]["a.tfrecord"]["records"] == 2
    assert main.summary()["shards"]["a.tfrecord"]["bytes"] == 80
    assert main.summary()["shards"]["b.tfrecord"]["cut"] == 1
    assert "record 1" in main.summary()["shards"]["a.tfrecord"]["first"]
    assert workers[0].summary()["skips"] == 2  # the cumulative view stays
    for record in range(3):
        workers[1](fake_damage("c.tfrecord", record))
    too_many = pytest.raises(TooManySkipsError, match="6 skips .* more than max_skips=5")
    with pytest.warns(SkippedDataWarning, match="c.tfrecord"), too_many:
        main.merge(workers[1].take() or {})


def test_unbounded_ledger_never_raises() -> None:
    ledger = SkipLedger(max_skips=None, warn=False)
    for record in range(1000):
        ledger(fake_damage("x.tar", record))
    assert ledger.skips == 1000 and bool(ledger)
    assert not SkipLedger()


def test_merge_refuses_what_is_not_a_summary() -> None:
    with pytest.raises(TypeError):
        SkipLedger().merge({"shards": [1, 2]})


def test_error_policy() -> None:
    assert ErrorPolicy().on_error is OnError.RAISE and ErrorPolicy().max_skips == 100
    assert ErrorPolicy("skip").on_error is OnError.SKIP  # type: ignore[arg-type]
    assert ErrorPolicy(OnError.SKIP, max_skips=None).skips
    ledger = SkipLedger.for_policy(ErrorPolicy(OnError.SKIP, max_skips=7))
    assert ledger.max_skips == 7
    with pytest.raises(ConfigError, match="on_error must be one of 'raise', 'skip'"):
        ErrorPolicy("ignore")  # type: ignore[arg-type]
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="max_skips"):
            ErrorPolicy(OnError.SKIP, max_skips=bad)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        ErrorPolicy().max_skips = 3  # type: ignore[misc]
