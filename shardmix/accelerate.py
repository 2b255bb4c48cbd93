"""Accelerate: train from a MixingLoader under an ``accelerate.Accelerator``, resuming exactly.

A MixingLoader splits the shards between the ranks itself, so it must not go through
``accelerator.prepare``: :func:`prepare_loader` registers it for checkpointing and wraps it to
move each batch to the device and to mark the epoch's last batch from the loader's count, not
by reading ahead, so the state saved after a batch is that batch's (docs/guides/accelerate.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from shardmix.errors import ConfigError
from shardmix.loader import MixingLoader
from shardmix.state.trainers import registered_with

try:
    from accelerate.utils import send_to_device
except ImportError as error:  # pragma: no cover - the extra is missing
    raise ImportError(
        "shardmix.accelerate needs Accelerate: pip install 'shardmix[accelerate]'"
    ) from error


@dataclass(eq=False)
class AcceleratedLoader:
    """A MixingLoader as Accelerate's loop expects it (:func:`prepare_loader`): batches on
    ``accelerator.device``, ``end_of_dataloader`` set on each epoch's last batch."""

    loader: MixingLoader
    accelerator: Any
    _: KW_ONLY
    device_placement: bool = True
    non_blocking: bool = False
    # Read by Accelerate's GradientState while this is its active loader.
    end_of_dataloader: bool = field(default=False, init=False)
    remainder: int = field(default=-1, init=False)  # no padding to take out in gather_for_metrics

    def __iter__(self) -> Iterator[Any]:
        gradient_state = self.accelerator.gradient_state
        self.end_of_dataloader = False
        gradient_state._add_dataloader(self)
        try:
            for batch in self.loader:
                self.end_of_dataloader = self.loader.batches_left() == 0
                if self.device_placement:
                    batch = send_to_device(
                        batch, self.accelerator.device, non_blocking=self.non_blocking
                    )
                yield batch
        finally:
            gradient_state._remove_dataloader(self)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def close(self) -> None:
        self.loader.close()


def prepare_loader(
    accelerator: Any,
    loader: MixingLoader,
    *,
    device_placement: bool = True,
    non_blocking: bool = False,
) -> AcceleratedLoader:
    """Register ``loader`` for ``accelerator``'s checkpoints and wrap it for its loop; call it
    instead of ``accelerator.prepare``, before ``accelerator.load_state()``.
    ``device_placement=False`` leaves the batches where they are; ``non_blocking`` is passed
    to each tensor's ``.to()`` (with ``pin_memory=True``).
    """
    if not isinstance(loader, MixingLoader):
        raise ConfigError(
            f"prepare_loader takes a MixingLoader, got {type(loader).__name__}: pass a torch "
            "DataLoader to accelerator.prepare instead"
        )
    if not registered_with(accelerator, loader):
        accelerator.register_for_checkpointing(loader)
    return AcceleratedLoader(
        loader, accelerator, device_placement=device_placement, non_blocking=non_blocking
    )
