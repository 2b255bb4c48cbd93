import pytest

from shardmix.errors import WorkerError
from shardmix.mixing import LaneMixer
from shardmix.reader import round_robin, round_robin_chunks


def lanes_of(sizes):
    return {lane: [f"l{lane}-{i}" for i in range(size)] for lane, size in enumerate(sizes)}


@pytest.mark.parametrize("per_lane", [1, 3, 7])
@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_mixed_order_does_not_depend_on_how_lanes_are_hosted(per_lane, num_workers):
    contents = lanes_of([5, 0, 9, 2, 7])
    expected = list(round_robin([iter(samples) for samples in contents.values()]))
    # Chunks from several "workers", arriving interleaved worker by worker.
    per_worker = [
        round_robin_chunks(
            {lane: iter(contents[lane]) for lane in contents if lane % num_workers == w}, per_lane
        )
        for w in range(num_workers)
    ]
    arrivals = []
    while per_worker:
        for stream in list(per_worker):
            chunk = next(stream, None)
            if chunk is None:
                per_worker.remove(stream)
            else:
                arrivals.append(chunk)
    assert list(LaneMixer(iter(arrivals), len(contents))) == expected
    assert expected[:5] == ["l0-0", "l2-0", "l3-0", "l4-0", "l0-1"]


def test_workers_stopping_early_is_an_error():
    chunks = iter([[(0, ["a"], False), (1, ["b"], True)]])
    with pytest.raises(WorkerError, match=r"lanes \[0\]"):
        list(LaneMixer(chunks, 2))
