"""What a worker sends first: a small chunk, then turns that double up to the steady size."""

from shardmix import ShardDataset
from shardmix.workers.dataloader import (
    CHUNK_SAMPLES,
    FIRST_CHUNK_SAMPLES,
    WorkerOptions,
    start_workers,
)

from shards import write_shards


def test_a_workers_first_chunk_is_small_and_its_turns_double_to_the_steady_turn(tmp_path):
    pattern = write_shards(tmp_path, "tfrecord", [300] * 8, payload_bytes=16)
    dataset = ShardDataset(pattern, seed=0, num_lanes=8)
    plan = dataset.plan.lane_pieces(0, rank=0, world_size=1, num_lanes=8)
    chunks, num_lanes, _ = start_workers(
        dataset,
        epoch=0,
        rank=0,
        world_size=1,
        starts=None,
        lane_pieces=plan,
        clocks=None,
        options=WorkerOptions(num_workers=0),
    )
    sent = [len(chunk) for chunk in chunks]
    assert (num_lanes, FIRST_CHUNK_SAMPLES, CHUNK_SAMPLES) == (8, 256, 2048)
    # Eight lanes in this process: turns of 32 (256 / 8), 64, 128, then up to 256 (2,048 / 8),
    # of which 76 are left in each lane.
    assert sent == [256, 512, 1024, 8 * 76]
