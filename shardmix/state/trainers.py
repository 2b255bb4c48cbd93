"""A loader state that a trainer saved and restored but never handed to the loader.

:func:`adopt_pending_state` loads the states Lightning's fit loop hands over only to data set up
after the restore; :func:`warn_unregistered` warns when an ``Accelerator`` in reach would
checkpoint without the loader. Both find the trainer on the call stack, by the attributes it
uses, never importing it, and read callers' locals with :func:`peek_locals`.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from collections.abc import Callable, Iterable
from inspect import CO_OPTIMIZED
from types import FrameType
from typing import Any

from shardmix.errors import UnregisteredLoaderWarning

# How far up the stack the fit loop may sit (Lightning's own nesting is about 10 frames).
_DEPTH = 40

# The loaders already looked at by warn_unregistered: one look (and one warning) per loader.
_LOOKED_AT: weakref.WeakSet[Any] = weakref.WeakSet()


def adopt_pending_state(loader: Any) -> bool:
    """Load the state Lightning saved for ``loader`` and never loaded; ``True`` if it did."""
    if "lightning.pytorch" not in sys.modules and "pytorch_lightning" not in sys.modules:
        return False
    fit_loop = _fit_loop(sys._getframe(1))
    if fit_loop is None:
        return False
    states = list(fit_loop._combined_loader_states_to_load)
    combined = fit_loop._combined_loader
    flattened = list(getattr(combined, "flattened", []))
    if not any(candidate is loader for candidate in flattened):
        return False
    load_in_order(flattened, states, lambda candidate: type(candidate) is type(loader))
    fit_loop._combined_loader_states_to_load = []
    return True


def load_in_order(
    loaders: Iterable[Any], states: Iterable[dict[str, Any]], accept: Callable[[Any], bool]
) -> None:
    """Load Lightning's ``states`` (one a stateful loader, in order) into those ``accept`` takes."""
    stateful = [loader for loader in loaders if is_stateful(loader)]
    for loader, state in zip(stateful, states, strict=False):
        if accept(loader):
            loader.load_state_dict(state)


def _fit_loop(frame: FrameType | None) -> Any:
    """The nearest caller's Lightning fit loop that still holds states to load, or ``None``."""
    for _ in range(_DEPTH):
        if frame is None:
            return None
        owner: Any = peek_locals(frame).get("self")
        if hasattr(owner, "_combined_loader_states_to_load") and hasattr(owner, "_combined_loader"):
            return owner if owner._combined_loader_states_to_load else None
        frame = frame.f_back
    return None


def peek_locals(frame: FrameType) -> dict[str, Any]:
    """The locals of ``frame`` as a new dict, leaving no snapshot on the frame (before 3.13 it
    would keep an iterator the caller deleted alive)."""
    scope = frame.f_locals
    found = dict(scope)
    if sys.version_info < (3, 13) and frame.f_code.co_flags & CO_OPTIMIZED:
        # A function's snapshot (not a module's or class body's namespace, which is the real
        # thing): the next look at f_locals, or a tracer's, fills it again from the frame.
        scope.clear()
    return found


def is_stateful(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


def warn_unregistered(loader: Any) -> bool:
    """Warn if an Accelerator in reach would checkpoint without ``loader``; ``True`` if so."""
    accelerate = sys.modules.get("accelerate")
    if accelerate is None or loader in _LOOKED_AT:
        return False
    _LOOKED_AT.add(loader)
    kind = getattr(accelerate, "Accelerator", None)
    if not isinstance(kind, type):
        return False
    accelerators = _instances(sys._getframe(1), kind)
    if not accelerators or any(registered_with(each, loader) for each in accelerators):
        return False
    warnings.warn(
        UnregisteredLoaderWarning(
            "this MixingLoader is not registered for checkpointing with the Accelerator in "
            "use: accelerator.save_state() leaves its position out and load_state() does not "
            "restore it, so a resumed run starts its epoch over (batches trained twice); use "
            "loader = shardmix.accelerate.prepare_loader(accelerator, loader), which registers "
            "it, or call accelerator.register_for_checkpointing(loader) before load_state()"
        ),
        stacklevel=4,  # the loop's line: here <- _start_epoch <- the epoch's next() <- loop
    )
    return True


def _instances(frame: FrameType | None, kind: type) -> list[Any]:
    """Every ``kind`` among the locals and globals of ``frame`` and its callers."""
    found: dict[int, Any] = {}
    for _ in range(_DEPTH):
        if frame is None:
            break
        for scope in (peek_locals(frame), frame.f_globals):
            for value in list(scope.values()):
                if isinstance(value, kind):
                    found[id(value)] = value
        frame = frame.f_back
    return list(found.values())


def registered_with(accelerator: Any, loader: Any) -> bool:
    """Whether ``loader`` (or a wrapper holding it as ``.loader``) is checkpointed."""
    objects = getattr(accelerator, "_custom_objects", [])
    return any(obj is loader or getattr(obj, "loader", None) is loader for obj in objects)
