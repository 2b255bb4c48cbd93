"""What the shards of a conversion were written from: a fingerprint of every input.

A re-run trusts its earlier shards only when every recorded fingerprint is the same, else
:class:`~shardmix.errors.InputChangedError` (docs/design/convert.md, "Input fingerprints").
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from shardmix.convert.inputs import FileItem, RowItem
from shardmix.convert.outfiles import beside, write_json_atomic
from shardmix.convert.plan import ShardPlan
from shardmix.errors import InputChangedError

VERSION = 1
_SHOWN = 5  # changed inputs named in a message


def file_fingerprint(path: str) -> str:
    """``"<size> <mtime_ns> <sha256>"`` of a local file."""
    with open(path, "rb") as file:
        status = os.fstat(file.fileno())
        digest = hashlib.file_digest(file, "sha256").hexdigest()
    return f"{status.st_size} {status.st_mtime_ns} {digest}"


class ArrowDigest:
    """The sha256 of Arrow record batches in the IPC stream format (a slice: its own rows)."""

    def __init__(self) -> None:
        self.sha256 = hashlib.sha256()

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        return len(data)

    def update(self, table: Any) -> None:
        import pyarrow as pa

        with pa.ipc.new_stream(pa.PythonFile(self, mode="w"), table.schema) as writer:
            writer.write(table)

    def fingerprint(self) -> str:
        return f"arrow {self.sha256.hexdigest()}"

    # pa.PythonFile asks these of a sink
    closed = False

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def input_files(plans: Sequence[ShardPlan], datasets: Mapping[str, str]) -> list[str]:
    """The local files this part's samples are read from (datasets aside), sorted."""
    files: set[str] = set()
    sources: set[str] = set()  # each distinct source is resolved once, not once per item
    for plan in plans:
        for item in plan.items:
            if isinstance(item, FileItem):
                files.update(item.paths)
                continue
            sources.add(item.source)  # a table's or a shard's
            if isinstance(item, RowItem) and item.inline:
                values = dict(zip(item.fields, item.values, strict=True))
                files.update(str(values[name]) for name in item.inline if name in values)
    files.update(source for source in sources if source not in datasets and os.path.isfile(source))
    return sorted({os.path.abspath(path) for path in files})


def fingerprints(plans: Sequence[ShardPlan], datasets: Mapping[str, str]) -> dict[str, str]:
    found = {path: file_fingerprint(path) for path in input_files(plans, datasets)}
    if datasets:
        used = {item.source for plan in plans for item in plan.items}
        found.update({name: value for name, value in datasets.items() if name in used})
    return found


def read_inputs(path: str) -> dict[str, str] | None:
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
        return {str(name): str(value) for name, value in data["inputs"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_inputs(path: str, found: Mapping[str, str]) -> None:
    write_json_atomic(path, {"shardmix_inputs": VERSION, "inputs": dict(found)})


def changes(before: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """One phrase per input that differs: changed, new or gone."""
    found = [
        f"{name} changed" for name in sorted(now) if name in before and before[name] != now[name]
    ]
    found += [f"{name} is new" for name in sorted(now) if name not in before]
    found += [f"{name} is gone" for name in sorted(before) if name not in now]
    return found


def check_unchanged(path: str, now: Mapping[str, str], folder: str) -> None:
    """:class:`InputChangedError` unless the record at ``path`` holds exactly ``now``."""
    before = read_inputs(path)
    differ = ["no record of the inputs is kept"] if before is None else changes(before, now)
    if not differ:
        return
    shown = "; ".join(differ[:_SHOWN]) + ("; ..." if len(differ) > _SHOWN else "")
    raise InputChangedError(
        f"{folder}: the shards there were written from other input ({len(differ)} "
        f"difference(s): {shown}); pass --overwrite to write them again from the input as "
        "it is now",
        url=folder,
    )


def stale_inputs(manifest_path: str) -> list[str] | None:
    """Recorded local inputs whose size or mtime differ now; None without a record."""
    recorded = read_inputs(beside(manifest_path, "inputs"))
    if recorded is None:
        return None
    found = []
    for name, value in recorded.items():
        if value.startswith("arrow "):
            continue
        size, mtime, _ = value.split(" ", 2)
        try:
            status = os.stat(name)
        except OSError:
            found.append(f"{name} is gone")
            continue
        if (str(status.st_size), str(status.st_mtime_ns)) != (size, mtime):
            found.append(f"{name} changed")
    return found
