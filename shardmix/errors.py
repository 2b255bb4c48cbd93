"""The exceptions and warnings shardmix raises.

Every exception derives from :class:`ShardmixError` and from the builtin that fits it. Each
takes one message as its only positional argument, so that an exception raised in a DataLoader
worker is rebuilt in the main process with its type intact; the URL, byte offset and record
travel as keyword attributes and survive pickling.
"""

from __future__ import annotations

from typing import Any


class ShardmixError(Exception):
    """Root of every error shardmix raises."""

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        offset: int | None = None,
        record: int | None = None,
    ) -> None:
        super().__init__(message)
        self.url = url
        self.offset = offset
        self.record = record

    def __reduce__(self) -> tuple[Any, ...]:
        context = {"url": self.url, "offset": self.offset, "record": self.record}
        return (_rebuild, (type(self), str(self), context, getattr(self, "__notes__", None)))


def _rebuild(
    cls: type[ShardmixError], message: str, context: dict[str, Any], notes: list[str] | None
) -> ShardmixError:
    error = cls(message, **context)
    for note in notes or ():
        error.add_note(note)
    return error


class CorruptShardError(ShardmixError, ValueError):
    """A shard's bytes do not follow its format: bad checksum, damaged header, bad framing."""


class TruncatedShardError(CorruptShardError):
    """A shard ends in the middle of a record, a header or a member."""


class RecordCountError(CorruptShardError):
    """A shard holds more or fewer records than its manifest, the count cache or the plan says."""


class DecodeError(ShardmixError, ValueError):
    """A record is well framed but its payload cannot be decoded as asked."""


class DecodedSizeError(DecodeError):
    """A record would decode to more than its format's limit (``max_decoded_bytes``)."""


class TransformError(DecodeError):
    """A dataset's decode or transform raised on a sample; the original error is its cause."""


class ShardChangedError(ShardmixError, RuntimeError):
    """A shard's bytes are another version than the one a position, count or cache refers to."""


class CacheFullError(ShardmixError, OSError):
    """The disk of ``cache_dir`` is full; the partial copy was removed."""


class ShardNotFoundError(ShardmixError, FileNotFoundError):
    """A URL or pattern names no shard."""


class UnsupportedURLError(ShardmixError, ValueError):
    """A URL scheme or shard format that shardmix cannot read (or that is not enabled)."""


class ConfigError(ShardmixError, ValueError):
    """An option or combination of options that cannot work."""


class WorkerError(ShardmixError, RuntimeError):
    """A DataLoader worker died or stalled without raising a Python exception."""


class TooManySkipsError(ShardmixError, RuntimeError):
    """More damaged data was skipped than the error policy's ``max_skips`` allows."""


class UnknownLengthError(ShardmixError, TypeError):
    """``len()`` of a loader whose record counts cannot be known (a TypeError, as ``len()``)."""


class BadInputError(ShardmixError, OSError):
    """An input (file, row, record) that cannot be read or must not be written."""


class InputChangedError(ShardmixError, RuntimeError):
    """A convert input changed since the shards in the output folder were written from it."""


class OutputLinkError(ShardmixError, OSError):
    """A file convert writes in its output folder is a symbolic link (it is never followed)."""


class OutputFullError(ShardmixError, OSError):
    """The output folder's disk is full (or over quota); the partial file was deleted."""


class OutputBusyError(ShardmixError, BlockingIOError):
    """Another writer (convert, ShardWriter, ShardSink) is writing the same output prefix."""


class ShardmixWarning(UserWarning):
    """A deliberate degradation that the user should know about."""


class SkippedDataWarning(ShardmixWarning):
    """Damaged data was skipped under ``on_error="skip"`` (warned once per shard)."""


class EmptyShardWarning(ShardmixWarning):
    """A shard holds no records (an empty TFRecord file is valid but usually a mistake)."""


class ManifestMismatchWarning(ShardmixWarning):
    """A shard's size is not the one the manifest beside it names."""


class MissingShardWarning(ShardmixWarning):
    """A glob misses shards that the manifest beside them lists: they are gone, not read."""


class UnregisteredLoaderWarning(ShardmixWarning):
    """A MixingLoader iterated under an Accelerate ``Accelerator`` that would checkpoint
    without it, so that a resumed run would start its epoch over."""


class WorkerRestartWarning(ShardmixWarning):
    """A DataLoader worker hung at its fork and the epoch's workers were started again."""


class UnvalidatedShardWarning(ShardmixWarning):
    """A server gives no ETag or Last-Modified: a shard replaced by one of the same size
    cannot be detected."""


class RangesIgnoredWarning(ShardmixWarning):
    """A server answered a range request with the whole shard (one request per shard there)."""


def describe_position(url: str, *, offset: int | None = None, record: int | None = None) -> str:
    """The ``where`` part of an error message.

    >>> describe_position("a.tfrecord", offset=12, record=0)
    'a.tfrecord: record 0 at byte offset 12'
    >>> describe_position("a.tar", offset=1024)
    'a.tar: at byte offset 1024'
    """
    parts = [f"record {record}"] if record is not None else []
    if offset is not None:
        parts.append(f"at byte offset {offset}")
    return f"{url}: {' '.join(parts)}" if parts else url
