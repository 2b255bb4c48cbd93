"""Resume after shards were rewritten under the same names: a named error, never a mix.

The checkpoint carries the identity (size and modification time here) of every shard it
references; a restore that finds another version of one refuses it, whether a lane resumes in
it or a buffer resident is re-read from it, in this process or in worker processes.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from shardmix import ConfigError, MixingLoader, ShardChangedError, ShardDataset
from shardmix.formats.tar_writer import TarWriter
from shardmix.formats.tfrecord_writer import TFRecordWriter
from shardmix.state.codec import unpack_refs

from shards import write_manifest_beside

SIZES = [20, 24, 16, 28]
MTIME_NS = 1_700_000_000_000_000_000
LATER_NS = MTIME_NS + 1_000_000_000
BATCHES = 9

Record = tuple[str, int, int]  # (key, shard, record)


def originals(shard: int, size: int) -> list[Record]:
    return [(f"s{shard:03d}r{record:05d}", shard, record) for record in range(size)]


def write(path: Path, fmt: str, records: list[Record], mtime_ns: int) -> None:
    """One shard of ``records``; every record has the same size, whatever its key or place."""
    if fmt == "tar":
        with TarWriter(path) as writer:
            for key, shard, record in records:
                writer.write({"__key__": key, "txt": f"{shard}:{record:03d}", "bin": b"x" * 16})
    else:
        with TFRecordWriter(path) as writer:
            for key, shard, record in records:
                writer.write_example(
                    {"__key__": key, "shard": shard, "record": record, "bin": b"x" * 16}
                )
    os.utime(path, ns=(mtime_ns, mtime_ns))


def make_loader(pattern: str, num_workers: int = 0) -> MixingLoader:
    dataset = ShardDataset(pattern, seed=5, num_lanes=2)
    return MixingLoader(dataset, batch_size=6, num_workers=num_workers, seed=5, shuffle_buffer=12)


def checkpoint(tmp_path: Path, fmt: str) -> tuple[str, dict, list[str]]:
    """The shards' pattern, the state after BATCHES batches and the keys those gave."""
    for shard, size in enumerate(SIZES):
        write(tmp_path / f"part-{shard}.{fmt}", fmt, originals(shard, size), MTIME_NS)
    pattern = str(tmp_path / f"part-{{0..{len(SIZES) - 1}}}.{fmt}")
    loader = make_loader(pattern)
    batches = iter(loader)
    seen = [key for _ in range(BATCHES) for key in next(batches)["__key__"]]
    state = loader.state_dict()
    loader.close()
    return pattern, state, seen


def lane_shard(state: dict) -> int:
    """A shard a lane is reading at the checkpoint."""
    return next(lane[3] for lane in state["mixer"]["lanes"] if lane[3] >= 0)


def resident_only_shard(state: dict) -> int:
    """A shard only the shuffle buffer's residents come from at the checkpoint."""
    lanes = {lane[3] for lane in state["mixer"]["lanes"]}
    return next(ref[0] for ref in unpack_refs(state["buffer"]["items"]) if ref[0] not in lanes)


