"""The format registry: one reader and one writer side per :class:`Format`, looked up by format.

Built-in formats register when imported, which :func:`reader_for` and :func:`writer_for` do on
first use; as in fsspec, a second registration is refused unless ``clobber=True``. A record's
byte offset is where it starts (in the decompressed stream if gzip).
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO, Protocol, TypeVar, runtime_checkable

from shardmix.errors import UnsupportedURLError
from shardmix.formats._common import ShardRead
from shardmix.formats.blocks import LocatedSample, RecordBlock, RecordPosition
from shardmix.formats.options import ReadOptions
from shardmix.policy import DamageHandler


class Format(enum.Enum):
    """The shard formats shardmix reads and writes."""

    TAR = "tar"
    TFRECORD = "tfrecord"


_EXTENSIONS = {
    Format.TAR: (".tar", ".tar.gz", ".tgz"),
    Format.TFRECORD: (".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecords.gz"),
}
_SUFFIXES = [(suffix, fmt) for fmt, suffixes in _EXTENSIONS.items() for suffix in suffixes]

# Files written beside shards, never shards themselves.
NOT_SHARD_SUFFIXES = (".manifest.json", ".idx", ".index", "record-counts.json")

# The modules that register each built-in format's reader and writer when imported.
_MODULES = {Format.TAR: "shardmix.formats.tar", Format.TFRECORD: "shardmix.formats.tfrecord"}
_WRITER_MODULES = {fmt: f"{module}_writer" for fmt, module in _MODULES.items()}


def infer_format(url: str) -> Format:
    """The format a shard URL's extension names.

    >>> infer_format("s3://b/train-000001.tar").value
    'tar'
    >>> infer_format("data/x.tfrecord.gz").value
    'tfrecord'
    """
    path = url.split("?", 1)[0].lower()
    for suffix, fmt in sorted(_SUFFIXES, key=lambda item: -len(item[0])):
        if path.endswith(suffix):
            return fmt
    if path.endswith(NOT_SHARD_SUFFIXES):
        raise UnsupportedURLError(
            f"{url}: is a file kept beside shards (a manifest, an index or a count cache), "
            "not a shard; leave it out of the shard pattern",
            url=url,
        )
    known = ", ".join(suffix for suffix, _ in _SUFFIXES)
    raise UnsupportedURLError(
        f"{url}: cannot tell the shard format from the extension (known: {known}); "
        "pass format='tar' or format='tfrecord'",
        url=url,
    )


def is_gzipped(url: str) -> bool:
    """Whether the URL names a gzip-compressed shard (``.gz`` or ``.tgz``)."""
    return url.split("?", 1)[0].lower().endswith((".gz", ".tgz"))


class ShardReader(Protocol):
    """Reads one format's shards; holds its options only (cheap, immutable, picklable).

    Each call takes an open binary stream at the shard's start and its URL (for errors, and for
    gzip when the reader was not told). Record ``i`` is the ``i``-th record in the file, damaged
    ones included. Arguments are checked at the call; bytes are read as the result is iterated.
    Damage raises :class:`~shardmix.errors.CorruptShardError` (or ``TruncatedShardError``) naming
    URL, record and byte offset, or is reported to ``on_damage``: a damaged record with intact
    framing is dropped (its index missing) and reading goes on; lost framing ends the shard.
    """

    def records(
        self, stream: BinaryIO, url: str, read: ShardRead = ShardRead()
    ) -> Iterator[LocatedSample]:
        """Located samples of records ``[read.start, read.stop)``; those before are walked
        cheaply (framing only), and a seekable, uncompressed stream enters at ``read.entry``."""
        ...

    def records_wanted(
        self,
        stream: BinaryIO,
        url: str,
        wanted: Sequence[int],
        *,
        on_damage: DamageHandler | None = None,
    ) -> Iterator[LocatedSample]:
        """Located samples of the ``wanted`` records (ascending, unique), decoding only those;
        an index past the end is not yielded."""
        ...

    def records_at(
        self, stream: BinaryIO, url: str, positions: Sequence[RecordPosition]
    ) -> Iterator[LocatedSample]:
        """One located sample per ``(record, offset)`` of a seekable, uncompressed stream, each
        checked as a full read checks it (a stale offset: :class:`CorruptShardError`)."""
        ...

    def count(self, stream: BinaryIO, url: str) -> int:
        """The number of records in the shard, walking the framing only."""
        ...

    def index(
        self, stream: BinaryIO, url: str, every: int, on_damage: DamageHandler | None = None
    ) -> tuple[int, list[int]]:
        """As :meth:`count`, plus the offsets of records ``0, every, 2 * every, ...`` (for
        ``ShardRead.seek_from``); with ``on_damage``, lost framing is reported, not raised."""
        ...


@runtime_checkable
class BlockReader(ShardReader, Protocol):
    """A :class:`ShardReader` that can also give its records in :class:`RecordBlock` objects."""

    def blocks(
        self, stream: BinaryIO, url: str, read: ShardRead = ShardRead()
    ) -> Iterator[RecordBlock]:
        """The records :meth:`~ShardReader.records` gives, in blocks."""
        ...


ReaderFactory = Callable[[ReadOptions], ShardReader]
T = TypeVar("T")

_FACTORIES: dict[Format, ReaderFactory] = {}


def register_reader(fmt: Format, factory: ReaderFactory, *, clobber: bool = False) -> None:
    """Make ``factory`` (options to reader) the reader of ``fmt``; refuse a silent override."""
    _register(_FACTORIES, "reader", fmt, factory, clobber)


def _register(table: dict[Format, T], what: str, fmt: Format, entry: T, clobber: bool) -> None:
    known = table.get(fmt)
    if known is not None and known != entry and not clobber:
        raise ValueError(
            f"a {what} for format {fmt.value!r} is already registered ({known!r}); "
            "pass clobber=True to replace it"
        )
    table[fmt] = entry


def _registered(table: dict[Format, T], modules: dict[Format, str], what: str, fmt: Format) -> T:
    """``table``'s entry for ``fmt``, imported from its built-in module on first use."""
    if fmt not in table and fmt in modules:
        importlib.import_module(modules[fmt])
    if fmt not in table:
        raise ValueError(f"no {what} is registered for format {fmt!r}")
    return table[fmt]


