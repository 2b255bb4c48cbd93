"""Writing one planned shard: temporary name, checksum, TFRecord index, rename.

A shard is written to ``.<name>.partial`` in the output folder (created exclusively, never
through a link), hashed (sha256) as it is written, flushed to disk and only then renamed to
its final name; so a shard under its final name is always complete, and an interrupted run
leaves at most ``.partial`` files, which the next run deletes. An uncompressed TFRecord shard
gets an index ``<name>.idx`` (text lines ``offset length``, one per record, the layout of the
``tfrecord`` package's ``tfrecord2idx``), renamed into place before its shard.

The rolling itself (which items go where) is :mod:`shardmix.convert.plan`'s; this module
writes exactly the items it is given, with the format writers of :mod:`shardmix.formats`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from shardmix.convert.inputs import KEY, BadInputError, Problems, Sample, ShardCursor
from shardmix.convert.manifest import ShardEntry
from shardmix.convert.plan import ShardPlan
from shardmix.formats import Format
from shardmix.formats.tar_writer import TarWriter
from shardmix.formats.tfrecord_writer import TFRecordWriter

TEMP_SUFFIX = ".partial"


@dataclass(frozen=True)
class WriteSpec:
    """What every shard of a run shares (sent to worker processes)."""

    folder: str
    format: Format
    gzip: bool
    write_index: bool
    skip_bad: bool

    @property
    def indexed(self) -> bool:
        return self.write_index and self.format is Format.TFRECORD and not self.gzip


@dataclass(frozen=True)
class ShardResult:
    entry: ShardEntry
    skipped: tuple[str, ...]


def temp_name(name: str) -> str:
    return f".{name}{TEMP_SUFFIX}"


def index_name(name: str) -> str:
    return f"{name}.idx"


class _HashingFile:
    """A write-only stream that hashes and counts what passes through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def _create(path: str) -> BinaryIO:
    """A new file at ``path``, replacing a leftover temporary file but never following a link."""
    if os.path.lexists(path):
        os.unlink(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    return os.fdopen(os.open(path, flags, 0o644), "wb")


def tar_value(key: str, field: str, value: Any) -> Any:
    """A field value as tar member data: bytes, str, int or float (arrays and lists as JSON)."""
    if isinstance(value, (bytes, str, int, float)):
        return value
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        value = value.tolist()
        if not isinstance(value, list):
            return value
        if len(value) == 1 and not isinstance(value[0], list):
            return value[0]
    if isinstance(value, (list, tuple)):
        if not value:
            return b""
        if all(isinstance(item, (str, int, float)) for item in value):
            return json.dumps(list(value))
    raise BadInputError(
        f"sample {key!r} field {field!r}: a {type(value).__name__} of several byte strings "
        "has no tar form; write it to TFRecord instead",
        url=key,
    )


def _loaded(plan: ShardPlan, cursor: ShardCursor, problems: Problems) -> Iterator[Sample]:
    for item in plan.items:
        try:
            yield item.load(cursor)
        except BadInputError as error:
            problems.report(error)


def _write_tar(
    out: _HashingFile, samples: Iterator[Sample], spec: WriteSpec, problems: Problems
) -> int:
    with TarWriter(out, gzip=spec.gzip) as writer:  # type: ignore[arg-type]
        for sample in samples:
            key = sample[KEY]
            fields = {name: tar_value(key, name, value) for name, value in sample.items()}
            try:
                writer.write(fields)
            except (ValueError, TypeError) as error:
                problems.report(BadInputError(f"sample {key!r}: {error}", url=key))
        return writer.records


def _write_tfrecord(
    out: _HashingFile, samples: Iterator[Sample], spec: WriteSpec, problems: Problems
) -> tuple[int, list[str]]:
    lines = []
    with TFRecordWriter(out, gzip=spec.gzip) as writer:  # type: ignore[arg-type]
        for sample in samples:
            start = writer.bytes_written
            try:
                writer.write_example(sample)
            except ValueError as error:
                problems.report(BadInputError(f"sample {sample[KEY]!r}: {error}", url=None))
                continue
            lines.append(f"{start} {writer.bytes_written - start}\n")
        return writer.records, lines


def write_shard(plan: ShardPlan, spec: WriteSpec, cursor: ShardCursor) -> ShardResult:
    """Write one shard under its temporary name, then rename it (and its index) into place."""
    problems = Problems(spec.skip_bad)
    final = os.path.join(spec.folder, plan.name)
    temp = os.path.join(spec.folder, temp_name(plan.name))
    samples = _loaded(plan, cursor, problems)
    lines: list[str] = []
    with _create(temp) as raw:
        out = _HashingFile(raw)
        if spec.format is Format.TAR:
            records = _write_tar(out, samples, spec, problems)
        else:
            records, lines = _write_tfrecord(out, samples, spec, problems)
        raw.flush()
        os.fsync(raw.fileno())
    if spec.indexed:
        index_temp = os.path.join(spec.folder, temp_name(index_name(plan.name)))
        with _create(index_temp) as raw:
            raw.write("".join(lines).encode("ascii"))
        os.replace(index_temp, os.path.join(spec.folder, index_name(plan.name)))
    os.replace(temp, final)
    entry = ShardEntry(plan.name, records, out.size, out.sha256.hexdigest())
    return ShardResult(entry, tuple(problems.skipped))


def write_shards(plans: list[ShardPlan], spec: WriteSpec) -> list[ShardResult]:
    """Write several shards in one process (a worker's task, or the whole run with one)."""
    cursor = ShardCursor()
    try:
        return [write_shard(plan, spec, cursor) for plan in plans]
    finally:
        cursor.close()