def rewritten(shard: int, change: str) -> list[Record]:
    records = originals(shard, SIZES[shard])
    if change == "reordered":
        return records[::-1]
    if change == "new records":  # keys of the same length, so every record keeps its size
        return [(key.replace("s", "n", 1), s, r) for key, s, r in records]
    assert change == "appended"
    return records + [(f"s{shard:03d}r{record:05d}", shard, record) for record in (90, 91)]


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_an_unchanged_restore_gives_every_record_once(tmp_path, fmt):
    pattern, state, seen = checkpoint(tmp_path, fmt)
    resumed = make_loader(pattern)
    resumed.load_state_dict(state)
    rest = [key for batch in resumed for key in batch["__key__"]]
    resumed.close()
    expected = Counter(key for s, size in enumerate(SIZES) for key, _, _ in originals(s, size))
    assert Counter(seen + rest) == expected


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
@pytest.mark.parametrize("change", ["reordered", "new records", "appended"])
@pytest.mark.parametrize("where", ["lane", "resident"])
def test_a_rewritten_shard_is_refused_naming_both_versions(tmp_path, fmt, change, where):
    pattern, state, _ = checkpoint(tmp_path, fmt)
    shard = lane_shard(state) if where == "lane" else resident_only_shard(state)
    path = tmp_path / f"part-{shard}.{fmt}"
    size = path.stat().st_size
    write(path, fmt, rewritten(shard, change), LATER_NS)
    new_size = path.stat().st_size
    assert (new_size == size) == (change != "appended")
    resumed = make_loader(pattern)
    resumed.load_state_dict(state)
    with pytest.raises(ShardChangedError) as caught:
        next(iter(resumed))  # not one batch of a mix of both versions
    resumed.close()
    assert str(caught.value).startswith(
        f"{path}: the shard changed since it was first read: expected {size:,} bytes, "
        f"mtime_ns:{MTIME_NS}, found {new_size:,} bytes, mtime_ns:{LATER_NS}; "
    )
    assert caught.value.url == str(path)


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_worker_processes_refuse_a_rewritten_shard_a_lane_resumes_in(tmp_path, fmt):
    pattern, state, _ = checkpoint(tmp_path, fmt)
    shard = lane_shard(state)
    path = tmp_path / f"part-{shard}.{fmt}"
    write(path, fmt, rewritten(shard, "reordered"), LATER_NS)
    resumed = make_loader(pattern, num_workers=2)
    resumed.load_state_dict(state)
    with pytest.raises(ShardChangedError, match=rf"^{path}: the shard changed since it was"):
        list(resumed)
    resumed.close()


def test_the_state_carries_the_identity_of_every_shard_it_references(tmp_path):
    pattern, state, _ = checkpoint(tmp_path, "tar")
    referenced = {lane[3] for lane in state["mixer"]["lanes"] if lane[3] >= 0}
    referenced |= {ref[0] for ref in unpack_refs(state["buffer"]["items"])}
    sizes = {shard: (tmp_path / f"part-{shard}.tar").stat().st_size for shard in referenced}
    assert state["shards"] == [
        [shard, sizes[shard], f"mtime_ns:{MTIME_NS}"] for shard in sorted(referenced)
    ]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ([99, 10, "mtime_ns:1"], "an entry of a shard 0 to 3"),
        ([0, -1, "mtime_ns:1"], "[shard, size, 'kind:value']"),
        ([0, 10, "no kind"], "[shard, size, 'kind:value']"),
    ],
)
def test_a_damaged_identity_entry_is_refused_naming_it(tmp_path, entry, expected):
    pattern, state, _ = checkpoint(tmp_path, "tar")
    state["shards"][0] = entry
    resumed = make_loader(pattern)
    with pytest.raises(ConfigError) as caught:
        resumed.load_state_dict(state)
        next(iter(resumed))
    resumed.close()
    assert str(caught.value) == (
        f"cannot resume: the loader state's 'shards[0]' should be {expected}, found "
        f"{entry!r}; the state was edited or damaged since it was saved"
    )


