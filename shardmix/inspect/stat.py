"""Stat: what a set of shards holds (format, records, bytes), and whether every record is sound.

:func:`stat_shards` looks at each shard of a URL pattern on its own. By default it counts
records the cheap way (tar headers walked and checked, TFRecord length CRCs checked, payloads
seeked past). With ``verify=True`` it reads every record with the full readers instead, so
every tar header and every TFRecord data CRC is checked too; TFRecord payloads are read as
framed records (not decoded as ``tf.train.Example``): a checksum says nothing about meaning.
A flipped byte inside a tar member's data has no checksum of its own, so ``verify`` also
hashes each local shard and checks it against the ``sha256`` that ``shardmix convert`` wrote
in the manifest beside it (``*.manifest.json`` in the shard's folder), when one names the
shard: ``"verified"``, ``"mismatch"`` (a damaged shard, both digests in its error),
``"stale"`` (the digest matches, but an input recorded beside the manifest changed size or
mtime since the conversion: the error names it) or ``"no manifest entry"`` (no manifest
names it, or the shard is remote; the command line says "unverified (no manifest)").

Damage does not stop the walk: each damaged shard is reported with the error's message (which
names the URL, the record index and the byte offset) and the position as fields, and the other
shards are still read. Opening shards is left to :mod:`shardmix.sources`, parsing to
:mod:`shardmix.formats`, the counting pass to :mod:`shardmix.plan.counts`; the CLI shell is
:mod:`shardmix.cli.stat`.

The JSON (``StatReport.to_dict()``) and what each field means (``records`` of a damaged shard,
which shards are ``missing``: :func:`~shardmix.plan.manifests.missing_listed`) are in
``docs/inspect-schema.md``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from shardmix.convert.identity import stale_inputs
from shardmix.errors import ShardmixError
from shardmix.formats import Format, ReadOptions, TFRecordPayload, infer_format, reader_for
from shardmix.plan.counts import count_records, manifest_shards
from shardmix.plan.manifests import missing_listed
from shardmix.plan.urls import expand_urls
from shardmix.sources import is_local, local_path, open_shard

STAT_SCHEMA_VERSION = 1
# TFRecord payloads are verified by their CRC, not decoded: a checksum says nothing of meaning.
_VERIFY_OPTIONS = ReadOptions(tfrecord_payload=TFRecordPayload.RAW)
_HASH_BLOCK = 1 << 20
log = logging.getLogger(__name__)


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
        return {
            "url": self.url,
            "format": self.format.value,
            "records": self.records,
            "bytes": self.bytes,
            "error": self.error,
            "error_record": self.error_record,
            "error_offset": self.error_offset,
            "sha256": self.sha256,
            "manifest_sha256": self.manifest_sha256,
            "checksum": None if self.checksum is None else self.checksum.value,
        }


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
    """Format, records and bytes of every shard that ``urls`` names.

    Args:
        urls: a URL pattern or a list of them, as :class:`~shardmix.ShardDataset` takes.
        verify: read every record with the full readers (every tar header and TFRecord CRC
            checked) instead of only counting, and check each local shard's sha256 against
            the manifest beside it when one names the shard.
        format: force a format instead of inferring it from each URL's extension.
        progress: show a progress bar on stderr.
    """
    expanded = expand_urls(urls)
    gone = [url for url in expanded if is_local(url) and not os.path.exists(local_path(url))]
    forced = Format(format) if format is not None else None
    digests = ManifestDigests()
    shards = [
        _stat_one(url, forced or infer_format(url), verify, digests)
        for url in _progress([url for url in expanded if url not in gone], progress, "stat")
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
    if have == want:
        stale = digests.stale(manifest_path)
        if stale:
            error = (
                f"{url}: the sha256 matches {manifest_path}, but the input it was converted "
                f"from changed since ({'; '.join(stale[:5])}); run convert again with "
                "--overwrite"
            )
            return dataclasses.replace(
                found, sha256=have, manifest_sha256=want, checksum=Checksum.STALE, error=error
            )
        return dataclasses.replace(
            found, sha256=have, manifest_sha256=want, checksum=Checksum.VERIFIED
        )
    mismatch = dataclasses.replace(
        found, sha256=have, manifest_sha256=want, checksum=Checksum.MISMATCH
    )
    if found.damaged:
        return mismatch
    error = (
        f"{url}: sha256 mismatch: the manifest {manifest_path} expects {want}, the file has "
        f"{have}; the shard changed after it was written (a flipped byte inside a tar member "
        "has no checksum of its own): write it again or restore it from a good copy"
    )
    return dataclasses.replace(mismatch, error=error)


def _stat_records(url: str, fmt: Format, verify: bool) -> ShardStat:
    read = [0]

    def advance() -> None:
        read[0] += 1

    size = _local_size(url)
    try:
        if size is None:
            size = _remote_size(url)
        records = _verify_shard(url, fmt, advance) if verify else count_records(url, fmt)
    except ShardmixError as error:
        message = "\n".join([str(error), *getattr(error, "__notes__", ())])
        records = error.record if error.record is not None else read[0]
        return ShardStat(url, fmt, records, size, message, error.record, error.offset)
    return ShardStat(url, fmt, records, size)


def _verify_shard(url: str, fmt: Format, advance: Callable[[], None]) -> int:
    """Records read in full, every header and checksum checked; ``advance`` after each."""
    reader = reader_for(fmt, _VERIFY_OPTIONS)
    count = 0
    with open_shard(url) as stream:
        for _ in reader.records(stream, url):
            count += 1
            advance()
    return count


class ManifestDigests:
    """The sha256 per shard that the manifests in each local shard's folder give."""

    def __init__(self) -> None:
        self._folders: dict[str, dict[str, tuple[str, str]]] = {}
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
            self._folders[folder] = manifest_digests(folder)
        entry = self._folders[folder].get(name)
        return None if entry is None else (path, *entry)


def manifest_digests(folder: str) -> dict[str, tuple[str, str]]:
    """``{shard name: (manifest path, sha256)}`` from the manifests in ``folder``."""
    found: dict[str, tuple[str, str]] = {}
    for path, shard in manifest_shards(folder, "its shards are not checked"):
        if "sha256" in shard:
            found[str(shard["name"])] = (path, str(shard["sha256"]))
    return found


def file_sha256(path: str) -> str:
    """The hex sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _local_size(url: str) -> int | None:
    if not is_local(url):
        return None
    try:
        return os.path.getsize(local_path(url))
    except OSError:
        return None


def _remote_size(url: str) -> int | None:
    """A remote shard's size, when its stream can seek to the end."""
    with open_shard(url) as stream:
        try:
            return int(stream.seek(0, io.SEEK_END)) if stream.seekable() else None
        except (OSError, ValueError, AttributeError):
            return None


def _progress(items: Sequence[str], show: bool, what: str) -> Iterator[str]:
    if not show:
        return iter(items)
    from tqdm import tqdm

    return iter(tqdm(items, desc=what, unit="shard", leave=False))
