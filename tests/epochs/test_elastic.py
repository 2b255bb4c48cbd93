"""Elastic resume: a state saved by W ranks resumes on W' ranks, or with another batch size.

The remainder of the epoch (undelivered records and buffer residents) is dealt to the new
ranks; the union of an epoch's samples over its phases is every record exactly once, but for
the fewer than W' samples ``drop`` leaves out or ``pad`` repeats at the epoch's end.
"""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmix import ConfigError, MixingLoader, ShardDataset, join_states
from shardmix.epochs.elastic import Block, deal_shares, remaining_pieces
from shardmix.plan.sharding import Piece, cut_pieces, default_num_lanes, default_shuffle_buffer
from shardmix.state.codec import pack_refs, unpack_refs

from shards import expected_keys, write_shards

NUM_SHARDS = 1024


def uneven_sizes() -> list[int]:
    """1,024 shard sizes from 0 to 12 whose total 3, 12 and 16 do not divide."""
    sizes = [int(size) for size in np.random.default_rng(5).integers(0, 13, NUM_SHARDS)]
    while sum(sizes) % 3 == 0 or sum(sizes) % 16 == 0:
        sizes[0] += 1
    return sizes


SIZES = uneven_sizes()


@pytest.fixture(scope="module")
def pattern(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("elastic"), "tar", SIZES)


def make_loaders(pattern, world_size, *, batch_size=4, even_ranks="drop", **options):
    options.setdefault("shuffle_buffer", 64)
    return [
        MixingLoader(
            ShardDataset(pattern, record_counts=SIZES, seed=3, **options.pop("dataset", {})),
            batch_size=batch_size,
            seed=9,
            even_ranks=even_ranks,
            rank=rank,
            world_size=world_size,
            **options,
        )
        for rank in range(world_size)
    ]


def run_phase(loaders, state=None, steps=None):
    """Each rank's batches (keys) from ``state`` on: ``steps`` of them in lockstep, or to the
    epoch's end; then the ranks' states joined (``steps``) or None."""
    if state is not None:
        for loader in loaders:
            loader.load_state_dict(state)
    iterators = [iter(loader) for loader in loaders]
    batches: list[list[list[str]]] = [[] for _ in loaders]
    if steps is None:
        for rank, iterator in enumerate(iterators):
            batches[rank] = [list(batch["__key__"]) for batch in iterator]
        joined = None
    else:
        for _ in range(steps):
            for rank, iterator in enumerate(iterators):
                batches[rank].append(list(next(iterator)["__key__"]))
        joined = join_states([loader.state_dict() for loader in loaders])
    for loader in loaders:
        loader.close()
    return batches, joined


def keys_of(*phases) -> Counter[str]:
    return Counter(key for phase in phases for rank in phase for batch in rank for key in batch)


def phase_totals(loaders, state):
    """``(quota, [own total of each rank])`` of the resized phase ``state`` starts."""
    for loader in loaders:
        loader.load_state_dict(state)
    phases = [loader.state_dict()["phase"] for loader in loaders]
    return phases[0]["quota"], [phase["own"] for phase in phases]


SECOND = {1: 3, 3: 16, 6: 1, 12: 6, 16: 12}


@pytest.mark.parametrize("new_world", [1, 3, 6, 12, 16])
@pytest.mark.parametrize("at", [0.1, 0.5, 0.9])
def test_a_resize_from_8_ranks_and_again_reads_every_record_once(pattern, at, new_world):
    old = make_loaders(pattern, 8)
    length = len(old[0])
    first_steps = int(at * length)
    first, saved = run_phase(old, steps=first_steps)
    assert saved["config"]["world_size"] == 8 and len(saved["ranks"]) == 7

    resized = make_loaders(pattern, new_world)
    for loader in resized:
        loader.load_state_dict(saved)
    lengths = {len(loader) for loader in resized}
    second_steps = (lengths.pop() - first_steps) // 2
    assert not lengths  # the same len() on every rank
    second, again = run_phase(resized, steps=second_steps)
    assert {len(rank) for rank in second} == {second_steps}
    # The same resume, run twice, gives the same batches.
    assert run_phase(make_loaders(pattern, new_world), saved, second_steps)[0] == second

    last_world = SECOND[new_world]
    quota, own = phase_totals(make_loaders(pattern, last_world), again)
    assert max(own) - min(own) <= 1
    final = make_loaders(pattern, last_world)
    for loader in final:
        loader.load_state_dict(again)
    length = len(final[0])
    third, _ = run_phase(final)
    steps = {len(rank) for rank in third}
    assert len(steps) == 1  # equal steps per rank
    assert steps.pop() + first_steps + second_steps == length

    seen = keys_of(first, second, third)
    expected = expected_keys(SIZES)
    left_out = expected - seen
    assert seen - expected == Counter()  # nothing repeated, nothing foreign
    assert sum(left_out.values()) == sum(own) - last_world * quota < last_world