def checkpoint_over_http(
    base: str, folder: Path, fmt: str, manifest: bool = False
) -> tuple[str, dict]:
    """The shards served from ``folder`` at ``base`` (and their manifest), and the state after
    BATCHES batches."""
    folder.mkdir()
    for shard, size in enumerate(SIZES):
        write(folder / f"part-{shard}.{fmt}", fmt, originals(shard, size), MTIME_NS)
    if manifest:
        write_manifest_beside(folder, fmt)
    pattern = f"{base}/data/part-{{0..{len(SIZES) - 1}}}.{fmt}"
    loader = make_loader(pattern)
    batches = iter(loader)
    for _ in range(BATCHES):
        next(batches)
    state = loader.state_dict()
    loader.close()
    return pattern, state


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
@pytest.mark.parametrize("change", ["reordered", "appended"])
def test_residents_read_by_range_requests_refuse_a_rewritten_remote_shard(server, fmt, change):
    base, served = server
    folder = served.root / "data"
    pattern, state = checkpoint_over_http(base, folder, fmt)
    shard = resident_only_shard(state)
    name = f"data/part-{shard}.{fmt}"
    size = (folder / f"part-{shard}.{fmt}").stat().st_size
    write(folder / f"part-{shard}.{fmt}", fmt, rewritten(shard, change), LATER_NS)
    new_size = (folder / f"part-{shard}.{fmt}").stat().st_size
    if change == "reordered":  # same size: only the ETag can tell; else the size alone does
        served.etags[name] = '"v2"'
    served.requests.clear()
    resumed = make_loader(pattern)
    resumed.load_state_dict(state)
    with pytest.raises(ShardChangedError) as caught:
        next(iter(resumed))  # not one batch of a mix of both versions
    resumed.close()
    assert caught.value.url == f"{base}/{name}"
    assert "the shard changed" in str(caught.value)
    if change == "reordered":
        assert 'expected etag:"v1", found etag:"v2"' in str(caught.value)
    else:
        assert f"expected {size} bytes, found {new_size} bytes" in str(caught.value)
    ranged = [r for n, r in served.requests if n == name]
    assert ranged and all(r is not None and r.startswith("bytes=") for r in ranged)


def test_identities_cost_len_state_dict_and_a_restore_no_request(server):
    base, served = server
    folder = served.root / "data"
    pattern, state = checkpoint_over_http(base, folder, "tar", manifest=True)  # len(): no count
    referenced = {lane[3] for lane in state["mixer"]["lanes"] if lane[3] >= 0}
    referenced |= {ref[0] for ref in unpack_refs(state["buffer"]["items"])}
    shards = {f"data/part-{shard}.tar" for shard in range(len(SIZES))}
    loader = make_loader(pattern)
    batches = iter(loader)
    next(batches)
    served.requests.clear()
    assert len(loader) == sum(SIZES) // 6 + 1
    loader.state_dict()
    assert (served.requests, served.heads) == ([], [])  # nothing asked of the server
    loader.close()
    resumed = make_loader(pattern)
    resumed.load_state_dict(state)
    assert len(resumed) == sum(SIZES) // 6 + 1
    assert (served.requests, served.heads) == ([("data/part.manifest.json", None)], [])
    served.requests.clear()
    for _ in resumed:  # the restored epoch's reads: the shards it references, and no HEAD
        pass
    resumed.close()
    asked = {name for name, _ in served.requests}
    assert {f"data/part-{shard}.tar" for shard in referenced} <= asked <= shards
    assert served.heads == []


def test_identities_cost_len_state_dict_and_load_state_dict_no_stat(tmp_path, monkeypatch):
    pattern, state, _ = checkpoint(tmp_path, "tar")
    loader, resumed = make_loader(pattern), make_loader(pattern)
    expected = len(loader)  # the counting pass opens (and so stats) every shard, once
    assert len(resumed) == expected
    batches = iter(loader)
    next(batches)
    calls: list[str] = []

    def from_shardmix() -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            if f"{os.sep}shardmix{os.sep}" in frame.f_code.co_filename:
                return True
            frame = frame.f_back
        return False

    for name in ("stat", "fstat", "lstat"):
        real = getattr(os, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            if from_shardmix():  # not pytest's own
                calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, counted)
    assert len(loader) == expected == sum(SIZES) // 6 + 1
    taken = loader.state_dict()
    resumed.load_state_dict(state)  # its opens, at the first batch, check the identities
    monkeypatch.undo()
    loader.close()
    resumed.close()
    assert calls == []
    assert taken["shards"]  # the identities are in the state all the same
