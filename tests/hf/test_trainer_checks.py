"""shardmix.hf in one process: a plain torch module trained by ShardmixTrainer, the loader's
state in every checkpoint folder, and the combinations that cannot resume exactly refused by
name (a checkpoint without the loader's state, ignore_data_skip, a dataset beside the loader,
an epoch the state is not in)."""

from __future__ import annotations

import json

import pytest
import torch

from shardmix import ConfigError, MixingLoader, ShardDataset
from shardmix.batching.collate import collate_samples

from shards import write_shards

pytest.importorskip("transformers")

import accelerate  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

from shardmix.hf import LOADER_STATE_NAME, ShardmixTrainer, TrainerLoader  # noqa: E402

SIZES = [5, 7, 4]


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """The Trainer's Accelerator keeps its state process-wide: each test leaves it empty."""
    yield
    accelerate.state.AcceleratorState._reset_state(True)
    accelerate.state.GradientState._reset_state()


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def forward(self, x, labels):
        return {"loss": (self.layer(x) - labels).pow(2).mean()}


def collate(samples):
    batch = collate_samples(samples)
    x = batch["__index__"].float().unsqueeze(1)
    return {"x": x, "labels": x}


def make_loader(pattern: str) -> MixingLoader:
    return MixingLoader(ShardDataset(pattern, seed=1), batch_size=2, seed=1, collate_fn=collate)


def arguments(out, **changes) -> TrainingArguments:
    settings = dict(
        output_dir=str(out), max_steps=3, save_steps=2, per_device_train_batch_size=2,
        report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy="no",
    )  # fmt: skip
    return TrainingArguments(**{**settings, **changes})


def test_every_checkpoint_holds_the_loaders_state_and_a_resume_needs_it(tmp_path):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)
    loader = make_loader(pattern)
    ShardmixTrainer(model=Model(), args=arguments(tmp_path / "out"), train_loader=loader).train()
    for step in (2, 3):
        saved = json.loads(
            (tmp_path / "out" / f"checkpoint-{step}" / LOADER_STATE_NAME).read_text()
        )
        assert (saved["epoch"], saved["batches"]) == (0, step)
    missing = tmp_path / "out" / "checkpoint-2" / LOADER_STATE_NAME
    missing.unlink()
    again = ShardmixTrainer(
        model=Model(), args=arguments(tmp_path / "out"), train_loader=make_loader(pattern)
    )
    with pytest.raises(
        ConfigError, match=f"{missing} not found: the checkpoint holds no MixingLoader state"
    ):
        again.train(resume_from_checkpoint=str(missing.parent))


def test_what_cannot_resume_exactly_is_refused_by_name(tmp_path):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)
    loader = make_loader(pattern)
    with pytest.raises(
        ConfigError, match="ignore_data_skip=True\\) does not apply to a MixingLoader"
    ):
        ShardmixTrainer(
            model=Model(), args=arguments(tmp_path, ignore_data_skip=True), train_loader=loader
        )
    with pytest.raises(ConfigError, match="pass either train_loader= or train_dataset=, not both"):
        ShardmixTrainer(
            model=Model(),
            args=arguments(tmp_path),
            train_loader=loader,
            train_dataset=loader.dataset,
        )
    with pytest.raises(ConfigError, match="train_loader must be a MixingLoader, found list"):
        ShardmixTrainer(model=Model(), args=arguments(tmp_path), train_loader=[])
    view = TrainerLoader(loader)
    view.resume(loader.state_dict(), "here")
    with pytest.raises(
        ConfigError,
        match="the Trainer resumes epoch 1 but the loader state in its checkpoint is in epoch 0",
    ):
        view.set_epoch(1)
