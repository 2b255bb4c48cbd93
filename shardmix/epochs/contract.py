"""What every kind of epoch is to the loader, and where the loader is among its epochs.

One dataset's, a mixture's and a rank's canonical ranks' epochs are each an :class:`Epoch` to
the loader, which never asks which kind it is. :class:`Cursor` is the loader's live part: the
epoch it reads or reads next, and the position it resumes from.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from shardmix.errors import WorkerError


class Epoch(Protocol):
    """One epoch's batches, and its position between them."""

    @property
    def epoch(self) -> int: ...
    @property
    def batches(self) -> int: ...  # handed out so far
    @property
    def finished(self) -> bool: ...  # every batch was handed out (the last one cut)
    @property
    def filtered(self) -> dict[str, Any]: ...  # what MixingLoader.filtered reports
    def __next__(self) -> Any: ...
    def position(self) -> dict[str, Any]: ...  # after the last batch, as plain JSON types
    def close(self) -> None: ...  # stop reading (persistent workers keep running)
    def skipped(self) -> dict[str, Any] | None: ...  # on_error="skip"'s summary, plain JSON

    def sees_its_end(self) -> bool:
        """Whether the epoch is ``finished`` right after its last batch (else its length tells)."""
        ...

    def named_failure(self, error: RuntimeError) -> WorkerError | None:
        """torch's ``error`` about a dead worker as a WorkerError naming it (None: as it is)."""
        ...


@dataclass
class Cursor:
    """Where a loader is: ``epoch`` is read by the next ``iter()``; ``current`` is the epoch
    being read (started by the ``current_iteration``-th ``iter()``, in the resized ``phase``
    or ``{}``); ``resume`` is the position a ``load_state_dict()`` left."""

    epoch: int = 0
    current: Epoch | None = None
    phase: dict[str, Any] | None = None
    resume: dict[str, Any] | None = None
    iterations: int = 0
    current_iteration: int = 0
    # The iterator reading the current epoch, by weak reference: once the user holds none
    # (a ``for`` loop left by ``break``), that epoch is over.
    holder: weakref.ref[Any] | None = None

    def stop_current(self) -> None:
        """Close the current epoch, if any (its position stays readable)."""
        if self.current is not None:
            self.current.close()
