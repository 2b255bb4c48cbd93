import json

import pytest

from shardmix.batching.mixing import LaneMerge, resume_points, start_state
from shardmix.batching.rows import RowStore
from shardmix.errors import WorkerError
from shardmix.formats import DROPPED_KEY
from shardmix.reading.chunks import ChunkBuilder
from shardmix.reading.lanes import LanePosition, round_robin, round_robin_chunks
from shardmix.reading.mergekeys import LaneClocks
from shardmix.reading.transforms import FILTERED

URLS = [f"s{lane}" for lane in range(10)]


def lanes_of(sizes):
    """Lane ``l`` reads shard ``l`` (URL ``s{l}``) from record 0 on."""
    return {
        lane: [
            {"__key__": f"l{lane}-{i}", "__source__": f"s{lane}", "__index__": i}
            for i in range(size)
        ]
        for lane, size in enumerate(sizes)
    }


def arrivals(contents, num_workers, per_lane, clocks=None):
    """Chunks from several "workers", arriving interleaved worker by worker."""
    shard_index = {f"s{lane}": lane for lane in contents}
    per_worker = []
    for worker in range(num_workers):
        hosted = {lane: iter(contents[lane]) for lane in contents if lane % num_workers == worker}
        builder = ChunkBuilder(shard_index, clocks)
        per_worker.append(builder.build(chunk) for chunk in round_robin_chunks(hosted, per_lane))
    arrived = []
    while per_worker:
        for stream in list(per_worker):
            chunk = next(stream, None)
            if chunk is None:
                per_worker.remove(stream)
            else:
                arrived.append(chunk)
    return arrived


def merged_keys(merge, store, step=5):
    """Every sample the merge hands out, taken ``step`` at a time, by key."""
    keys = []
    while True:
        ids, _ = merge.peek(step)
        if not len(ids):
            merge.consume(0)
            return keys
        keys.extend(store.sample(row)["__key__"] for row in ids.tolist())
        merge.consume(len(ids))


@pytest.mark.parametrize("per_lane", [1, 3, 7])
@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_lanes_take_turns_whatever_the_workers_that_host_them(per_lane, num_workers):
    contents = lanes_of([5, 0, 9, 2, 7])
    expected = [s["__key__"] for s in round_robin([iter(samples) for samples in contents.values()])]
    store = RowStore(URLS)
    merge = LaneMerge(iter(arrivals(contents, num_workers, per_lane)), len(contents), store)
    assert merged_keys(merge, store) == expected
    assert expected[:5] == ["l0-0", "l2-0", "l3-0", "l4-0", "l0-1"]


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_lanes_with_clocks_are_read_in_proportion_to_their_sizes(num_workers):
    sizes = [4, 8, 2, 6]
    contents = lanes_of(sizes)
    pieces = [[(lane, 0, None)] for lane in range(len(sizes))]
    clocks = LaneClocks(pieces, [[float(size)] for size in sizes], "records")
    # The lowest (share read before the sample, lane) goes first.
    ranked = sorted(
        ((i + 0.5) / size, lane, f"l{lane}-{i}")
        for lane, size in enumerate(sizes)
        for i in range(size)
    )
    store = RowStore(URLS)
    chunks = arrivals(contents, num_workers, 2, clocks)
    merge = LaneMerge(iter(chunks), len(sizes), store, clocks=clocks)
    assert merged_keys(merge, store, step=3) == [key for _, _, key in ranked]


def test_tombstones_are_counted_and_move_their_lane_on():
    contents = lanes_of([4, 4])
    contents[1][1] = {**contents[1][1], DROPPED_KEY: FILTERED}
    contents[1][2] = {"__key__": "l1-2", "__source__": "s1", "__index__": 2, DROPPED_KEY: FILTERED}
    store = RowStore(URLS)
    pieces = [[(lane, 0, None)] for lane in range(2)]
    merge = LaneMerge(iter(arrivals(contents, 1, 2)), 2, store, lane_pieces=pieces)
    assert merged_keys(merge, store) == ["l0-0", "l1-0", "l0-1", "l1-3", "l0-2", "l0-3"]
    assert merge.dropped[FILTERED] == 2
    assert merge.lane_positions() == [LanePosition(0, 4, -1), LanePosition(0, 4, -1)]


