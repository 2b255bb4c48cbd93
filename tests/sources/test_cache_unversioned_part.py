"""A host that tells no version (no ETag, no Last-Modified) and a bounded cache holding only a
shard's first part: the part is never spliced to the host's bytes, which may be another
version's; the shard is fetched whole again, and every record is the current version's."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.sources import SourceOptions

from shards import write_shard

RECORDS = 120


def write_version(root, version: int, records: int) -> Counter:
    """The shard's version ``version``: same keys, other payloads; its ``(key, payload)``s."""
    rng = np.random.default_rng(version)
    payloads = []

    def payload() -> bytes:
        payloads.append(rng.bytes(3000))
        return payloads[-1]

    write_shard(root / "part-0000.tar", "tar", 0, records, payload=payload)
    return Counter(zip((f"s000r{r:05d}" for r in range(records)), payloads, strict=True))


@pytest.mark.parametrize("records_after", [RECORDS, 90])  # the same size, or another
def test_a_cached_part_of_an_unversioned_shard_is_never_spliced(server, tmp_path, records_after):
    base, state = server
    state.etags["part-0000.tar"] = ""  # no ETag, and the server sends no Last-Modified
    first = write_version(state.root, 1, RECORDS)
    options = SourceOptions(cache_dir=str(tmp_path / "cache"), cache_limit=200_000)
    loader = MixingLoader(
        ShardDataset(f"{base}/part-0000.tar", source_options=options), batch_size=8
    )

    def epoch() -> Counter:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Counter(
                (key, bytes(payload))
                for batch in loader
                for key, payload in zip(batch["__key__"], batch["bin"], strict=True)
            )

    assert epoch() == first
    second = write_version(state.root, 2, records_after)
    assert epoch() == second
    assert epoch() == second
