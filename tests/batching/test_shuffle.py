import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_shuffle import ShuffleBuffer, shuffled

from shardmix.batching.shuffle import Draws, eviction_order
from shardmix.batching.slotbuffer import SlotBuffer


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


def test_eviction_order_names_the_residents_the_next_pushes_and_pops_take():
    buffer: ShuffleBuffer[int] = ShuffleBuffer(50, seed=4, epoch=2)
    for item in range(120):  # full, then 70 draws made
        buffer.push(item)
    residents = list(buffer.items)
    count = buffer.draws.count
    pushed = eviction_order(buffer.draws, len(residents), 100, pushing=True)
    popped = eviction_order(buffer.draws, len(residents), 50, pushing=False)
    assert buffer.draws.count == count  # the buffer's draws were not used

    taken = [buffer.push(item) for item in range(1000, 1100)]
    assert [residents[position] for position in pushed] == [x for x in taken if x < 1000]
    assert len(set(pushed)) == len(pushed) < 100

    fresh: ShuffleBuffer[int] = ShuffleBuffer(50, seed=4, epoch=2)
    fresh.restore(residents)
    fresh.draws.count = count
    assert [residents[position] for position in popped] == list(fresh.drain())
    assert sorted(popped) == list(range(50))


def test_a_byte_budget_counts_the_sizes_it_is_given_back():
    def size_of(item: int) -> int:
        return item % 7 + 1

    buffer: ShuffleBuffer[int] = ShuffleBuffer(100, seed=0, epoch=0, max_bytes=40, size_of=size_of)
    out = [x for i in range(60) if (x := buffer.push(i)) is not None]
    assert buffer.sizes() == [size_of(item) for item in buffer.items]
    restored: ShuffleBuffer[int] = ShuffleBuffer(
        100, seed=0, epoch=0, max_bytes=40, size_of=size_of
    )
    restored.restore(list(buffer.items))
    restored.draws.count = buffer.draws.count
    for i in range(60, 200):
        assert buffer.push(i) == restored.push(i)
    assert list(buffer.drain()) == list(restored.drain()) and out
    assert ShuffleBuffer(3, seed=0, epoch=0).sizes() == []


