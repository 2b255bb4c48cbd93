"""Reading options: how payloads become samples and the size limits checked before allocating."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from shardmix.formats.compression import DEFAULT_MAX_INFLATED_BYTES
from shardmix.formats.example_size import DEFAULT_MAX_DECODED_BYTES


class TFRecordPayload(enum.Enum):
    """How TFRecord payloads become samples."""

    EXAMPLE = "example"  # decode tf.train.Example features to numpy arrays and bytes
    RAW = "raw"  # keep the payload as bytes under the "record" field


_LIMITS = ("max_record_bytes", "max_member_bytes", "max_inflated_bytes", "max_decoded_bytes")


@dataclass(frozen=True)
class ReadOptions:
    """Per-format reading options, validated here: the limits below are checked before
    anything is allocated, and a record past one is damage.

    ``max_record_bytes``: a TFRecord record (1 GiB); ``max_member_bytes``: a tar member (1 GiB);
    ``max_inflated_bytes``: all a gzip shard inflates to (64 GiB); ``max_decoded_bytes``: what
    one ``tf.train.Example`` decodes to (256 MiB, read from the wire: a ``DecodedSizeError``).
    """

    tfrecord_payload: TFRecordPayload = TFRecordPayload.EXAMPLE
    max_record_bytes: int = 1 << 30
    max_member_bytes: int = 1 << 30
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES

    def __post_init__(self) -> None:
        for name in _LIMITS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
