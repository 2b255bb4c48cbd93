"""Record counts per shard: what equal steps per rank are planned from.

Counts come from the shards themselves by a counting pass that walks the framing only (TFRecord
length fields, tar headers; payloads are seeked past, not decoded), once per shard and process:
the result is kept for the life of the :class:`RecordCounts`. Counts given by the user (from a
manifest, say) are taken as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shardmix.formats import Format, ReadOptions, is_gzipped
from shardmix.sources import SourceOptions, open_shard


def count_records(
    url: str,
    fmt: Format,
    options: ReadOptions = ReadOptions(),
    source_options: SourceOptions | None = None,
) -> int:
    """The number of records (samples) in one shard, by walking its framing."""
    with open_shard(url, options=source_options) as stream:
        if fmt is Format.TAR:
            from shardmix.formats.tar import count_tar_records

            return count_tar_records(stream, url, gzipped=is_gzipped(url))
        from shardmix.formats.compression import decompressed
        from shardmix.formats.tfrecord import count_tfrecord_records

        source = decompressed(stream, url) if is_gzipped(url) else stream
        return count_tfrecord_records(source, url, max_record_bytes=options.max_record_bytes)


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

    def of(self, url: str) -> int:
        """The record count of shard ``url``."""
        count = self._counts.get(url)
        if count is None:
            count = count_records(url, self._formats[url], self._options, self._source_options)
            self._counts[url] = count
        return count

    def total(self, shard_indices: Sequence[int]) -> int:
        """The records in the shards ``shard_indices`` (indices into the shard list)."""
        return sum(self.of(self._urls[i]) for i in shard_indices)
