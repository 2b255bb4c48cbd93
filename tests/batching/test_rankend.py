"""The ranks' agreement on a filtered epoch's end, with ranks as threads and a fake exchange.

Each rank keeps ``kept[rank]`` samples and sees ``ahead`` samples past what it yielded; the
real exchange and real ranks are in tests/distributed/test_filter_ranks.py.
"""

import threading

import pytest

from shardmix.batching.rankend import RankEnd
from shardmix.plan.sharding import EvenRanks


def run_ranks(kept, even_ranks, batch_size, ahead):
    """``(samples, steps, exchanges)`` of each rank."""
    world_size = len(kept)
    barrier = threading.Barrier(world_size)
    posted = [None] * world_size
    results = [None] * world_size

    def rank(me):
        def exchange(values):
            posted[me] = values
            barrier.wait()
            gathered = list(posted)
            barrier.wait()
            return gathered

        def lookahead(count):
            certain = min(emitted + max(count, ahead), kept[me])
            return certain, certain == kept[me]

        end = RankEnd(exchange, EvenRanks(even_ranks))
        emitted = steps = 0
        while True:
            room = end.room(emitted, batch_size, lookahead)
            own = min(room, kept[me] - emitted) if emitted < kept[me] else 0
            assert even_ranks == "pad" or own == room  # drop never asks past a rank's end
            if not room:
                break
            emitted += room
            steps += 1
            if end.over(emitted):
                break
        results[me] = (emitted, steps, end.exchanges)

    threads = [threading.Thread(target=rank, args=(me,)) for me in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


@pytest.mark.parametrize(("even_ranks", "samples", "steps"), [("drop", 13, 2), ("pad", 50, 7)])
def test_every_rank_ends_at_the_smallest_or_largest_kept_count(even_ranks, samples, steps):
    results = run_ranks([50, 13, 37], even_ranks, batch_size=8, ahead=20)
    assert [result[:2] for result in results] == [(samples, steps)] * 3
    assert len({result[2] for result in results}) == 1  # every rank exchanged each time


@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_the_ranks_exchange_once_per_look_ahead_until_the_end_is_near(even_ranks):
    results = run_ranks([1000, 990], even_ranks, batch_size=10, ahead=100)
    samples = 990 if even_ranks == "drop" else 1000
    # An exchange each time the 100 samples looked ahead are used up: at 0, 100, ... 900,
    # then the end is fixed once a rank's lanes ended (at 900 the smaller rank sees 990).
    assert results == [(samples, samples // 10, 10)] * 2


def test_one_rank_agrees_with_itself():
    assert run_ranks([29], "drop", batch_size=8, ahead=5) == [
        (29, 4, 4)
    ]  # exchanges at 0, 8, 16 and 24
