"""The loader draws nothing from the global random generators (torch's, numpy's, python's), so
a model with dropout resumed from a checkpoint ends with the uninterrupted run's weights, bit
for bit: the trainer's random stream is the same whether the loader was live or restored."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
import torch
from torch import nn

from shardmix import MixingLoader, ShardDataset
from shardmix.batching.collate import collate_samples

from shards import UNEVEN_SIZES, write_shards


def global_states() -> tuple[object, ...]:
    return (torch.get_rng_state(), np.random.get_state(), random.getstate())


def assert_same_states(before: tuple[object, ...]) -> None:
    after = global_states()
    assert torch.equal(before[0], after[0])  # type: ignore[arg-type]
    assert repr(before[1]) == repr(after[1])
    assert before[2] == after[2]


def features(samples):
    """Each sample's ``(shard, record)`` as two floats; the keys beside them."""
    batch = collate_samples(samples)
    rows = [[float(part) for part in text.decode().split(":")] for text in batch["txt"]]
    return torch.tensor(rows), list(batch["__key__"])


def make_loader(pattern, *, num_workers=2, persistent_workers=True):
    return MixingLoader(
        ShardDataset(pattern, seed=3, num_lanes=4),
        batch_size=8,
        num_workers=num_workers,
        shuffle_buffer=16,
        seed=3,
        persistent_workers=persistent_workers,
        collate_fn=features,
    )


@pytest.fixture
def pattern(tmp_path):
    return write_shards(tmp_path / "tar", "tar", UNEVEN_SIZES)


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, True), (2, True), (2, False)])
def test_reading_restoring_and_new_epochs_draw_nothing_from_the_global_generators(
    pattern, num_workers, persistent
):
    torch.manual_seed(5)
    loader = make_loader(pattern, num_workers=num_workers, persistent_workers=persistent)
    before = global_states()
    keys = [key for _ in range(2) for _, batch_keys in loader for key in batch_keys]
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    restored = make_loader(pattern, num_workers=num_workers, persistent_workers=persistent)
    restored.load_state_dict(state)
    iterator = iter(restored)
    next(iterator)
    restored.close()
    assert_same_states(before)
    assert len(keys) == 2 * sum(UNEVEN_SIZES)


def test_a_mixture_draws_nothing_from_the_global_generators(tmp_path):
    pattern = write_shards(tmp_path / "a", "tar", UNEVEN_SIZES)
    other = write_shards(tmp_path / "b", "tar", [5, 9, 4])
    torch.manual_seed(5)
    before = global_states()
    loader = MixingLoader(
        {"a": ShardDataset(pattern, seed=1), "b": ShardDataset(other, seed=2)},
        batch_size=4,
        num_workers=2,
        seed=1,
        collate_fn=features,
    )
    for _ in range(2):
        for _ in loader:
            pass
    loader.close()
    assert_same_states(before)


def new_model(init_seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(init_seed)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def train(model, optimizer, loader, epochs, *, stop_at=None, step=0):
    """Train until ``epochs`` are done; or up to step ``stop_at``, then the checkpoint taken
    inside the loop (the model, optimizer, loader and torch's random state)."""
    for _ in range(loader.epoch, epochs):
        for inputs, _ in loader:
            loss = model(inputs / 40).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == stop_at:
                return {
                    "model": copy.deepcopy(model.state_dict()),
                    "optimizer": copy.deepcopy(optimizer.state_dict()),
                    "loader": json.loads(json.dumps(loader.state_dict())),
                    "rng": torch.get_rng_state(),
                }
    return step


@pytest.mark.parametrize("checkpoint_step", [9, 37])  # mid-epoch 0; in epoch 1 (24 a epoch)
def test_a_model_with_dropout_resumed_ends_with_the_uninterrupted_runs_weights(
    pattern, checkpoint_step
):
    model, optimizer = new_model(0)
    loader = make_loader(pattern)
    total = train(model, optimizer, loader, 2)
    loader.close()
    assert total == 2 * 24
    expected = model.state_dict()

    model, optimizer = new_model(0)
    loader = make_loader(pattern)
    saved = train(model, optimizer, loader, 2, stop_at=checkpoint_step)
    loader.close()
    torch.manual_seed(99)  # what a new process would have

    model, optimizer = new_model(1)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["rng"])
    loader = make_loader(pattern)
    loader.load_state_dict(saved["loader"])
    assert train(model, optimizer, loader, 2, step=checkpoint_step) == total
    loader.close()
    found = model.state_dict()
    assert all(torch.equal(found[name], expected[name]) for name in expected)
