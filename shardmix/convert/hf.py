"""Hugging Face ``datasets`` inputs: a ``Dataset`` or ``IterableDataset``, or a saved folder.

A dataset is read as Arrow record batches, never decoded (an ``Image``/``Audio`` column gives
its ``{"bytes", "path"}`` struct); rows become items as table rows do, the key stem being a
saved folder's name, else ``dataset``. ``datasets`` is imported only to read a saved folder.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

from shardmix.convert.identity import ArrowDigest
from shardmix.convert.inputs import BadInputError, Item, Problems
from shardmix.convert.options import ConvertOptions
from shardmix.convert.tables import Row, RowMaker, row_items

_BATCH_ROWS = 1024
_INFO_FILES = ("dataset_info.json", "state.json")


def is_hf_dataset(value: object) -> bool:
    """Whether ``value`` is a ``datasets.Dataset`` or ``datasets.IterableDataset``."""
    module = sys.modules.get("datasets")  # not imported: it cannot be one
    if module is None:
        return False
    return isinstance(value, (module.Dataset, module.IterableDataset))


def is_saved_dataset(path: str) -> bool:
    """Whether ``path`` is a folder written by ``Dataset.save_to_disk``."""
    if not os.path.isdir(path):
        return False
    names = os.listdir(path)
    return any(name in names for name in _INFO_FILES) and any(
        name.endswith(".arrow") for name in names
    )


def load_saved(path: str) -> Any:
    """The ``datasets.Dataset`` saved in the folder ``path``."""
    try:
        import datasets
    except ImportError as error:
        raise ImportError(
            f"{path}: reading a saved Hugging Face dataset needs datasets; install it with "
            "pip install 'shardmix[hf]'"
        ) from error
    try:
        return datasets.load_from_disk(path)
    except (OSError, ValueError) as error:
        raise BadInputError(
            f"{path}: cannot load the saved Hugging Face dataset: {error}", url=path
        ) from error


def dataset_rows(dataset: Any, digest: ArrowDigest | None = None) -> Iterator[tuple[int, Row]]:
    """``(row number, row)`` of a dataset, undecoded (Image/Audio as ``{bytes, path}``); each
    Arrow batch goes through ``digest`` (when given) as it is read."""
    index = 0
    for batch in dataset.with_format("arrow").iter(batch_size=_BATCH_ROWS):
        if digest is not None:
            digest.update(batch)
        for row in batch.to_pylist():
            yield index, row
            index += 1


def list_dataset(
    dataset: Any, source: str, options: ConvertOptions, problems: Problems
) -> tuple[list[Item], str]:
    """The rows of a dataset as items, and its fingerprint; ``source`` names it in keys (a
    folder) and messages."""
    saved = os.path.isdir(source)
    stem = os.path.basename(os.path.normpath(source)) if saved else "dataset"
    maker = RowMaker(source, options, problems, folder=source if saved else os.getcwd(), stem=stem)
    digest = ArrowDigest()
    items = list(row_items(maker, dataset_rows(dataset, digest)))
    return items, digest.fingerprint()
