"""A TokenLoader state taken at any batch, a window's last among them, resumes to the rows an
uninterrupted run yields, every token once."""

from __future__ import annotations

from test_token_loader import rows_of
from token_shards import assert_tiles, write_token_shards

from shardmix import ShardDataset
from shardmix.tokens import TokenLoader


def test_a_resume_from_any_batch_yields_the_rest_of_the_rows(tmp_path):
    pattern, documents = write_token_shards(tmp_path, 12, 150, mean_log=3.0)

    def loader() -> TokenLoader:
        dataset = ShardDataset(pattern, seed=2)
        return TokenLoader(dataset, seq_len=256, batch_size=1, window=300, num_workers=0)

    first = loader()
    whole, states = [], []
    for batch in first:
        whole.append(batch)
        states.append(first.state_dict())
    assert_tiles(whole, documents)
    pending = [state["tokens"]["sources"][""]["pending"]["rows"] for state in states[:-1]]
    ends = [at for at, rows in enumerate(pending) if not rows]
    assert len(ends) >= 3  # the windows' ends
    for at in sorted({*ends, *range(0, len(whole) - 1, 9)}):  # the last state: the next epoch
        resumed = loader()
        resumed.load_state_dict(states[at])
        assert rows_of(whole[: at + 1] + list(resumed)) == rows_of(whole), at
