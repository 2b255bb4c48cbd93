"""TFRecordWriter: TFRecord shards of raw payloads or ``tf.train.Example`` records.

Framed as TensorFlow writes them; :class:`TFRecordShardFormat` is the writer side for ``convert``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from shardmix.errors import BadInputError
from shardmix.formats._common import (
    KEY_FIELD,
    Closing,
    ShardOutput,
    reserved_field,
    reserved_message,
)
from shardmix.formats.example import encode_example
from shardmix.formats.registry import Format, register_writer
from shardmix.formats.tfrecord_framing import CRC, FOOTER_SIZE, HEADER_SIZE, LENGTH, masked_crc


class TFRecordWriter(Closing):
    """Write records to a TFRecord shard, optionally gzip-compressed (deterministic bytes).

    ``file`` is a path (opened, and closed by :meth:`close`) or a binary stream (left open).
    ``bytes_written`` counts framed bytes before compression.
    """

    def __init__(self, file: str | os.PathLike[str] | BinaryIO, *, gzip: bool = False) -> None:
        self._out = ShardOutput(file, gzip)
        self.records = 0
        self.bytes_written = 0
        self.closed = False

    def write(self, payload: bytes) -> None:
        """Append one record holding ``payload``."""
        if self.closed:
            raise ValueError("write to a closed TFRecordWriter")
        length = LENGTH.pack(len(payload))
        self._out.write(length + CRC.pack(masked_crc(length)))
        self._out.write(payload)
        self._out.write(CRC.pack(masked_crc(payload)))
        self.records += 1
        self.bytes_written += HEADER_SIZE + len(payload) + FOOTER_SIZE

    def write_example(self, features: Mapping[str, Any]) -> None:
        """Append one ``tf.train.Example`` record (a str ``"__key__"`` stored as a feature)."""
        reserved = reserved_field(features)
        if reserved is not None:
            raise ValueError(reserved_message(reserved, "feature"))
        key = features.get(KEY_FIELD)
        if key is not None and not isinstance(key, str):
            raise ValueError(f"__key__ must be a str, got {type(key).__name__}")
        self.write(encode_example(features))

    def write_sample(self, sample: Mapping[str, Any]) -> None:
        """Append one of convert's samples as an Example, else :class:`BadInputError`."""
        try:
            self.write_example(sample)
        except ValueError as error:
            raise BadInputError(f"sample {sample[KEY_FIELD]!r}: {error}", url=None) from error

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._out.close()


_EXAMPLE_SLACK = 24  # per feature: map entry, feature and list tags and length varints


@dataclass(frozen=True)
class TFRecordShardFormat:
    """The TFRecord writer side of ``shardmix convert`` (see :class:`ShardWriterFormat`)."""

    @property
    def end_size(self) -> int:
        return 0

    def can_index(self, *, gzip: bool) -> bool:
        """Uncompressed shards only: an index's offsets are where a reader seeks."""
        return not gzip

    def record_size(self, key: str, fields: Sequence[str], sizes: Sequence[int]) -> int:
        """An upper bound: the framing, the Example's features and its ``__key__`` feature."""
        features = sum(
            len(name) + size + _EXAMPLE_SLACK for name, size in zip(fields, sizes, strict=True)
        )
        key_feature = len(key.encode("utf-8", "surrogateescape")) + 7 + _EXAMPLE_SLACK
        return HEADER_SIZE + FOOTER_SIZE + 12 + features + key_feature

    def open(self, stream: BinaryIO, *, gzip: bool) -> TFRecordWriter:
        return TFRecordWriter(stream, gzip=gzip)


register_writer(Format.TFRECORD, TFRecordShardFormat())
