"""Resume re-reads the shuffle buffer's residents at their byte offsets (state version 2)."""

import gzip
import shutil
from pathlib import Path

import pytest

import shardmix.reading.reader
from shardmix import ConfigError, MixingLoader, ShardChangedError, ShardDataset
from shardmix.state.codec import pack_refs, unpack_refs
from shardmix.testing import batch_fingerprint, check_resume, checkpoint_after, run_steps

from shards import UNEVEN_SIZES, write_shards


def loader_factory(pattern, *, num_workers=0, transform=None):
    def make():
        dataset = ShardDataset(pattern, seed=0, num_lanes=4, transform=transform)
        return MixingLoader(
            dataset, batch_size=8, num_workers=num_workers, shuffle_buffer=20, seed=0
        )

    return make


def state_after(make, steps):
    loader = make()
    _, state = checkpoint_after(loader, 2, steps)
    loader.close()
    return state


def gzipped_copy(pattern: str, directory: Path) -> str:
    """The shards of ``pattern`` (as written by ``write_shards``) gzip-compressed."""
    source = Path(pattern).parent
    directory.mkdir()
    for path in sorted(source.iterdir()):
        with path.open("rb") as raw, gzip.open(directory / f"{path.name}.gz", "wb") as out:
            shutil.copyfileobj(raw, out)
    return str(directory / f"{Path(pattern).name}.gz")


def test_residents_are_read_at_their_offsets_without_walking_the_shards(uneven_shards, monkeypatch):
    def walk(*args, **kwargs):
        raise AssertionError("a shard was walked by its framing")

    monkeypatch.setattr(shardmix.reading.reader, "read_samples_at", walk)
    make = loader_factory(uneven_shards)
    report = check_resume(make, epochs=2, steps=[1, 5, 11, 17, 23, 30])
    assert report.steps_checked == 6
    refs = unpack_refs(state_after(make, 11)["buffer"]["items"])
    assert len(refs) == 20
    assert all(offset >= 0 for _, _, offset in refs)


def test_gzip_shards_resume_exactly(uneven_shards, tmp_path):
    pattern = gzipped_copy(uneven_shards, tmp_path / "gz")
    check_resume(loader_factory(pattern, num_workers=2), epochs=2, steps=[1, 7, 14, 22, 29])


def test_a_transform_that_returns_a_new_dict_resumes_exactly(uneven_shards):
    def keep_key_only(sample):
        return {"__key__": sample["__key__"]}  # the dataset puts the provenance back

    check_resume(loader_factory(uneven_shards, transform=keep_key_only), epochs=2, steps=[9, 27])


def test_residents_without_offsets_are_found_by_record_index(uneven_shards, monkeypatch):
    walked = []
    walk = shardmix.reading.reader.read_samples_at

    def spy(stream, url, *args, **kwargs):
        walked.append(url)
        return walk(stream, url, *args, **kwargs)

    monkeypatch.setattr(shardmix.reading.reader, "read_samples_at", spy)
    make = loader_factory(uneven_shards)
    reference = [batch_fingerprint(b) for _, b in run_steps(make(), 2)]
    state = state_after(make, 9)
    refs = unpack_refs(state["buffer"]["items"])
    state["buffer"]["items"] = pack_refs([(shard, record, -1) for shard, record, _ in refs])
    restored = make()
    restored.load_state_dict(state)
    assert [batch_fingerprint(b) for _, b in run_steps(restored, 2)] == reference[9:]
    assert len(set(walked)) == len({shard for shard, _, _ in refs})


def test_rewritten_shards_fail_with_an_error_naming_the_shard(tmp_path, fmt):
    pattern = write_shards(tmp_path / "d", fmt, UNEVEN_SIZES, payload_bytes=16)
    make = loader_factory(pattern)
    state = state_after(make, 5)
    # Same URLs and record counts, other record sizes: the shards' identities changed.
    write_shards(tmp_path / "d", fmt, UNEVEN_SIZES, payload_bytes=1_100)
    restored = make()
    restored.load_state_dict(state)
    with pytest.raises(
        ShardChangedError,
        match=rf"^.*part-\d{{4}}\.{fmt}: the shard changed since it was first read: expected "
        r"[\d,]+ bytes, mtime_ns:\d+, found [\d,]+ bytes, mtime_ns:\d+; ",
    ) as caught:
        next(iter(restored))
    assert caught.value.url is not None and caught.value.url.endswith(f".{fmt}")


@pytest.mark.parametrize("version", [3, 4, 5, 6, 7, 8, 9, 10, 11])
def test_an_older_version_state_is_refused(uneven_shards, version):
    make = loader_factory(uneven_shards)
    state = state_after(make, 3)
    state["version"] = version
    with pytest.raises(ConfigError, match=f"has version {version}, this shardmix reads version 12"):
        make().load_state_dict(state)
