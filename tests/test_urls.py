"""URL patterns: ``::`` between patterns, fsspec chains kept whole, lists, braces."""

from __future__ import annotations

import pytest

from shardmix.urls import expand_urls, split_patterns

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
