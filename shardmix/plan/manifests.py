"""The manifests beside the shards: what each says about a shard, local or remote.

Beside local shards every ``*.manifest.json`` of the folder is read; beside remote ones, the one
name ``shardmix convert`` gives them (:func:`manifest_name_for`), once per folder and process.
What a manifest says is a claim: the read checks the count.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import json
import logging
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import braceexpand

from shardmix.errors import ManifestMismatchWarning, MissingShardWarning, ShardmixError
from shardmix.plan.urls import split_patterns
from shardmix.sources import SourceOptions, is_local, local_path, open_shard, scheme_of

MANIFEST_VERSION = 2  # convert.manifest's; version 1 (no token counts) reads too
MAX_MANIFEST_BYTES = 256 * 1024 * 1024  # a remote manifest larger than this is not read

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ManifestEntry:
    """What the manifest at ``manifest`` says of one shard."""

    records: int
    bytes: int
    sha256: str | None
    manifest: str
    tokens: int | None = None  # a tokenized conversion's


class Manifests:
    """The manifest entries of shards, read once per folder (local) or folder URL (remote)."""

    def __init__(self, source_options: SourceOptions | None = None) -> None:
        self._source_options = source_options or SourceOptions()
        self._folders: dict[str, dict[str, ManifestEntry]] = {}
        self._warned: set[str] = set()

    def entry(self, url: str, *, fetch: bool = True) -> ManifestEntry | None:
        """Shard ``url``'s manifest entry, or None (without ``fetch``: only from manifests read)."""
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
    return _entries(manifest_shards(folder, "counting its shards instead"))


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
    if len(data) > MAX_MANIFEST_BYTES:
        log.warning("ignoring the manifest %s: over %d bytes", url, MAX_MANIFEST_BYTES)
        return {}
    return _entries((url, shard) for shard in _shards_of(url, data, "counting its shards instead"))


def _entries(listed: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, ManifestEntry]:
    """``{shard name: entry}`` of ``(manifest, shard entry)`` pairs; one unreadable is logged."""
    found: dict[str, ManifestEntry] = {}
    for where, shard in listed:
        try:
            sha256 = shard.get("sha256")
            found[str(shard["name"])] = ManifestEntry(
                int(shard["records"]),
                int(shard["bytes"]),
                None if sha256 is None else str(sha256),
                where,
                None if shard.get("tokens") is None else int(shard["tokens"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            log.warning("ignoring an entry of manifest %s (%s)", where, error)
    return found


def manifest_shards(folder: str, ignored: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(manifest path, shard entry)`` for each shard the manifests in ``folder`` list; one
    unreadable, or of another version, is skipped, logged with ``ignored`` (what that costs)."""
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
        if manifest.get("shardmix_manifest") not in (1, MANIFEST_VERSION):
            return []
        shards = list(manifest["shards"])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        log.warning("ignoring manifest %s (%s); %s", where, error, ignored)
        return []
    return [shard for shard in shards if isinstance(shard, Mapping) and "name" in shard]


def missing_listed(urls: str | Sequence[str]) -> list[str]:
    """The local shards a manifest lists that a glob of ``urls`` would match, but are gone."""
    missing: list[str] = []
    patterns = [urls] if isinstance(urls, str) else list(urls)
    for part in [part for pattern in patterns for part in split_patterns(pattern)]:
        for url in braceexpand.braceexpand(part):
            if not is_local(url) or not set("*?[").intersection(url):
                continue
            path = local_path(url)
            parent = os.path.dirname(path)
            folders = glob.glob(parent) if set("*?[").intersection(parent) else [parent]
            for folder in sorted(folders):
                for name in local_entries(folder):
                    listed = os.path.join(folder, name)
                    if fnmatch.fnmatchcase(listed, path) and not os.path.exists(listed):
                        missing.append(listed)
    return list(dict.fromkeys(missing))


def warn_missing_listed(urls: str | Sequence[str]) -> None:
    """Warn, naming them, about the shards :func:`missing_listed` finds."""
    missing = missing_listed(urls)
    if missing:
        warnings.warn(
            MissingShardWarning(
                f"{len(missing)} shard(s) a manifest lists match the pattern but are gone, "
                f"and are not read: {', '.join(missing[:10])}"
                f"{' ...' if len(missing) > 10 else ''}; restore them, or re-create the "
                "manifest (`shardmix stat --verify` lists them)"
            ),
            stacklevel=3,
        )
