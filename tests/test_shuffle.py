from collections import Counter

from shardmix.shuffle import Draws, ShuffleBuffer, shuffled


def test_shuffled_is_a_permutation_fixed_by_seed_and_epoch():
    items = list(range(1000))
    first = list(shuffled(iter(items), 100, seed=1, epoch=0))
    assert Counter(first) == Counter(items)
    assert first == list(shuffled(iter(items), 100, seed=1, epoch=0))
    assert first != list(shuffled(iter(items), 100, seed=1, epoch=1))
    assert first != list(shuffled(iter(items), 100, seed=2, epoch=0))
    assert first != items


def test_capacity_zero_passes_items_through():
    assert list(shuffled(iter(range(10)), 0, seed=0, epoch=0)) == list(range(10))


def test_short_stream_is_drained_in_random_order():
    out = list(shuffled(iter(range(50)), 1000, seed=0, epoch=0))
    assert sorted(out) == list(range(50))
    assert out != list(range(50))


def test_draws_depend_only_on_the_count():
    a = Draws(7, 3)
    values = [a.below(1000) for _ in range(10000)]
    b = Draws(7, 3)
    b.count = 9000
    assert [b.below(1000) for _ in range(1000)] == values[9000:]


def test_buffer_spreads_early_items_late():
    buffer: ShuffleBuffer[int] = ShuffleBuffer(10, seed=0, epoch=0)
    out = [x for i in range(100) if (x := buffer.push(i)) is not None]
    out += list(buffer.drain())
    assert Counter(out) == Counter(range(100))
    # The first ten items are not all emitted first.
    assert set(out[:10]) != set(range(10))
