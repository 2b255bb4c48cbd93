"""Record counts per shard: what balanced plans are made from, and where range reads seek.

Counts come from the user, a manifest, the count cache (while the shard's version matches) or
a counting pass over the framing, which also notes every :data:`INDEX_EVERY`-th record's
offset for range reads to seek to (docs/epochs.md). Torch-free: the collective that shares
counts between ranks is passed in. Every count is a claim the read checks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardmix.errors import ShardmixError
from shardmix.formats import Format, ReadOptions, RecordPosition, is_gzipped, reader_for
from shardmix.plan.manifests import Manifests, manifest_shards  # noqa: F401 (re-exported)
from shardmix.policy import Damage, DamageHandler
from shardmix.sources import SourceOptions, is_local, open_shard
from shardmix.sources.version import shard_version

CACHE_VERSION = 1
COUNTS_CACHE_NAME = "record-counts.json"  # in SourceOptions.cache_dir when no path is given
INDEX_EVERY = 16  # where a piece (a multiple of it) begins and ends: its read seeks there

# Every process's results, in rank order (``torch.distributed.all_gather_object``).
Exchange = Callable[[dict[str, Any]], list[dict[str, Any]]]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardCount:
    """A shard's record count, its sparse offset index, and the version it was counted at."""

    records: int
    index: tuple[int, ...] = ()  # byte offsets of records 0, every, 2 * every, ...
    every: int = INDEX_EVERY
    version: str | None = None

    def seek_from(self, start: int) -> RecordPosition | None:
        """The indexed ``(record, offset)`` nearest at or before record ``start``, if any.

        >>> ShardCount(200, (0, 900, 1800, 2700), every=64).seek_from(150)
        (128, 1800)
        >>> ShardCount(200).seek_from(150) is None
        True
        """
        if not self.index or start <= 0:
            return None
        entry = min(start // self.every, len(self.index) - 1)
        return entry * self.every, self.index[entry]

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "every": self.every,
            "index": list(self.index),
            "version": self.version,
        }

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> ShardCount:
        return cls(
            int(entry["records"]),
            tuple(int(offset) for offset in entry["index"]),
            int(entry["every"]),
            None if entry["version"] is None else str(entry["version"]),
        )


def count_records(
    url: str,
    fmt: Format,
    options: ReadOptions = ReadOptions(),
    source_options: SourceOptions | None = None,
) -> int:
    """The number of records (samples) in one shard, by walking its framing (gzip inflated)."""
    with open_shard(url, options=source_options) as stream:
        return reader_for(fmt, options).count(stream, url)


def index_records(
    url: str,
    fmt: Format,
    options: ReadOptions = ReadOptions(),
    source_options: SourceOptions | None = None,
    every: int = INDEX_EVERY,
    on_damage: DamageHandler | None = None,
) -> ShardCount:
    """One shard's count and sparse offset index (up to damage reported to ``on_damage``)."""
    cut: list[int] = []

    def report(damage: Damage) -> None:
        if damage.rest_of_shard and damage.record is not None:
            cut.append(damage.record)
        assert on_damage is not None
        on_damage(damage)

    with open_shard(url, options=source_options) as stream:
        handler = report if on_damage is not None else None
        records, index = reader_for(fmt, options).index(stream, url, every, handler)
    if cut:
        records = min(records, cut[0])
        index = [offset for entry, offset in enumerate(index) if entry * every < records]
    return ShardCount(records, tuple(index), every)