def test_a_lane_resumes_its_turn_where_the_state_left_it():
    contents = lanes_of([3, 3, 3])
    full = [s["__key__"] for s in round_robin([iter(samples) for samples in contents.values()])]
    # After l0-0 and l1-0: lane 2's turn is next (cursor 2), each lane resumes after them.
    rest = {0: contents[0][1:], 1: contents[1][1:], 2: contents[2]}
    store = RowStore(URLS)
    merge = LaneMerge(iter(arrivals(rest, 2, 1)), 3, store)
    merge.load_state_dict({"live": [0, 1, 2], "cursor": 2, "lanes": [[0, 0, -1, -1, 0, -1, 0]] * 3})
    assert merged_keys(merge, store) == full[2:]


def test_workers_stopping_early_is_an_error():
    contents = lanes_of([1, 1])
    chunk = ChunkBuilder({"s0": 0, "s1": 1}, None).build(
        [(0, contents[0], False), (1, contents[1], True)]
    )
    store = RowStore(URLS)
    with pytest.raises(WorkerError, match=r"lanes \[0\]"):
        merged_keys(LaneMerge(iter([chunk]), 2, store), store)


def test_a_workers_turns_double_from_chunk_to_chunk_up_to_the_steady_turn():
    contents = lanes_of([20, 3, 12])
    lanes = {lane: iter(samples) for lane, samples in contents.items()}
    chunks = list(round_robin_chunks(lanes, 2, steady=5))
    turns = [
        [(lane, [s["__key__"] for s in samples], ended) for lane, samples, ended in chunk]
        for chunk in chunks
    ]
    # Turns of 2, 4, then 5 (not 8) from each lane; a lane that gives fewer than its turn has
    # ended (lane 2's last turn gives none).
    sizes = [[len(keys) for _, keys, _ in chunk] for chunk in turns]
    assert sizes == [[2, 2, 2], [4, 1, 4], [5, 5], [5, 1], [4]]
    ended = [[lane for lane, _, ended in chunk if ended] for chunk in turns]
    assert ended == [[], [1], [], [2], [0]]
    taken = [key for chunk in turns for _, keys, _ in chunk for key in keys]
    assert sorted(taken) == sorted(s["__key__"] for samples in contents.values() for s in samples)
    assert turns[2][0][1] == ["l0-6", "l0-7", "l0-8", "l0-9", "l0-10"]


def take_keys(merge, store, count):
    """The next ``count`` samples the merge hands out (fewer at the end), by key."""
    keys = []
    while len(keys) < count:
        ids, _ = merge.peek(count - len(keys))
        if not len(ids):
            break
        keys.extend(store.sample(row)["__key__"] for row in ids.tolist())
        merge.consume(len(ids))
    return keys


@pytest.mark.parametrize("stop", [0, 1, 4, 11, 23])
@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_merge_restored_from_its_state_hands_out_the_rest_in_the_same_order(stop, num_workers):
    """The state through JSON after any sample, each live lane read again from where it says,
    and the samples that follow are exactly those of the uninterrupted merge."""
    sizes = [5, 0, 9, 2, 7]
    contents = lanes_of(sizes)
    pieces = [[(lane, 0, None)] for lane in range(len(sizes))]
    store = RowStore(URLS)
    whole = LaneMerge(
        iter(arrivals(contents, num_workers, 3)), len(sizes), store, lane_pieces=pieces
    )
    expected = merged_keys(whole, store)
    store = RowStore(URLS)
    first = LaneMerge(
        iter(arrivals(contents, num_workers, 3)), len(sizes), store, lane_pieces=pieces
    )
    before = take_keys(first, store, stop)
    state = json.loads(json.dumps(first.state_dict()))
    assert state == first.state_dict()  # taking it changed nothing
    live, starts = resume_points(state)
    rest = {
        lane: contents[lane][starts[lane].record :] if lane in live else [] for lane in contents
    }
    store = RowStore(URLS)
    restored = LaneMerge(
        iter(arrivals(rest, num_workers, 3)), len(sizes), store, lane_pieces=pieces
    )
    restored.load_state_dict(state)
    assert before + merged_keys(restored, store) == expected


def test_a_fresh_merges_state_is_the_start_state_with_its_first_pieces_named():
    """Before the plan is made the start state names no piece; a merge names its first."""
    pieces = [[(lane, 0, None)] for lane in range(3)]
    fresh = LaneMerge(iter(()), 3, RowStore(URLS), lane_pieces=pieces).state_dict()
    start = start_state(3)
    assert start == {"live": [0, 1, 2], "cursor": 0, "lanes": [[0, 0, -1, -1, 0, -1, 0]] * 3}
    assert fresh == {**start, "lanes": [[0, 0, -1, lane, 0, -1, 0] for lane in range(3)]}
