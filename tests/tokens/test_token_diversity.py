"""Rows mix documents from many shards, as sample batches do: the documents of a batch come from
about as many distinct shards as a uniformly random draw of as many documents would."""

from __future__ import annotations

from collections import Counter

from token_shards import write_token_shards

from shardmix import ShardDataset
from shardmix.inspect import ideal_distinct_sources
from shardmix.tokens import TokenLoader


def test_a_batchs_documents_come_from_as_many_shards_as_a_random_draw(tmp_path):
    pattern, documents = write_token_shards(tmp_path, 24, 120, mean_log=4.5, seed=3)
    loader = TokenLoader(
        ShardDataset(pattern, seed=1), seq_len=256, batch_size=8, seed=1, num_workers=2
    )
    batches = list(loader)[:-1]  # the last batch is the epoch's rest
    per_shard = list(Counter(source for source, _ in documents).values())
    got = expected = 0.0
    for batch in batches:
        held = {(source, key) for row in batch["__segments__"] for source, key, *_ in row}
        got += len({source for source, _ in held})
        expected += ideal_distinct_sources(per_shard, len(held))
    assert len(batches) > 50
    assert got / expected >= 0.9, (got / len(batches), expected / len(batches))