class RecordCounts:
    """Record counts of a fixed shard list, found on first use and kept (``cache_path``: for
    later jobs); a damaged shard is counted up to the damage, told to ``on_damage``, not cached."""

    def __init__(
        self,
        urls: Sequence[str],
        formats: Mapping[str, Format],
        options: ReadOptions,
        known: Mapping[str, int] | None = None,
        source_options: SourceOptions | None = None,
        cache_path: str | None = None,
        on_damage: DamageHandler | None = None,
    ) -> None:
        self._urls = list(urls)
        self._on_damage = on_damage
        self.damaged: set[str] = set()  # shards the counting pass found damaged
        self._formats = formats
        self._options = options
        self.source_options = source_options or SourceOptions()
        self._cache_path = cache_path
        self._counts: dict[str, ShardCount] = {
            url: ShardCount(int(records)) for url, records in (known or {}).items()
        }
        self._given = dict(known or {})
        self._sources = dict.fromkeys(self._given, "record_counts=")
        self.manifests = Manifests(self.source_options)
        self._cached: dict[str, ShardCount] | None = None
        self._shared = False  # resolve_all ran its exchange: every count is known
        # Counted again after a change (shardmix.plan.recount): ``{url: (count, its source)}``.
        self._recounted: dict[str, tuple[ShardCount, str]] = {}
        self._walked: dict[str, ShardCount] = {}  # indexed for seeking only (see seek_from)

    def known(self, url: str) -> int | None:
        """The count of ``url`` if given or in a manifest; never counted here (None then)."""
        again = self._recounted.get(url)
        count = self._given.get(url) if again is None else again[0].records
        if count is None:
            entry = self.manifests.entry(url)
            count = None if entry is None else entry.records
        return count

    def claim(self, url: str) -> tuple[int, str] | None:
        """``(records, where the count comes from)`` if known without a request, else None."""
        found = self._counts.get(url)
        if found is not None:
            return found.records, self._sources.get(url, "the plan")
        entry = self.manifests.entry(url, fetch=False)
        if entry is None:
            return None
        return entry.records, f"the manifest {entry.manifest}"

    def recount(self, url: str) -> ShardCount:
        """Count ``url`` again (it changed), the cache written; :meth:`adopt` makes it the count."""
        found = self._counted(url, self._version(url))
        self._save({url: found})
        return found

    def adopt(self, found: Mapping[str, ShardCount], source: str) -> None:
        """Make ``found`` the counts of their shards, ``source`` naming where they come from."""
        for url, entry in found.items():
            self._counts[url] = entry
            self._sources[url] = source
            self._recounted[url] = entry, source

    def recounts(self) -> dict[str, tuple[ShardCount, str]]:
        """The counts made again so far, with their sources (for older copies to adopt)."""
        return dict(self._recounted)

    def of(self, url: str) -> int:
        """The record count of shard ``url``."""
        found = self._counts.get(url)
        if found is None:
            resolved = self._resolve([url])
            self._save(resolved)
            found = self._counts[url] = resolved[url]
        return found.records

    def seek_from(self, url: str, start: int) -> RecordPosition | None:
        """Where a read of ``url`` from record ``start`` can seek to, if known (a local,
        uncompressed shard counted without an index is indexed here, once per process)."""
        found = self._counts.get(url)
        if found is not None and found.index:
            return found.seek_from(start)
        if start <= 0 or not is_local(url) or is_gzipped(url):
            return None
        walked = self._walked.get(url)
        if walked is None:
            options, source_options = self._options, self.source_options
            try:
                walked = index_records(url, self._formats[url], options, source_options)
            except ShardmixError:  # damaged: no index; its reads walk to the damage and name it
                walked = ShardCount(0)
            self._walked[url] = walked
        return walked.seek_from(start)

    def resolve_all(
        self, *, rank: int = 0, world_size: int = 1, exchange: Exchange | None = None
    ) -> list[int]:
        """Every shard's count, in URL order; with ``exchange`` (a collective), each found once."""
        if exchange is not None and not self._shared:
            distinct = list(dict.fromkeys(self._urls))
            mine = [url for url in distinct[rank::world_size] if url not in self._counts]
            resolved = self._resolve(mine)
            shared = {url: entry.to_json() for url, entry in resolved.items()}
            found: dict[str, ShardCount] = {}
            for part in exchange(shared):
                found.update((url, ShardCount.from_json(entry)) for url, entry in part.items())
            self._counts.update(found)
            self._save(found)
            self._shared = True
        return [self.of(url) for url in self._urls]

    def _resolve(self, urls: Sequence[str]) -> dict[str, ShardCount]:
        """Counts of ``urls``: from a manifest, the cache (when current), or by counting."""
        resolved: dict[str, ShardCount] = {}
        for url in urls:
            listed = self.manifests.entry(url)
            if listed is not None:
                resolved[url] = ShardCount(listed.records)
                self._sources[url] = f"the manifest {listed.manifest}"
                continue
            version = self._version(url)
            cached = self._cache().get(url) if version is not None else None
            if cached is not None and cached.version == version:
                resolved[url] = cached
                self._sources[url] = f"the count cache {self._cache_path}"
                continue
            resolved[url] = self._counted(url, version)
            self._sources[url] = "the counting pass"
        return resolved

    def _version(self, url: str) -> str | None:
        """The version a count of ``url`` is cached at (None: no cache)."""
        return None if self._cache_path is None else shard_version(url, self.source_options)

    def _counted(self, url: str, version: str | None) -> ShardCount:
        """``url`` counted at ``version`` (none after damage: counted and reported again)."""
        found = self._index(url)
        return dataclasses.replace(found, version=None if url in self.damaged else version)

    def _index(self, url: str) -> ShardCount:
        """Count ``url`` by walking its framing, damage reported to ``on_damage`` if given."""
        on_damage = self._on_damage
        handler = None
        if on_damage is not None:

            def handler(damage: Damage) -> None:
                self.damaged.add(url)
                on_damage(damage)

        options, source_options = self._options, self.source_options
        return index_records(url, self._formats[url], options, source_options, on_damage=handler)

    def _cache(self) -> dict[str, ShardCount]:
        if self._cached is None:
            self._cached = read_counts_cache(self._cache_path) if self._cache_path else {}
        return self._cached

    def _save(self, resolved: Mapping[str, ShardCount]) -> None:
        """Merge the newly counted shards of ``resolved`` into the cache file, if there is one."""
        path = self._cache_path
        if path is None:
            return
        cached = self._cache()
        new = {
            url: entry
            for url, entry in resolved.items()
            if entry.version is not None and cached.get(url) != entry
        }
        if new:
            merged = self._cached = {**read_counts_cache(path), **new}
            shards = {url: entry.to_json() for url, entry in sorted(merged.items())}
            document = {"shardmix_counts": CACHE_VERSION, "shards": shards}
            write_json_file(path, document, "the count cache")


def read_counts_cache(path: str) -> dict[str, ShardCount]:
    """``{url: ShardCount}`` from a count cache file (missing or unreadable: empty)."""
    shards = read_json_file(path, ("shardmix_counts", CACHE_VERSION), "shards", "the count cache")
    try:
        return {str(url): ShardCount.from_json(entry) for url, entry in shards.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        log.warning("ignoring the count cache %s (%s); counting the shards instead", path, error)
        return {}


def read_json_file(path: str, version: tuple[str, int], field: str, what: str) -> dict[str, Any]:
    """The dict under ``field`` of the JSON file at ``path`` if of ``version``, else empty."""
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
        if document.get(version[0]) != version[1]:
            return {}
        return dict(document[field])
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        log.warning("ignoring %s %s (%s)", what, path, error)
        return {}


def write_json_file(path: str, document: Any, what: str) -> None:
    """Write ``document`` to ``path`` through a temporary file renamed (never half-written);
    a failure is logged: a cache missed is slower, never wrong."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}-", dir=folder)
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(document, file)
        os.replace(temporary, path)
    except OSError as error:
        log.warning("could not write %s %s (%s)", what, path, error)
