"""The manifest beside the shards, the journal of a run in progress, and merging parts.

The schema, the journal and merging: docs/design/convert.md, "The manifest".
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from shardmix.convert.options import OutputPattern, Part
from shardmix.convert.outfiles import (
    append,
    naming_full,
    refuse_link,
    write_atomic,
    write_json_atomic,
)
from shardmix.errors import ConfigError, CorruptShardError

VERSION = 2  # 2: token counts (tokenized conversions)
READABLE = (1, VERSION)


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a manifest."""

    name: str
    records: int
    bytes: int
    sha256: str
    tokens: int | None = None  # a tokenized conversion's: the shard's, and each record's
    record_tokens: tuple[int, ...] | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardEntry:
        entry = cls(**data)
        counts = entry.record_tokens
        return entry if counts is None else replace(entry, record_tokens=tuple(map(int, counts)))

    def to_json(self) -> dict[str, Any]:
        return {name: value for name, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class Manifest:
    """The content of a manifest file (the schema: docs/design/convert.md)."""

    format: str
    gzip: bool
    index: bool
    part: int | None
    parts: int
    plan: str
    classes: tuple[str, ...] = ()
    shards: tuple[ShardEntry, ...] = field(default_factory=tuple)
    origin: dict[str, Any] | None = None

    @property
    def records(self) -> int:
        return sum(shard.records for shard in self.shards)

    @property
    def bytes(self) -> int:
        return sum(shard.bytes for shard in self.shards)

    @property
    def tokens(self) -> int | None:
        """The tokens of all shards (a tokenized conversion), else None."""
        if not self.shards or any(shard.tokens is None for shard in self.shards):
            return None
        return sum(shard.tokens or 0 for shard in self.shards)

    def to_json(self) -> dict[str, Any]:
        data = {"shardmix_manifest": VERSION, **asdict(self)}
        data["classes"] = list(self.classes)
        data["shards"] = [shard.to_json() for shard in self.shards]
        data["records"], data["bytes"] = self.records, self.bytes
        if self.tokens is not None:
            data["tokens"] = self.tokens
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> Manifest:
        version = data.get("shardmix_manifest") if isinstance(data, dict) else None
        if version not in READABLE:
            raise CorruptShardError(
                f"{where}: not a shardmix manifest of version {READABLE} (found {version!r}); "
                "upgrade shardmix or re-create the manifest",
                url=where,
            )
        try:
            shards = tuple(ShardEntry.from_json(entry) for entry in data["shards"])
            return cls(
                data["format"],
                bool(data["gzip"]),
                bool(data["index"]),
                data["part"],
                int(data["parts"]),
                data["plan"],
                tuple(data["classes"]),
                shards,
                data.get("origin"),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise CorruptShardError(f"{where}: damaged manifest: {error!r}", url=where) from error


def write_manifest(path: str, manifest: Manifest) -> None:
    write_json_atomic(path, manifest.to_json())


def read_manifest(path: str) -> Manifest:
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except ValueError as error:
        raise CorruptShardError(f"{path}: damaged manifest: {error}", url=path) from error
    return Manifest.from_json(data, path)


@dataclass(frozen=True)
class Journal:
    """The completed shards of a run in progress, one JSON line each after a header line."""

    path: str

    def read(self, plan: str) -> dict[str, ShardEntry] | None:
        """The shards a previous run of the same plan completed; None if there was none."""
        refuse_link(self.path)
        try:
            with open(self.path, encoding="utf-8") as file:
                lines = file.read().splitlines()
        except FileNotFoundError:
            return None
        entries = []
        try:
            if not lines or json.loads(lines[0]).get("plan") != plan:
                return None
            for line in filter(str.strip, lines[1:]):
                entries.append(ShardEntry.from_json(json.loads(line)))
        except (ValueError, TypeError):  # a line cut by a kill: trust what came before it
            pass
        return {entry.name: entry for entry in entries}

    def start(self, plan: str, done: Sequence[ShardEntry]) -> None:
        lines = [json.dumps({"plan": plan})] + [json.dumps(entry.to_json()) for entry in done]
        write_atomic(self.path, ("\n".join(lines) + "\n").encode("utf-8"))

    def append(self, entry: ShardEntry) -> None:
        with naming_full(self.path), append(self.path) as file:
            file.write((json.dumps(entry.to_json()) + "\n").encode("utf-8"))

    def remove(self) -> None:
        if os.path.lexists(self.path):
            os.unlink(self.path)


def merge_manifests(manifests: Sequence[Manifest]) -> Manifest:
    """One manifest for all parts: shards in part order; every part exactly once."""
    if not manifests:
        raise ConfigError("no part manifests to merge")
    first = manifests[0]
    ordered = sorted(manifests, key=lambda m: -1 if m.part is None else m.part)
    found = [m.part for m in ordered]
    if found != list(range(first.parts)):
        raise ConfigError(f"cannot merge: expected parts 0..{first.parts - 1}, found {found}")
    for other in ordered[1:]:
        if differences := _differences(ordered[0], other):
            raise ConfigError(
                f"cannot merge part {other.part} with part {ordered[0].part}: they are parts of "
                f"different conversions ({'; '.join(differences)}); convert every part from "
                "the same inputs with the same options (--overwrite replaces a part)"
            )
    shards = tuple(shard for m in ordered for shard in m.shards)
    if len({shard.name for shard in shards}) != len(shards):
        raise ConfigError("cannot merge: two parts name the same shard")
    plan = hashlib.sha256(" ".join(m.plan for m in ordered).encode()).hexdigest()
    return replace(first, part=None, plan=plan, shards=shards)


def _differences(first: Manifest, other: Manifest) -> list[str]:
    """What differs between two parts' manifests, named: ``["max_records 100 vs 200"]``."""
    kept = ("format", "gzip", "index", "parts", "classes")
    mine = {name: getattr(first, name) for name in kept} | (first.origin or {}).get("options", {})
    theirs = {name: getattr(other, name) for name in kept} | (other.origin or {}).get("options", {})
    found = [
        f"{name} {mine[name]!r} vs {theirs[name]!r}"
        for name in sorted(mine.keys() & theirs.keys())
        if mine[name] != theirs[name]
    ]
    mine_in, theirs_in = ((m.origin or {}).get("inputs") for m in (first, other))
    if mine_in and theirs_in and mine_in != theirs_in:
        found.append(f"the inputs: their items' sha256 {mine_in[:12]}... vs {theirs_in[:12]}...")
    return found


def merge_part_manifests(pattern: OutputPattern, count: int, *, required: bool) -> str | None:
    """Merge the manifests of all ``count`` parts into the pattern's manifest; its path, or
    None (when ``required``, :class:`ConfigError`) while some part's manifest is missing."""
    paths = [
        os.path.join(pattern.folder, pattern.manifest_name(Part(index, count)))
        for index in range(count)
    ]
    missing = [path for path in paths if not os.path.exists(path)]
    if missing:
        if required:
            raise ConfigError(f"cannot merge: part manifests missing: {', '.join(missing)}")
        return None
    merged = merge_manifests([read_manifest(path) for path in paths])
    target = os.path.join(pattern.folder, pattern.manifest_name(None))
    write_manifest(target, merged)
    return target
