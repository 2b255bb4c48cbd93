"""An epoch's position is each stage's own state under its key, laid out by one piece of code."""

from shardmix import MixingLoader, ShardDataset
from shardmix.batching.epochplan import dropped_in, epoch_start, padding_in


def shape(value):
    """The keys and value types of a state, nested: its layout without its values."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    return type(value).__name__


def test_the_position_nests_each_stages_own_state(uneven_shards):
    loader = MixingLoader(ShardDataset(uneven_shards, seed=1), batch_size=8, shuffle_buffer=64)
    batches = iter(loader)
    for _ in range(5):
        next(batches)
    epoch = loader._cursor.current
    position = epoch.position()
    assert position["mixer"] == epoch.merge.state_dict()
    assert position["buffer"] == epoch.shuffle.state_dict()
    assert padding_in(position) == epoch.padding.state_dict()
    assert dropped_in(position) == {
        kind: epoch.merge.dropped[kind] for kind in dropped_in(position)
    }
    assert position == epoch.position()  # taking it changed nothing
    assert shape(position) == shape(epoch_start(0, len(position["mixer"]["lanes"])))
    loader.close()


def test_a_loader_before_its_first_batch_says_the_start_position(uneven_shards):
    loader = MixingLoader(ShardDataset(uneven_shards, seed=1), batch_size=8, shuffle_buffer=64)
    state = loader.state_dict()
    lanes = len(state["mixer"]["lanes"])
    assert {key: state[key] for key in epoch_start(0, lanes)} == epoch_start(0, lanes)
    loader.close()
