"""The manifests beside the shards: what each says about a shard, local or remote.

``shardmix convert`` writes ``<prefix>.manifest.json`` beside its shards (the schema is in
:mod:`shardmix.convert.manifest`). Beside local shards every ``*.manifest.json`` of the folder
is read. Beside remote shards a folder cannot be listed, so the one name convert gives the
manifest of shards named like them is asked for, once per folder and process
(:func:`manifest_name_for`: ``train-000000.tar`` → ``train.manifest.json``); a folder that has
none (404) costs that one request. What a manifest says is a claim: the size it names is
compared with the local file's (a mismatch is warned about, naming both, and the claim stands,
so that the read checks the count), and the count with what the read finds
(:mod:`shardmix.reading.claims`). Left to others: using the counts (:mod:`shardmix.plan.counts`),
checking sha256 (``shardmix stat --verify``, the cache).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from shardmix.errors import ManifestMismatchWarning, ShardmixError
from shardmix.sources import SourceOptions, is_local, local_path, open_shard, scheme_of

MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 256 * 1024 * 1024  # a remote manifest larger than this is not read

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ManifestEntry:
    """What the manifest at ``manifest`` says of one shard."""

    records: int
    bytes: int
    sha256: str | None
    manifest: str


class Manifests:
    """The manifest entries of shards, read once per folder (local) or folder URL (remote)."""

    def __init__(self, source_options: SourceOptions | None = None) -> None:
        self._source_options = source_options or SourceOptions()
        self._folders: dict[str, dict[str, ManifestEntry]] = {}
        self._warned: set[str] = set()

    def entry(self, url: str, *, fetch: bool = True) -> ManifestEntry | None:
        """The manifest entry of shard ``url``, or None. Without ``fetch``, a remote folder's
        manifest is not asked for here (only one already read answers)."""
        if scheme_of(url) == "pipe":
            return None
        if is_local(url):
            path = os.path.abspath(local_path(url))
            folder, name = os.path.split(path)
            entries = self._folders.get(folder)
            if entries is None:
                entries = self._folders[folder] = local_entries(folder)
            found = entries.get(name)
            if found is not None:
                self._check_size(url, path, found)
            return found
        folder, _, name = url.split("?", 1)[0].rpartition("/")
        key = f"{folder}/{manifest_name_for(name)}"
        entries = self._folders.get(key)
        if entries is None:
            if not fetch:
                return None
            entries = self._folders[key] = remote_entries(key, self._source_options)
        return entries.get(name)

    def _check_size(self, url: str, path: str, entry: ManifestEntry) -> None:
        try:
            size = os.path.getsize(path)
        except OSError:
            return  # the read names the missing shard
        if size != entry.bytes and url not in self._warned:
            self._warned.add(url)
            warnings.warn(
                ManifestMismatchWarning(
                    f"{url}: the shard is {size} bytes but the manifest {entry.manifest} says "
                    f"{entry.bytes}; the shard changed since it was written (an interrupted "
                    f"copy?): its {entry.records} records are checked as it is read"
                ),
                stacklevel=3,
            )


def manifest_name_for(shard_name: str) -> str:
    """The name ``shardmix convert`` gives the manifest of a shard called ``shard_name``.

    >>> manifest_name_for("train-000042.tar"), manifest_name_for("val_00001.tfrecord.gz")
    ('train.manifest.json', 'val.manifest.json')
    >>> manifest_name_for("000001.tar")
    'shards.manifest.json'
    """
    stem = shard_name.split(".", 1)[0]
    stem = re.sub(r"\d+$", "", stem).rstrip("-_.")
    return f"{stem or 'shards'}.manifest.json"


def local_entries(folder: str) -> dict[str, ManifestEntry]:
    """``{shard name: entry}`` from every manifest in ``folder`` (none: empty)."""
    found: dict[str, ManifestEntry] = {}
    for path, shard in manifest_shards(folder, "counting its shards instead"):
        _add_entry(found, path, shard)
    return found


def remote_entries(url: str, options: SourceOptions) -> dict[str, ManifestEntry]:
    """``{shard name: entry}`` from the manifest at ``url`` (one request; absent: empty)."""
    uncached = dataclasses.replace(options, cache_dir=None, cache_limit=None)  # read fresh
    try:
        with open_shard(url, options=uncached) as stream:
            data = stream.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        log.debug("no manifest at %s; the shards beside it are counted", url)
        return {}
    except (OSError, ShardmixError) as error:
        log.warning("could not read the manifest %s (%s); counting its shards instead", url, error)
        return {}
    found: dict[str, ManifestEntry] = {}
    if len(data) > MAX_MANIFEST_BYTES:
        log.warning("ignoring the manifest %s: over %d bytes", url, MAX_MANIFEST_BYTES)
        return found
    for shard in _shards_of(url, data, "counting its shards instead"):
        _add_entry(found, url, shard)
    return found


def _add_entry(found: dict[str, ManifestEntry], where: str, shard: Mapping[str, Any]) -> None:
    try:
        sha256 = shard.get("sha256")
        entry = ManifestEntry(
            int(shard["records"]),
            int(shard["bytes"]),
            None if sha256 is None else str(sha256),
            where,
        )
        found[str(shard["name"])] = entry
    except (KeyError, TypeError, ValueError) as error:
        log.warning("ignoring an entry of manifest %s (%s)", where, error)


def manifest_shards(folder: str, ignored: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(manifest path, shard entry)`` for each shard the manifests in ``folder`` list.

    A manifest that cannot be read, or is of another version, is skipped with a warning that
    ends in ``ignored`` (what its absence costs).
    """
    for path in sorted(glob.glob(os.path.join(glob.escape(folder), "*.manifest.json"))):
        try:
            with open(path, "rb") as file:
                data = file.read()
        except OSError as error:
            log.warning("ignoring manifest %s (%s); %s", path, error, ignored)
            continue
        for shard in _shards_of(path, data, ignored):
            yield path, shard


def _shards_of(where: str, data: bytes, ignored: str) -> list[Mapping[str, Any]]:
    try:
        manifest = json.loads(data)
        if manifest.get("shardmix_manifest") != MANIFEST_VERSION:
            return []
        shards = list(manifest["shards"])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        log.warning("ignoring manifest %s (%s); %s", where, error, ignored)
        return []
    return [shard for shard in shards if isinstance(shard, Mapping) and "name" in shard]


def manifest_counts(folder: str) -> dict[str, tuple[int, int]]:
    """``{shard name: (records, bytes)}`` from the manifests in ``folder`` (none: empty)."""
    return {name: (e.records, e.bytes) for name, e in local_entries(folder).items()}