@settings(max_examples=120, deadline=None)
@given(
    capacity=st.integers(0, 40),
    warmup=st.one_of(st.none(), st.integers(1, 45)),
    max_bytes=st.one_of(st.none(), st.integers(1, 400)),
    sizes=st.lists(st.integers(0, 60), min_size=0, max_size=300),
    steps=st.lists(st.integers(1, 50), min_size=1, max_size=20),
)
def test_a_slot_buffer_makes_the_choices_a_shuffle_buffer_makes(
    capacity, warmup, max_bytes, sizes, steps
):
    """Pushing in runs of any length, each asking for some evictions, then popping, gives
    exactly the ids one-at-a-time pushes and pops give, warming up or not."""
    sizes_of = dict(enumerate(sizes))
    one: ShuffleBuffer[int] = ShuffleBuffer(
        capacity,
        seed=3,
        epoch=1,
        max_bytes=max_bytes,
        size_of=sizes_of.__getitem__,
        warmup=warmup,
    )
    expected = [out for item in range(len(sizes)) if (out := one.push(item)) is not None]
    expected += list(one.drain())
    slots = SlotBuffer(capacity, seed=3, epoch=1, max_bytes=max_bytes, warmup=warmup)
    ids = np.arange(len(sizes), dtype=np.int64)
    weights = np.asarray(sizes, dtype=np.int64)
    got: list[int] = []
    done = 0
    for wanted in steps * 20:
        if done == len(sizes):
            break
        evicted, used = slots.push(ids[done:], weights[done:], wanted)
        assert len(evicted) <= wanted and used > 0
        got.extend(evicted.tolist())
        done += used
    if done < len(sizes):
        evicted, used = slots.push(ids[done:], weights[done:], len(sizes))
        got.extend(evicted.tolist())
        done += used
    assert done == len(sizes)
    assert slots.bytes == one_bytes(sizes, slots.slots)
    got.extend(slots.pop(len(slots) // 2).tolist())
    got.extend(slots.pop(len(slots) + 5).tolist())
    assert got == expected
    assert slots.draws.count == one.draws.count and len(slots) == 0 and slots.bytes == 0


@pytest.mark.parametrize(("held", "counts"), [(1, [1]), (7, [3, 4]), (300, [1, 64, 100, 135])])
def test_pops_in_runs_leave_the_slots_pops_one_at_a_time_leave(held, counts):
    """After each run of pops: the ids popped, the residents in slot order, their sizes and
    the bytes held are those of a ShuffleBuffer popping one at a time."""
    sizes = [(7 * item) % 23 + 1 for item in range(held)]
    one: ShuffleBuffer[int] = ShuffleBuffer(
        held, seed=5, epoch=2, max_bytes=1 << 40, size_of=sizes.__getitem__
    )
    slots = SlotBuffer(held, seed=5, epoch=2, max_bytes=1 << 40, warmup=None)
    for item in range(held):
        assert one.push(item) is None
    slots.push(np.arange(held, dtype=np.int64), np.asarray(sizes, dtype=np.int64), held)
    assert slots.slots.tolist() == one.items
    for count in counts:
        assert slots.pop(count).tolist() == [one.pop() for _ in range(count)]
        assert slots.slots.tolist() == one.items
        assert slots.sizes.tolist() == one.sizes() and slots.bytes == one.bytes
        assert slots.draws.count == one.draws.count
    assert len(slots) == 0


def one_bytes(sizes, slots):
    return sum(sizes[slot] for slot in slots.tolist())


def test_a_warming_buffer_emits_after_its_warm_up_and_holds_half_of_what_it_took_in():
    buffer: ShuffleBuffer[int] = ShuffleBuffer(300, seed=5, epoch=0, warmup=40)
    out, first, held = [], None, []
    for item in range(2000):
        evicted = buffer.push(item)
        if evicted is not None:
            out.append(evicted)
            first = item if first is None else first
            held.append((item + 1, len(buffer.items)))
    out += list(buffer.drain())
    assert Counter(out) == Counter(range(2000))
    assert first == 40  # the 41st push is the first to displace a resident
    # Every sample leaves a buffer that holds 40, or half of what it took in, or 300 (full).
    assert all(now == min(300, max(40, (taken - 1) // 2)) for taken, now in held)
    assert [taken for taken, now in held if now == 300][0] == 602  # full after 2 x 300


def test_the_warm_up_spreads_each_batch_over_what_was_read():
    """A sorted stream, read in batches of 16: from the first on, each batch is drawn from
    about everything taken in so far, not from its end."""
    out = list(shuffled(iter(range(10_000)), 2000, seed=2, epoch=0, warmup=64))
    assert sorted(out) == list(range(10_000))
    spreads = []
    for number in range(100):  # the first 1,600 samples out, taken in from the first 3,200
        batch = np.asarray(out[16 * number : 16 * (number + 1)])
        taken = 64 + 16 * (number + 1) if number < 4 else 32 * (number + 1)
        assert batch.max() < taken and batch.max() - batch.min() > taken / 2
        spreads.append(batch.std() / taken)
    # A uniform draw from all taken in would spread 0.29 (1 / sqrt(12)); a stream passed
    # straight through, or in order, under 0.01 after the first batches.
    assert min(spreads) > 0.1 and np.mean(spreads) > 0.2


@pytest.mark.parametrize("pushing", [True, False])
def test_eviction_order_follows_the_warm_up(pushing):
    """Restored mid-warm-up, the residents the next pushes take are the ones foreseen."""
    buffer: ShuffleBuffer[int] = ShuffleBuffer(500, seed=4, epoch=2, warmup=32)
    for item in range(151):  # 75 held, growing
        buffer.push(item)
    residents, count = list(buffer.items), buffer.draws.count
    assert len(residents) == 75
    order = eviction_order(buffer.draws, 75, 150, pushing=pushing, limit=buffer.limit)
    pushes = (buffer.push(item) for item in range(1000, 1300))
    taken = list(pushes if pushing else buffer.drain())
    assert buffer.draws.count > count
    expected = [x for x in taken if x is not None and x < 1000][: len(order)]
    assert [residents[position] for position in order] == expected
    assert len(order) > 30


def test_a_warm_up_below_one_sample_is_refused():
    with pytest.raises(ValueError, match="warm-up must be >= 1 sample, got 0"):
        ShuffleBuffer(10, seed=0, epoch=0, warmup=0)
    with pytest.raises(ValueError, match="warm-up must be >= 1 sample, got -3"):
        SlotBuffer(10, seed=0, epoch=0, max_bytes=None, warmup=-3)


@pytest.mark.parametrize("stop", [0, 5, 17, 60, 140])
@pytest.mark.parametrize("max_bytes", [None, 90])
def test_a_shuffle_buffer_restored_from_its_state_gives_the_rest_of_the_order(stop, max_bytes):
    """The state through JSON, at any push (warming up, full, at the end), and the samples
    that follow are exactly those the uninterrupted buffer gives."""

    def size_of(item: int) -> int:
        return item % 5 + 1

    def new() -> ShuffleBuffer[int]:
        return ShuffleBuffer(40, seed=2, epoch=3, max_bytes=max_bytes, size_of=size_of, warmup=8)

    whole = new()
    expected = [out for item in range(140) if (out := whole.push(item)) is not None]
    expected += list(whole.drain())
    first = new()
    before = [out for item in range(stop) if (out := first.push(item)) is not None]
    state = json.loads(json.dumps(first.state_dict()))
    assert state == first.state_dict()  # taking it changed nothing
    restored = new()
    restored.load_state_dict(state)
    assert restored.bytes == first.bytes
    after = [out for item in range(stop, 140) if (out := restored.push(item)) is not None]
    assert before + after + list(restored.drain()) == expected


@pytest.mark.parametrize("stop", [0, 3, 9, 25])
@pytest.mark.parametrize("max_bytes", [None, 150])
def test_a_slot_buffer_restored_from_its_state_gives_the_rest_of_the_order(stop, max_bytes):
    """As above for the array buffer: runs of pushes, the state taken between two runs, then
    the rest of the runs and the pops at the end, compared id by id."""
    ids = np.arange(300, dtype=np.int64)
    sizes = ids % 7 + 1

    def new() -> SlotBuffer:
        return SlotBuffer(50, seed=5, epoch=1, max_bytes=max_bytes, warmup=12)

    def run(buffer: SlotBuffer, steps: range, done: int) -> tuple[list[int], int]:
        out: list[int] = []
        for _ in steps:
            evicted, used = buffer.push(ids[done:], sizes[done:], 11)
            out.extend(evicted.tolist())
            done += used
        return out, done

    whole = new()
    expected, _ = run(whole, range(25), 0)
    expected += whole.pop(len(whole)).tolist()
    first = new()
    before, done = run(first, range(stop), 0)
    state = json.loads(json.dumps(first.state_dict()))
    assert state == first.state_dict()
    restored = new()
    restored.load_state_dict(state)
    assert (restored.bytes, len(restored)) == (first.bytes, len(first))
    after, _ = run(restored, range(stop, 25), done)
    assert before + after + restored.pop(len(restored)).tolist() == expected
