"""Without a manifest, the batches depend on the shards, not on where they live: the same
shards from a local folder and over HTTP, with the same seed, give the same key sequence when
shards are read whole. (Cutting shards into pieces needs their record counts: a local shard is
counted, a remote one only has them from a manifest; docs/remote-shards.md says so.)"""

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.sources import SourceOptions

from shards import UNEVEN_SIZES, write_shards


def key_sequence(pattern: str, num_workers: int) -> list[str]:
    dataset = ShardDataset(pattern, seed=3, source_options=SourceOptions(), piece_records=None)
    loader = MixingLoader(dataset, batch_size=8, num_workers=num_workers, shuffle_buffer=16, seed=3)
    return [key for batch in loader for key in batch["__key__"]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_local_and_http_shards_give_the_same_batches(server, num_workers):
    base, state = server
    local = write_shards(state.root / "data", "tar", UNEVEN_SIZES)  # shards of uneven sizes
    remote = f"{base}/data/part-{{0000..{len(UNEVEN_SIZES) - 1:04d}}}.tar"
    assert not list((state.root / "data").glob("*.json"))  # no manifest: weighed by size
    assert key_sequence(remote, num_workers) == key_sequence(local, num_workers)