def reader_for(fmt: Format, options: ReadOptions | None = None) -> ShardReader:
    """The reader of ``fmt`` with ``options`` (None: the defaults); imports a built-in format."""
    factory = _registered(_FACTORIES, _MODULES, "reader", fmt)
    return factory(ReadOptions() if options is None else options)


class ShardSampleWriter(Protocol):
    """One shard being written by ``shardmix convert``: ``records`` written so far, and
    ``bytes_written`` before compression (an index takes a record's offset from it)."""

    records: int
    bytes_written: int

    def write_sample(self, sample: Mapping[str, Any]) -> None:
        """Append one sample (``"__key__"`` and its fields, as convert loads them); one the
        format cannot hold raises :class:`~shardmix.errors.BadInputError`, nothing written."""
        ...

    def close(self) -> None:
        """Complete the shard (end-of-archive, gzip trailer); the stream is left open."""
        ...


class ShardWriterFormat(Protocol):
    """What ``shardmix convert`` needs of a format to write it and to plan its shards."""

    @property
    def end_size(self) -> int:
        """The bytes a finished shard with no records takes (before compression)."""
        ...

    def can_index(self, *, gzip: bool) -> bool:
        """Whether a shard written with ``gzip`` gets an index of record offsets."""
        ...

    def record_size(self, key: str, fields: Sequence[str], sizes: Sequence[int]) -> int:
        """The bytes (before compression) of a sample with these fields and value sizes: exact
        where the format allows, else an upper bound (what ``--max-bytes`` rolls on)."""
        ...

    def open(self, stream: BinaryIO, *, gzip: bool) -> ShardSampleWriter:
        """A writer of one shard onto ``stream`` (gzip-compressed when ``gzip``)."""
        ...


_WRITERS: dict[Format, ShardWriterFormat] = {}


def register_writer(fmt: Format, writer: ShardWriterFormat, *, clobber: bool = False) -> None:
    """Make ``writer`` the writer side of ``fmt``; refuse a silent override."""
    _register(_WRITERS, "writer", fmt, writer, clobber)


def writer_for(fmt: Format) -> ShardWriterFormat:
    """The writer side of ``fmt``; imports a built-in format's writer module."""
    return _registered(_WRITERS, _WRITER_MODULES, "writer", fmt)
