"""Stat: what a set of shards holds (format, records, bytes), and whether every record is sound.

:func:`stat_shards` counts each shard's records the cheap way (headers and length CRCs checked,
payloads seeked past); ``verify=True`` reads every record in full and checks each local shard's
sha256 against the manifest beside it, since a flipped byte inside a tar member has no checksum
of its own. Damage does not stop the walk. The JSON is spelled out in ``docs/inspect-schema.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from shardmix.convert.identity import stale_inputs
from shardmix.errors import ShardmixError
from shardmix.formats import Format, ReadOptions, TFRecordPayload, infer_format, reader_for
from shardmix.inspect.reading import progress_bar
from shardmix.plan.counts import count_records, manifest_shards
from shardmix.plan.manifests import missing_listed
from shardmix.plan.urls import expand_urls
from shardmix.sources import is_local, local_path, open_shard

STAT_SCHEMA_VERSION = 1
# TFRecord payloads are verified by their CRC, not decoded: a checksum says nothing of meaning.
_VERIFY_OPTIONS = ReadOptions(tfrecord_payload=TFRecordPayload.RAW)


class Checksum(Enum):
    """What ``verify`` found comparing a shard's sha256 with the manifest beside it."""

    VERIFIED = "verified"
    MISMATCH = "mismatch"
    NO_ENTRY = "no manifest entry"
    STALE = "stale"  # the sha256 matches, but an input of the conversion changed since


@dataclass(frozen=True)
class ShardStat:
    """One shard: its format, records and size, and the damage found in it, if any."""

    url: str
    format: Format
    records: int
    bytes: int | None
    error: str | None = None
    error_record: int | None = None
    error_offset: int | None = None
    sha256: str | None = None
    manifest_sha256: str | None = None
    checksum: Checksum | None = None

    @property
    def damaged(self) -> bool:
        return self.error is not None

    def to_dict(self) -> dict[str, Any]:
        checksum = None if self.checksum is None else self.checksum.value
        return asdict(self) | {"format": self.format.value, "checksum": checksum}


@dataclass(frozen=True)
class StatReport:
    """Every shard's :class:`ShardStat`, in URL order, and the totals."""

    shards: list[ShardStat]
    verify: bool
    missing: list[str] = field(default_factory=list)
    damaged: list[ShardStat] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "damaged", [shard for shard in self.shards if shard.damaged])

    @property
    def records(self) -> int:
        return sum(shard.records for shard in self.shards)

    @property
    def bytes(self) -> int:
        return sum(shard.bytes or 0 for shard in self.shards)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON types, in the schema the module docstring spells out."""
        return {
            "schema_version": STAT_SCHEMA_VERSION,
            "verify": self.verify,
            "shards": [shard.to_dict() for shard in self.shards],
            "totals": {
                "shards": len(self.shards),
                "records": self.records,
                "bytes": self.bytes,
                "damaged": len(self.damaged),
            },
            "missing": list(self.missing),
        }


def stat_shards(
    urls: str | Sequence[str],
    *,
    verify: bool = False,
    format: str | Format | None = None,
    progress: bool = False,
) -> StatReport:
    """Format, records and bytes of every shard that the patterns ``urls`` name.

    ``verify`` reads every record in full and checks each local shard's sha256 against the
    manifest beside it; ``format`` overrides the extension's; ``progress`` shows a bar on stderr.
    """
    expanded = expand_urls(urls)
    gone = [url for url in expanded if is_local(url) and not os.path.exists(local_path(url))]
    forced = Format(format) if format is not None else None
    digests = ManifestDigests()
    shards = [
        _stat_one(url, forced or infer_format(url), verify, digests)
        for url in progress_bar(
            [url for url in expanded if url not in gone], progress, "stat", unit="shard"
        )
    ]
    missing = list(dict.fromkeys(gone + missing_listed(urls)))
    return StatReport(shards=shards, verify=verify, missing=missing)


def _stat_one(url: str, fmt: Format, verify: bool, digests: ManifestDigests) -> ShardStat:
    found = _stat_records(url, fmt, verify)
    if not verify:
        return found
    expected = digests.expected(url)
    if expected is None:
        return dataclasses.replace(found, checksum=Checksum.NO_ENTRY)
    path, manifest_path, want = expected
    have = file_sha256(path)
    hashed = dataclasses.replace(found, sha256=have, manifest_sha256=want)
    if have == want:
        stale = digests.stale(manifest_path)
        if not stale:
            return dataclasses.replace(hashed, checksum=Checksum.VERIFIED)
        error = (
            f"{url}: the sha256 matches {manifest_path}, but the input it was converted "
            f"from changed since ({'; '.join(stale[:5])}); run convert again with "
            "--overwrite"
        )
        return dataclasses.replace(hashed, checksum=Checksum.STALE, error=error)
    mismatch = dataclasses.replace(hashed, checksum=Checksum.MISMATCH)
    if found.damaged:
        return mismatch
    error = (
        f"{url}: sha256 mismatch: the manifest {manifest_path} expects {want}, the file has "
        f"{have}; the shard changed after it was written (a flipped byte inside a tar member "
        "has no checksum of its own): write it again or restore it from a good copy"
    )
    return dataclasses.replace(mismatch, error=error)


def _stat_records(url: str, fmt: Format, verify: bool) -> ShardStat:
    read = 0  # with verify: the records read whole, every header and checksum checked
    size = None
    try:
        size = _size(url)
        if verify:
            with open_shard(url) as stream:
                for _ in reader_for(fmt, _VERIFY_OPTIONS).records(stream, url):
                    read += 1
        records = read if verify else count_records(url, fmt)
    except ShardmixError as error:
        message = "\n".join([str(error), *getattr(error, "__notes__", ())])
        records = error.record if error.record is not None else read
        return ShardStat(url, fmt, records, size, message, error.record, error.offset)
    return ShardStat(url, fmt, records, size)


class ManifestDigests:
    """The sha256 per shard that the manifests in each local shard's folder give."""

    def __init__(self) -> None:
        self._folders: dict[str, dict[str, tuple[str, str]]] = {}  # name: (manifest, sha256)
        self._stale: dict[str, list[str]] = {}

    def stale(self, manifest_path: str) -> list[str]:
        """The recorded inputs of a conversion that changed since (sizes and mtimes)."""
        if manifest_path not in self._stale:
            self._stale[manifest_path] = stale_inputs(manifest_path) or []
        return self._stale[manifest_path]

    def expected(self, url: str) -> tuple[str, str, str] | None:
        """``(shard path, manifest path, sha256)`` for local shard ``url``, else None."""
        if not is_local(url):
            return None
        path = os.path.abspath(local_path(url))
        folder, name = os.path.split(path)
        if folder not in self._folders:
            self._folders[folder] = {
                str(shard["name"]): (manifest, str(shard["sha256"]))
                for manifest, shard in manifest_shards(folder, "its shards are not checked")
                if "sha256" in shard
            }
        entry = self._folders[folder].get(name)
        return None if entry is None else (path, *entry)


def file_sha256(path: str) -> str:
    """The hex sha256 of the file at ``path``."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _size(url: str) -> int | None:
    """A local shard's size, else its stream's when it can seek to the end."""
    if is_local(url):
        with contextlib.suppress(OSError):
            return os.path.getsize(local_path(url))
    with open_shard(url) as stream:
        try:
            return int(stream.seek(0, io.SEEK_END)) if stream.seekable() else None
        except (OSError, ValueError, AttributeError):
            return None