def test_a_resize_checks_the_tags_of_the_residents_it_deals(pattern):
    _, saved = run_phase(make_loaders(pattern, 4), steps=len(make_loaders(pattern, 4)[0]) // 2)
    positions = [saved, *saved["ranks"].values()]
    for position in positions:  # every index one up: each reference names the next record
        refs = unpack_refs(position["buffer"]["items"])
        position["buffer"]["items"] = pack_refs([(s, r + 1, o) for s, r, o in refs])
    # Refused as a resident named twice or one a lane will read, else by its record's tag.
    refused = "shuffle buffer holds record .* but the record read|'buffer.items' should hold"
    with pytest.raises(ConfigError, match=refused):
        run_phase(make_loaders(pattern, 2), saved, steps=1)


@pytest.mark.parametrize("new_world", [3, 16])
def test_pad_repeats_fewer_than_the_new_world_size(pattern, new_world):
    old = make_loaders(pattern, 8, even_ranks="pad")
    first, saved = run_phase(old, steps=len(old[0]) // 3)
    quota, own = phase_totals(make_loaders(pattern, new_world, even_ranks="pad"), saved)
    second, _ = run_phase(make_loaders(pattern, new_world, even_ranks="pad"), saved)
    assert len({len(rank) for rank in second}) == 1
    seen = keys_of(first, second)
    expected = expected_keys(SIZES)
    assert expected - seen == Counter()
    repeated = seen - expected
    assert sum(repeated.values()) == new_world * quota - sum(own) < new_world


@pytest.mark.parametrize(("old_world", "new_world"), [(8, 3), (3, 8), (2, 3)])
def test_none_reads_every_record_once_after_a_resize(pattern, old_world, new_world):
    old = make_loaders(pattern, old_world, even_ranks="none")
    first, saved = run_phase(old, steps=min(len(loader) for loader in old) // 3)
    second, _ = run_phase(make_loaders(pattern, new_world, even_ranks="none"), saved)
    assert keys_of(first, second) == expected_keys(SIZES)


def test_the_residents_alone_are_dealt_when_the_buffer_holds_the_rest(pattern):
    # The default buffer (8,192 samples) outgrows a rank's share (about 770 samples): it keeps
    # half of what it read, so once a rank's lanes ended (by step 100) what remains is residents.
    old = make_loaders(pattern, 8, shuffle_buffer=None)
    first, saved = run_phase(old, steps=120)
    resized = make_loaders(pattern, 3, shuffle_buffer=None)
    resized[0].load_state_dict(saved)
    # No lane is left to read: the restore knows the residents leave by pops, in that order.
    assert resized[0].state_dict()["mixer"]["live"] == []
    second, _ = run_phase(make_loaders(pattern, 3, shuffle_buffer=None), saved)
    assert len({len(rank) for rank in second}) == 1
    seen = keys_of(first, second)
    assert seen - expected_keys(SIZES) == Counter()
    assert sum((expected_keys(SIZES) - seen).values()) < 3


def test_the_next_epoch_is_planned_for_the_new_world(pattern):
    old = make_loaders(pattern, 8)
    _, saved = run_phase(old, steps=10)
    resized = make_loaders(pattern, 3)
    run_phase(resized, saved)
    planned = make_loaders(pattern, 3)
    for loader in planned:
        loader.set_epoch(1)
    for loader in resized:
        loader.set_epoch(1)
    assert run_phase(resized)[0] == run_phase(planned)[0]


def test_lanes_and_the_default_buffer_follow_the_new_world_and_batch_size(pattern):
    _, saved = run_phase(make_loaders(pattern, 8, shuffle_buffer=None), steps=3)
    resized = make_loaders(pattern, 3, batch_size=200, shuffle_buffer=None)
    resized[1].load_state_dict(saved)
    config = resized[1].state_dict()["config"]
    lanes = default_num_lanes(batch_size=200, shards_per_rank=NUM_SHARDS // 3)
    assert (config["num_lanes"], config["shuffle_buffer"]) == (lanes, default_shuffle_buffer(200))
    assert config["world_size"] == 3 and saved["config"]["num_lanes"] == 12
    assert len(resized[1].state_dict()["mixer"]["lanes"]) == lanes


def test_a_changed_batch_size_reads_every_record_once(pattern):
    old = make_loaders(pattern, 2, batch_size=6)
    first, saved = run_phase(old, steps=len(old[0]) // 2)
    resized = make_loaders(pattern, 2, batch_size=10)
    quota, own = phase_totals(make_loaders(pattern, 2, batch_size=10), saved)
    second, _ = run_phase(resized, saved)
    assert {len(batch) for rank in second for batch in rank[:-1]} == {10}
    assert len({len(rank) for rank in second}) == 1
    seen = keys_of(first, second)
    assert seen - expected_keys(SIZES) == Counter()
    assert sum((expected_keys(SIZES) - seen).values()) == sum(own) - 2 * quota < 2


def test_a_changed_batch_size_on_one_rank_gives_the_rest_of_the_epoch(tmp_path):
    sizes = [40, 3, 17]
    pattern = write_shards(tmp_path, "tar", sizes)
    loader = MixingLoader(ShardDataset(pattern), batch_size=8, shuffle_buffer=16)
    batches = iter(loader)
    first = [list(next(batches)["__key__"]) for _ in range(2)]
    state = loader.state_dict()
    loader.close()
    other = MixingLoader(ShardDataset(pattern), batch_size=5, shuffle_buffer=16)
    other.load_state_dict(state)
    assert len(other) == 2 + 9  # the 44 samples left, in batches of 5
    rest = [list(batch["__key__"]) for batch in other]
    assert len(rest) == 9
    assert Counter(key for batch in first + rest for key in batch) == expected_keys(sizes)


def test_a_resize_with_workers_reads_every_record_once(pattern):
    old = make_loaders(pattern, 4, num_workers=2)
    first, saved = run_phase(old, steps=len(old[0]) // 2)
    second, _ = run_phase(make_loaders(pattern, 3, num_workers=1), saved)
    seen = keys_of(first, second)
    assert seen - expected_keys(SIZES) == Counter()
    assert sum((expected_keys(SIZES) - seen).values()) < 3


def test_a_state_without_every_rank_is_refused_naming_join_states(pattern):
    old = make_loaders(pattern, 2)
    next(iter(old[0]))
    state = old[0].state_dict()
    old[0].close()
    with pytest.raises(ConfigError, match=r"holds the positions of ranks \[0\] only.*join_states"):
        make_loaders(pattern, 3)[0].load_state_dict(state)


@pytest.mark.parametrize(
    ("field", "saved", "now"),
    [
        ("num_lanes", {"dataset": {"num_lanes": 8}}, {"dataset": {"num_lanes": 16}}),
        ("shuffle_buffer", {"shuffle_buffer": 64}, {"shuffle_buffer": 32}),
        ("dataset_seed", {"dataset": {"seed": 3}}, {"dataset": {"seed": 4}}),
    ],
)
def test_a_changed_setting_the_user_gave_is_still_refused_by_name(pattern, field, saved, now):
    def loaders(world_size, options):
        options = {
            key: dict(value) if isinstance(value, dict) else value for key, value in options.items()
        }
        dataset = options.pop("dataset", {})
        return [
            MixingLoader(
                ShardDataset(pattern, record_counts=SIZES, **({"seed": 3} | dataset)),
                batch_size=4,
                rank=rank,
                world_size=world_size,
                **options,
            )
            for rank in range(world_size)
        ]

    _, state = run_phase(loaders(2, saved), steps=2)
    with pytest.raises(ConfigError, match=rf"checkpoint's {field} is"):
        loaders(3, now)[0].load_state_dict(state)


def tag(sample):
    """A transform that keeps every sample (a decoder or an augmentation would)."""
    return {**sample, "tagged": 1}


def drop_some(sample):
    return None if sample["__index__"] % 7 == 3 else sample


def test_a_resize_under_a_transform_that_keeps_every_sample_reads_every_record_once(pattern):
    head, state = run_phase(make_loaders(pattern, 2, dataset={"transform": tag}), steps=5)
    first, again = run_phase(make_loaders(pattern, 3, dataset={"transform": tag}), state, steps=4)
    rest, _ = run_phase(make_loaders(pattern, 5, dataset={"transform": tag}), again)
    written = expected_keys(SIZES)
    seen = keys_of(head, first, rest)
    assert max(seen.values()) == 1 and set(seen) <= set(written)
    assert sum(written.values()) - sum(seen.values()) < 5  # drop: fewer than W' left out
    assert len({len(rank) for rank in rest}) == 1  # equal steps


def test_a_sample_dropped_in_a_resized_phase_is_refused_by_name(pattern):
    _, state = run_phase(make_loaders(pattern, 2, dataset={"transform": drop_some}), steps=1)
    loaders = make_loaders(pattern, 3, dataset={"transform": drop_some})
    with pytest.raises(ConfigError, match=r"the transform dropped a sample on rank 0 in the rest"):
        run_phase(loaders, state)


def test_a_mixture_resized_is_refused_by_name(tmp_path):
    patterns = {name: write_shards(tmp_path / name, "tar", [30, 11]) for name in "ab"}

    def mixture(rank, world_size):
        members = {name: ShardDataset(pattern) for name, pattern in patterns.items()}
        return MixingLoader(members, batch_size=4, rank=rank, world_size=world_size)

    loaders = [mixture(rank, 2) for rank in range(2)]
    _, state = run_phase(loaders, steps=1)
    with pytest.raises(ConfigError, match=r"cannot resume a mixture on 3 ranks"):
        mixture(0, 3).load_state_dict(state)


# Lanes of pieces of shards with up to 9 records, and a position in each lane.
lanes_and_positions = st.lists(
    st.lists(st.tuples(st.integers(0, 7), st.integers(0, 9)), max_size=4), min_size=1, max_size=5
).flatmap(
    lambda lanes: st.tuples(
        st.just(lanes),
        st.tuples(*[st.tuples(st.integers(0, len(lane)), st.integers(0, 9)) for lane in lanes]),
    )
)


def _as_pieces(lanes, counts):
    """Each lane's ``(shard, start)`` as a piece of that shard from ``start`` to its end."""
    return [
        [Piece(shard, min(start, counts[shard]), None) for shard, start in lane] for lane in lanes
    ]


@settings(max_examples=200, deadline=None)
@given(lanes_and_positions, st.lists(st.integers(0, 9), min_size=8, max_size=8))
def test_delivered_and_remaining_records_are_every_record_once(drawn, counts):
    lanes, positions = drawn
    lanes = _as_pieces(lanes, counts)
    delivered, planned = Counter(), Counter()
    starts = []
    for lane, (slot, record) in zip(lanes, positions, strict=True):
        for index, piece in enumerate(lane):
            records = range(piece.start, counts[piece.shard])
            planned.update((piece.shard, r) for r in records)
            if index < slot:
                delivered.update((piece.shard, r) for r in records)
            elif index == slot:
                delivered.update((piece.shard, r) for r in records if r < record)
        starts.append((slot, record))
    left = remaining_pieces(lanes, starts, counts)
    remaining = Counter(
        (piece.shard, r)
        for piece in left
        for r in range(piece.start, piece.start + piece.size(counts))
    )
    assert delivered + remaining == planned


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9)), max_size=6),
            st.integers(0, 20),
        ),
        min_size=1,
        max_size=4,
    ),
    st.integers(1, 17),
)
def test_shares_hold_the_remainder_once_in_totals_within_one(drawn, world_size):
    counts = [9] * 6
    blocks = [
        Block(
            [(6, at * 100 + record, -1) for record in range(residents)],
            [1] * residents,
            [Piece(shard, start, None) for shard, start in pieces],
            [1 + record for record in range(residents)],
        )
        for at, (pieces, residents) in enumerate(drawn)
    ]
    shares = deal_shares(blocks, counts, world_size)
    totals = [share.total(counts) for share in shares]
    assert max(totals) - min(totals) <= 1
    dealt = Counter(
        (piece.shard, r)
        for share in shares
        for piece in share.pieces
        for r in range(piece.start, piece.start + piece.size(counts))
    )
    whole = Counter(
        (piece.shard, r)
        for block in blocks
        for piece in block.pieces
        for r in range(piece.start, 9)
    )
    assert dealt == whole
    # The residents, in order, each once.
    assert [ref for share in shares for ref in share.residents] == [
        ref for block in blocks for ref in block.residents
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9)), max_size=12), st.data())
def test_cut_pieces_gives_each_run_its_share(drawn, data):
    counts = [9] * 6
    pieces = [Piece(shard, start, None) for shard, start in drawn]
    total = sum(piece.size(counts) for piece in pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, total), min_size=0, max_size=5)))
    shares = [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
    runs = cut_pieces(pieces, counts, shares)
    assert [sum(piece.size(counts) for piece in run) for run in runs] == shares

    def records(sequence):
        return [(p.shard, r) for p in sequence for r in range(p.start, p.start + p.size(counts))]

    assert [record for run in runs for record in records(run)] == records(pieces)
