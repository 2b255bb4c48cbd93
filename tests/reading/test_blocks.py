"""Record blocks: lanes read in blocks make exactly the chunks and batches that lanes read
sample by sample make, on shards whose records share their fields and on shards whose do not.
"""

from pathlib import Path

import numpy as np
import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.formats.tar_writer import TarWriter
from shardmix.reading.chunks import Chunk, ChunkBuilder
from shardmix.reading.lanes import BlockTurns, LanePosition, round_robin_chunks
from shardmix.reading.mergekeys import LaneClocks

from shards import UNEVEN_SIZES, write_shards


def identity(sample):  # module level: it travels to the workers
    return sample


def as_list(samples):  # a collate that keeps each sample whole, fields as they differ
    return samples


def write_mixed_fields(directory: Path) -> list[str]:
    """Two tar shards whose records do not all have the same fields: an optional one, fields
    in another order, a record with a field only it has."""
    urls = []
    for shard in range(2):
        path = directory / f"mixed-{shard}.tar"
        with TarWriter(path) as writer:
            for record in range(150):
                sample = {"__key__": f"m{shard}-{record:04d}", "txt": b"%d" % record}
                if record % 7 == 0:
                    sample["seg"] = bytes([record % 251]) * (record % 5)
                if shard == 1 and record % 11 == 0:
                    sample = {"__key__": sample["__key__"], "cls": b"1", **sample}
                writer.write(sample)
        urls.append(str(path))
    return urls


@pytest.fixture
def tar_urls(tmp_path):
    pattern = write_shards(tmp_path / "even", "tar", UNEVEN_SIZES)
    return ShardDataset(pattern).urls + write_mixed_fields(tmp_path)


def assert_same_chunk(ours: Chunk, theirs: Chunk) -> None:
    np.testing.assert_array_equal(ours.items, theirs.items)
    assert (ours.ended, ours.derived, list(ours.columns)) == (
        theirs.ended,
        theirs.derived,
        list(theirs.columns),
    )
    for name, column in ours.columns.items():
        other = theirs.columns[name]
        assert (column.kind, column.dtype, column.missing) == (
            other.kind,
            other.dtype,
            other.missing,
        ), name
        if isinstance(column.values, np.ndarray):
            assert column.values.dtype == other.values.dtype, name
            np.testing.assert_array_equal(column.values, other.values)
        else:
            assert column.values == other.values, name


@pytest.mark.parametrize("per_lane, max_bytes", [(1, None), (3, 2048), (64, None), (64, 700)])
def test_block_lanes_make_the_chunks_sample_lanes_make(tar_urls, per_lane, max_bytes):
    dataset = ShardDataset(tar_urls, seed=3)
    assert dataset.reads.reads_blocks
    plan = dataset.plan.lane_pieces(0, num_lanes=5)
    pieces = [[(piece.shard, piece.start, piece.stop) for piece in lane] for lane in plan]
    weights = [dataset.plan.piece_weights(lane, 1) for lane in plan]
    assert all(weights)
    clocks = LaneClocks(pieces, [weight[1] for weight in weights if weight], weights[0][0])
    shares = dict(enumerate(clocks.shares()))
    # Resumed lanes too: from record 5 of a first piece, walked to or entered at its offset.
    first = plan[2][0]
    sixth = next(
        iter(ShardDataset([tar_urls[first.shard]]).reads.read_shard(tar_urls[first.shard], 5))
    )
    starts = [LanePosition()] * 5
    starts[2] = LanePosition(0, first.start + 5, -1)
    starts[3] = LanePosition(0, plan[3][0].start + 1, 0)  # record 0 starts at byte 0
    assert sixth["__index__"] == 5

    def chunks(blocks: bool) -> list[Chunk]:
        builder = ChunkBuilder(dataset.reads.shard_index, clocks)
        if blocks:
            lanes = {
                lane: BlockTurns(dataset.reads.read_lane_blocks(plan[lane], starts[lane]))
                for lane in range(5)
            }
        else:
            lanes = {
                lane: dataset.reads.read_lane_pieces(plan[lane], 0, starts[lane])
                for lane in range(5)
            }
        sizes = lambda: builder.mean_size  # noqa: E731
        made = round_robin_chunks(lanes, per_lane, max_bytes, shares, sizes, steady=per_lane * 4)
        return [builder.build(group) for group in made]

    ours, theirs = chunks(blocks=True), chunks(blocks=False)
    assert len(ours) == len(theirs) > 1
    for one, other in zip(ours, theirs, strict=True):
        assert_same_chunk(one, other)
    # Every record of the plan came once, the resumed lanes from where they resumed on.
    assert sum(len(chunk) for chunk in ours) == sum(dataset.plan.shard_counts()) - 5 - 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_read_in_blocks_equal_batches_read_as_samples(tar_urls, num_workers):
    """No transform (blocks) and a transform that changes nothing (samples): the same batches,
    fields and provenance included, over two epochs."""

    def contents(dataset: ShardDataset) -> list[list[list[tuple]]]:
        loader = MixingLoader(
            dataset, batch_size=16, num_workers=num_workers, seed=5, collate_fn=as_list
        )
        found = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            found.extend([sorted(sample.items()) for sample in batch] for batch in loader)
        loader.close()
        return found

    in_blocks = ShardDataset(tar_urls, seed=5)
    as_samples = ShardDataset(tar_urls, seed=5, transform=identity)
    assert in_blocks.reads.reads_blocks and not as_samples.reads.reads_blocks
    ours, theirs = contents(in_blocks), contents(as_samples)
    assert ours == theirs
    fields = {name for batch in ours for sample in batch for name, _ in sample}
    assert {"seg", "cls", "bin", "__offset__"} <= fields


def test_datasets_that_need_samples_do_not_read_blocks(tmp_path, tar_urls):
    tfrecords = ShardDataset(write_shards(tmp_path / "tf", "tfrecord", [3, 4]))
    assert not tfrecords.reads.reads_blocks
    assert not ShardDataset(tar_urls, decode=True).reads.reads_blocks
    assert not ShardDataset([*tar_urls, *tfrecords.urls]).reads.reads_blocks
