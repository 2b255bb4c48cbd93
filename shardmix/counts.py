"""Record counts per shard: what equal steps per rank are planned from.

Counts come, in this order, from what the user gave, from a manifest that ``shardmix convert``
wrote beside local shards (``*.manifest.json``; an entry is used only while the shard's size
on disk still matches it), or from a counting pass that walks the shard's framing only (TFRecord
length fields, tar headers; payloads are seeked past, not decoded). Each shard is counted once
per process: the result is kept for the life of the :class:`RecordCounts`.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Mapping, Sequence

from shardmix.formats import Format, ReadOptions, reader_for
from shardmix.sources import SourceOptions, is_local, local_path, open_shard

MANIFEST_VERSION = 1

log = logging.getLogger(__name__)


def count_records(
    url: str,
    fmt: Format,
    options: ReadOptions = ReadOptions(),
    source_options: SourceOptions | None = None,
) -> int:
    """The number of records (samples) in one shard, by walking its framing (gzip inflated)."""
    with open_shard(url, options=source_options) as stream:
        return reader_for(fmt, options).count(stream, url)


class RecordCounts:
    """Record counts of a fixed shard list, counted on first use and then kept."""

    def __init__(
        self,
        urls: Sequence[str],
        formats: Mapping[str, Format],
        options: ReadOptions,
        known: Mapping[str, int] | None = None,
        source_options: SourceOptions | None = None,
    ) -> None:
        self._urls = list(urls)
        self._formats = formats
        self._options = options
        self._source_options = source_options
        self._counts: dict[str, int] = dict(known or {})
        self._manifests: dict[str, dict[str, tuple[int, int]]] = {}

    def of(self, url: str) -> int:
        """The record count of shard ``url``."""
        count = self._counts.get(url)
        if count is None and is_local(url):
            count = self._from_manifests(local_path(url))
        if count is None:
            count = count_records(url, self._formats[url], self._options, self._source_options)
            self._counts[url] = count
        return count

    def total(self, shard_indices: Sequence[int]) -> int:
        """The records in the shards ``shard_indices`` (indices into the shard list)."""
        return sum(self.of(self._urls[i]) for i in shard_indices)

    def _from_manifests(self, path: str) -> int | None:
        folder = os.path.dirname(os.path.abspath(path))
        known = self._manifests.get(folder)
        if known is None:
            known = self._manifests[folder] = manifest_counts(folder)
        entry = known.get(os.path.basename(path))
        if entry is None:
            return None
        records, size = entry
        try:
            current = os.path.getsize(path)
        except OSError:
            return None
        return records if current == size else None


def manifest_counts(folder: str) -> dict[str, tuple[int, int]]:
    """``{shard name: (records, bytes)}`` from the manifests in ``folder`` (none: empty)."""
    found: dict[str, tuple[int, int]] = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(folder), "*.manifest.json"))):
        try:
            with open(path, encoding="utf-8") as file:
                manifest = json.load(file)
            if manifest.get("shardmix_manifest") != MANIFEST_VERSION:
                continue
            for shard in manifest["shards"]:
                found[str(shard["name"])] = (int(shard["records"]), int(shard["bytes"]))
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("ignoring manifest %s (%s); counting its shards instead", path, error)
    return found
