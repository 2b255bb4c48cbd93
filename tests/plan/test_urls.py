"""URL patterns: ``::`` between patterns, fsspec chains kept whole, lists, braces."""

from __future__ import annotations

import pytest

from shardmix.errors import ConfigError, ShardNotFoundError, UnsupportedURLError
from shardmix.plan.urls import expand_urls, split_patterns

pytest.importorskip("fsspec")


@pytest.mark.parametrize("cache", ["simplecache", "filecache", "blockcache"])
def test_chains_stay_whole_and_braces_expand(cache: str) -> None:
    assert expand_urls(f"{cache}::s3://b/t-{{0..2}}.tar") == [
        f"{cache}::s3://b/t-{n}.tar" for n in range(3)
    ]


def test_chains_and_plain_patterns_mix() -> None:
    pattern = "a-{1,2}.tar::simplecache::gs://b/x.tar::blockcache::simplecache::s3://c/y.tar"
    assert expand_urls(pattern) == [
        "a-1.tar",
        "a-2.tar",
        "simplecache::gs://b/x.tar",
        "blockcache::simplecache::s3://c/y.tar",
    ]


def test_separator_where_no_chain_is_possible() -> None:
    # a part with a "/" or an unknown name before a URL is a pattern of its own
    assert split_patterns("d/a.tar::s3://b/x.tar") == ["d/a.tar", "s3://b/x.tar"]
    assert split_patterns("nosuchproto::s3://b/x.tar") == ["nosuchproto", "s3://b/x.tar"]
    assert split_patterns("simplecache::d/a.tar") == ["simplecache", "d/a.tar"]


def test_list_of_patterns() -> None:
    assert expand_urls(["simplecache::s3://b/{0,1}.tar", "c.tar"]) == [
        "simplecache::s3://b/0.tar",
        "simplecache::s3://b/1.tar",
        "c.tar",
    ]


def test_a_glob_leaves_out_files_kept_beside_shards(tmp_path) -> None:
    for name in ["a.tar", "b.tfrecord", "train.manifest.json", "b.tfrecord.idx", "c.index"]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "record-counts.json").write_text("{}")
    assert expand_urls(f"{tmp_path}/*") == [f"{tmp_path}/a.tar", f"{tmp_path}/b.tfrecord"]
    with pytest.raises(ShardNotFoundError, match="matches no shard file"):
        expand_urls(f"{tmp_path}/*.json")


def test_an_index_file_named_as_a_shard_is_called_what_it_is() -> None:
    from shardmix.formats.registry import infer_format

    with pytest.raises(UnsupportedURLError, match="is a file kept beside shards") as info:
        infer_format("d/b.tfrecord.idx")
    assert "format=" not in str(info.value)


@pytest.mark.parametrize("pattern", ["d/x-{0..999999999}.tar", "d/{0..9999}-{a..z}-{0..9999}.tar"])
def test_a_pattern_past_the_bound_is_refused_before_expanding(pattern: str) -> None:
    with pytest.raises(ConfigError, match=r"expands to more than 1,000,000 shard URLs"):
        expand_urls(pattern)
    assert len(expand_urls("d/x-{000000..004095}.tar")) == 4096
    assert expand_urls("d/{a..c}-{0..4..2}.tar")[:4] == [
        "d/a-0.tar",
        "d/a-2.tar",
        "d/a-4.tar",
        "d/b-0.tar",
    ]
