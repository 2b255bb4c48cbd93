"""shardmix.accelerate in one process: prepare leaves a MixingLoader alone, prepare_loader
registers it, marks each epoch's last batch for gradient accumulation, and save_state /
load_state resume it exactly; an unregistered loader under an Accelerator warns."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest

from shardmix import ConfigError, MixingLoader, ShardDataset, UnregisteredLoaderWarning

from shards import expected_keys, write_shards

accelerate = pytest.importorskip("accelerate")

from shardmix.accelerate import AcceleratedLoader, prepare_loader  # noqa: E402

SIZES = [9, 14, 3, 11, 7, 12]

UNREGISTERED = (
    "this MixingLoader is not registered for checkpointing with the Accelerator in use: "
    "accelerator.save_state() leaves its position out and load_state() does not restore it, "
    "so a resumed run starts its epoch over (batches trained twice); use "
    "loader = shardmix.accelerate.prepare_loader(accelerator, loader), which registers it, or "
    "call accelerator.register_for_checkpointing(loader) before load_state()"
)


def make_loader(pattern: str) -> MixingLoader:
    return MixingLoader(
        ShardDataset(pattern, seed=7, num_lanes=4), batch_size=4, shuffle_buffer=16, seed=7
    )


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate keeps its state process-wide: each test starts and leaves it empty."""
    yield
    accelerate.state.AcceleratorState._reset_state(True)
    accelerate.state.GradientState._reset_state()


@pytest.fixture
def pattern(tmp_path):
    return write_shards(tmp_path / "shards", "tar", SIZES)


def test_prepare_hands_the_loader_back_and_prepare_loader_registers_it_once(pattern):
    accelerator = accelerate.Accelerator(cpu=True)
    loader = make_loader(pattern)
    assert accelerator.prepare(loader) is loader  # never re-sharded
    wrapped = prepare_loader(accelerator, loader)
    again = prepare_loader(accelerator, loader)
    assert isinstance(wrapped, AcceleratedLoader) and wrapped.loader is loader
    assert accelerator._custom_objects == [loader]  # registered once, however often prepared
    assert again.loader is loader and len(wrapped) == len(loader)
    with pytest.raises(ConfigError, match="prepare_loader takes a MixingLoader, got list"):
        prepare_loader(accelerator, [])


def test_the_last_batch_of_each_epoch_ends_the_dataloader_and_syncs(pattern):
    reference = make_loader(pattern)
    expected = [[k for b in reference for k in b["__key__"]] for _ in range(2)]
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=3)
    loader = make_loader(pattern)
    wrapped = prepare_loader(accelerator, loader)
    for epoch in range(2):
        ends, syncs, keys = [], [], []
        for batch in wrapped:
            with accelerator.accumulate():
                ends.append(accelerator.gradient_state.end_of_dataloader)
                syncs.append(accelerator.sync_gradients)
            assert batch["__index__"].device == accelerator.device
            keys.extend(batch["__key__"])
        steps = len(loader)
        assert keys == expected[epoch]
        assert ends == [False] * (steps - 1) + [True]
        # every third step syncs, and the last whatever its place (steps % 3 != 0 here)
        assert steps % 3 and syncs == [(i + 1) % 3 == 0 or i == steps - 1 for i in range(steps)]
        assert not accelerator.gradient_state.in_dataloader


def test_save_state_and_load_state_resume_mid_epoch_exactly(pattern, tmp_path):
    full = [k for b in make_loader(pattern) for k in b["__key__"]]
    accelerator = accelerate.Accelerator(cpu=True)
    wrapped = prepare_loader(accelerator, make_loader(pattern))
    trained = []
    for step, batch in enumerate(wrapped):
        trained.extend(batch["__key__"])
        if step == 4:
            accelerator.save_state(str(tmp_path / "checkpoint"))
            break
    wrapped.close()

    resumed_accelerator = accelerate.Accelerator(cpu=True)
    resumed = prepare_loader(resumed_accelerator, make_loader(pattern))
    resumed_accelerator.load_state(str(tmp_path / "checkpoint"))
    rest, ends = [], []
    for batch in resumed:
        rest.extend(batch["__key__"])
        ends.append(resumed_accelerator.gradient_state.end_of_dataloader)
    assert trained + rest == full and len(trained) == 20
    assert ends == [False] * (len(ends) - 1) + [True]  # counted from the restored position
    assert len(ends) == len(resumed) - 5


def test_an_unregistered_loader_under_an_accelerator_warns_once_naming_the_fix(pattern):
    accelerator = accelerate.Accelerator(cpu=True)
    loader = accelerator.prepare(make_loader(pattern))
    with pytest.warns(UnregisteredLoaderWarning) as caught:
        first = [k for batch in loader for k in batch["__key__"]]
    assert [str(w.message) for w in caught] == [UNREGISTERED]
    assert caught[0].filename == __file__  # points at the loop
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = [k for batch in loader for k in batch["__key__"]]  # once per loader
        registered = make_loader(pattern)
        accelerator.register_for_checkpointing(registered)
        assert [k for batch in registered for k in batch["__key__"]] == first
    assert sorted(second) == sorted(first) and len(first) == sum(SIZES)


def test_without_an_accelerator_in_reach_nothing_warns(pattern):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keys = [k for batch in make_loader(pattern) for k in batch["__key__"]]
    assert len(keys) == sum(SIZES)


def test_looking_for_an_accelerator_keeps_no_reference_to_the_callers_iterator(pattern):
    accelerator = accelerate.Accelerator(cpu=True)  # a local the look finds
    loader = make_loader(pattern)
    accelerator.register_for_checkpointing(loader)
    it = iter(loader)
    next(it)  # the look at this frame's locals happens here
    assert loader.state_dict()["batches"] == 1
    del it  # a caller that lets go of the iterator ends the epoch
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0)
    assert Counter(k for batch in loader for k in batch["__key__"]) == expected_keys(SIZES)


def test_the_look_leaves_a_modules_namespace_whole():
    namespace = {"__name__": "job", "accelerate": accelerate}
    exec(
        "from shardmix.state.trainers import peek_locals\nimport sys\n"
        "seen = peek_locals(sys._getframe())",
        namespace,
    )
    assert namespace["seen"]["accelerate"] is accelerate
    assert namespace["accelerate"] is accelerate and "seen" in namespace
