"""The Hugging Face Trainer over a MixingLoader, resuming exactly from its checkpoints.

:class:`ShardmixTrainerMixin` hands the Trainer the MixingLoader itself, writes its state as
``shardmix_loader.json`` in every checkpoint folder (before ``trainer_state.json``), loads it on
every rank at resume and turns the Trainer's ``skip_first_batches`` off for the resumed epoch,
the one place shardmix reaches into the Trainer's module (docs/trainers.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import transformers
import transformers.trainer as hf_trainer
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from shardmix.errors import ConfigError
from shardmix.loader import MixingLoader

LOADER_STATE_NAME = "shardmix_loader.json"

# The Trainer's steps the mixin takes part in; without them it would resume by skipping batches.
_NEEDED = ("_init_training_state", "_run_epoch", "_save_checkpoint", "_get_output_dir")
_MISSING = [name for name in _NEEDED if not callable(getattr(Trainer, name, None))]
if _MISSING:
    raise ImportError(
        f"shardmix.hf needs transformers 5.23 or later: this transformers "
        f"({transformers.__version__}) has no Trainer.{_MISSING[0]}; "
        "pip install 'shardmix[transformers]'"
    )


class TrainerLoader:
    """What the Trainer iterates: the MixingLoader, its resumed epoch's ``set_epoch`` checked."""

    def __init__(self, loader: MixingLoader) -> None:
        self.loader = loader
        self._resumed_epoch: int | None = None

    def resume(self, state: dict[str, Any], source: str) -> None:
        try:
            self.loader.load_state_dict(state)
        except ConfigError as error:
            error.add_note(f"while resuming the MixingLoader from {source}")
            raise
        self._resumed_epoch = self.loader.epoch

    @property
    def resuming(self) -> bool:
        return self._resumed_epoch is not None

    def set_epoch(self, epoch: int) -> None:
        resumed, self._resumed_epoch = self._resumed_epoch, None
        if resumed is None:
            self.loader.set_epoch(epoch)
        elif resumed != epoch:
            raise ConfigError(
                f"the Trainer resumes epoch {epoch} but the loader state in its checkpoint is in "
                f"epoch {resumed}: len(loader) must be the same in every epoch for the Trainer's "
                "step counts to match the loader's position"
            )

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


class ShardmixTrainerMixin:
    """Put before a Trainer class: ``class MyTrainer(ShardmixTrainerMixin, SFTTrainer)``, and
    pass ``train_loader=`` instead of ``train_dataset=``: its batches are the model's inputs."""

    def __init__(self, *args: Any, train_loader: MixingLoader, **kwargs: Any) -> None:
        if kwargs.get("train_dataset") is not None:
            raise ConfigError(
                "pass either train_loader= or train_dataset=, not both: the MixingLoader is the "
                "training data"
            )
        if not isinstance(train_loader, MixingLoader):
            raise ConfigError(
                f"train_loader must be a MixingLoader, found {type(train_loader).__name__}"
            )
        super().__init__(*args, **kwargs)
        if self.args.ignore_data_skip:
            raise ConfigError(
                "TrainingArguments(ignore_data_skip=True) does not apply to a MixingLoader: it "
                "resumes from its checkpointed position without reading any batch again; leave "
                "ignore_data_skip False"
            )
        self.train_loader = train_loader
        self._trainer_loader = TrainerLoader(train_loader)

    def get_train_dataloader(self) -> Any:
        return self._trainer_loader

    def _init_training_state(
        self,
        max_steps: int,
        num_update_steps_per_epoch: int,
        num_train_epochs: int,
        resume_from_checkpoint: str | None,
        trial: Any,
    ) -> tuple[int, int]:
        counters: tuple[int, int] = super()._init_training_state(  # type: ignore[misc]
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        if resume_from_checkpoint is not None:
            path = os.path.join(resume_from_checkpoint, LOADER_STATE_NAME)
            self._trainer_loader.resume(_read_state(path), path)
        return counters

    def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
        view = self._trainer_loader
        with _no_skip(view) if view.resuming else nullcontext():
            return super()._run_epoch(*args, **kwargs)  # type: ignore[misc]

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        state = self.train_loader.state_dict()  # a collective: every rank takes part
        if self.args.should_save:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            output_dir = os.path.join(self._get_output_dir(trial=trial), folder)  # type: ignore[attr-defined]
            _write_state(os.path.join(output_dir, LOADER_STATE_NAME), state)
        super()._save_checkpoint(model, trial)  # type: ignore[misc]

    args: Any  # the Trainer's, declared for type checkers
    state: Any


class ShardmixTrainer(ShardmixTrainerMixin, Trainer):
    """``transformers.Trainer`` over a MixingLoader (``train_loader=``), resuming exactly."""


@contextmanager
def _no_skip(view: TrainerLoader) -> Iterator[None]:
    """While the Trainer resumes an epoch, its ``skip_first_batches`` returns ``view`` as is."""
    original = getattr(hf_trainer, "skip_first_batches", None)
    if original is None:  # a Trainer that no longer fast-forwards: nothing to turn off
        yield
        return

    def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
        if dataloader is view:
            return view
        return original(dataloader, num_batches)

    hf_trainer.skip_first_batches = skip_first_batches  # type: ignore[attr-defined]
    try:
        yield
    finally:
        hf_trainer.skip_first_batches = original  # type: ignore[attr-defined]


def _read_state(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as file:
            state: dict[str, Any] = json.load(file)
    except FileNotFoundError:
        raise ConfigError(
            f"{path} not found: the checkpoint holds no MixingLoader state, so the loader cannot "
            "resume where it stopped; resume from a checkpoint saved by a ShardmixTrainer"
        ) from None
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"{path}: the MixingLoader state is not valid JSON at byte {error.pos}: {error.msg}"
        ) from error
    return state


def _write_state(path: str, state: dict[str, Any]) -> None:
    """Write ``state`` as JSON, whole or not at all."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as file:
        json.dump(state, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)
