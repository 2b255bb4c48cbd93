"""torch.distributed.checkpoint: a MixingLoader as a ``Stateful`` in ``dcp.save`` / ``dcp.load``.

DCP keeps one copy of a non-tensor leaf that several ranks save under one key, but a
MixingLoader's state differs from rank to rank: :class:`LoaderState` gives DCP every rank's
state as rank 0 would have saved it, one JSON string, the same on every rank.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shardmix.errors import ConfigError
from shardmix.loader import MixingLoader
from shardmix.state.ranks import as_saved_by

STATE_KEY = "state"


class LoaderState:
    """A ``Stateful``: ``dcp.save({"model": ..., "loader": LoaderState(loader)}, ...)``, and
    ``dcp.load`` with the same dict restores the loader's position."""

    def __init__(self, loader: MixingLoader) -> None:
        if not isinstance(loader, MixingLoader):
            raise ConfigError(f"LoaderState holds a MixingLoader, not {type(loader).__name__}")
        self.loader = loader

    def state_dict(self) -> dict[str, str]:
        """The loader's gathered state as one JSON string: the same on every rank."""
        shared = as_saved_by(self.loader.state_dict(), 0)
        return {STATE_KEY: json.dumps(shared, sort_keys=True, separators=(",", ":"))}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue from the state DCP loaded: this rank takes its own position."""
        text = state_dict.get(STATE_KEY)
        if not isinstance(text, str):
            raise ConfigError(
                f"cannot resume the MixingLoader: the checkpoint's loader entry {STATE_KEY!r} "
                f"should be a JSON string, found {type(text).__name__}; save it with "
                "LoaderState(loader)"
            )
        try:
            state = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"cannot resume the MixingLoader: its checkpoint entry is not valid JSON at "
                f"character {error.pos}: {error.msg}"
            ) from error
        self.loader.load_state_dict(state)
