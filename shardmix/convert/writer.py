"""Writing one planned shard: temporary name, checksum, TFRecord index, rename.

A shard under its final name is always complete; an interrupted run leaves at most
``.partial`` files, which the next run deletes (docs/design/convert.md, "The plan").
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import BinaryIO, cast

from shardmix.convert.inputs import BadInputError, Item, Problems, ShardCursor
from shardmix.convert.manifest import ShardEntry
from shardmix.convert.options import TokenOptions
from shardmix.convert.outfiles import create, naming_full, refuse_link
from shardmix.convert.plan import ShardPlan
from shardmix.convert.tokenize import DocumentTokenizer
from shardmix.formats import Format, Sample, ShardSampleWriter, writer_for

TEMP_SUFFIX = ".partial"


@dataclass(frozen=True)
class WriteSpec:
    """What every shard of a run shares (sent to worker processes)."""

    folder: str
    format: Format
    gzip: bool
    write_index: bool
    skip_bad: bool
    tokens: TokenOptions | None = None

    @property
    def indexed(self) -> bool:
        return self.write_index and writer_for(self.format).can_index(gzip=self.gzip)


@dataclass(frozen=True)
class ShardResult:
    entry: ShardEntry
    skipped: tuple[str, ...]


def temp_name(name: str) -> str:
    return f".{name}{TEMP_SUFFIX}"


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


def _loaded(
    plan: ShardPlan, cursor: ShardCursor, problems: Problems
) -> Iterator[tuple[Item, Sample]]:
    for item in plan.items:
        try:
            yield item, item.load(cursor)
        except BadInputError as error:
            problems.report(error)


class ShardFile:
    """One shard under its temporary name: :meth:`finish` renames it, :meth:`discard` deletes it."""

    def __init__(self, name: str, spec: WriteSpec, problems: Problems) -> None:
        self.name = name
        self.spec = spec
        self.problems = problems
        self._temp = os.path.join(spec.folder, temp_name(name))
        self._index_temp: str | None = None
        self._raw = create(self._temp)
        self._out = _HashingFile(self._raw)
        self._lines: list[str] = []
        self._tokens: list[int] | None = [] if spec.tokens is not None else None
        self._writer: ShardSampleWriter = writer_for(spec.format).open(
            cast(BinaryIO, self._out),  # the writers only write() and flush() it
            gzip=spec.gzip,
        )

    def write(self, sample: Sample, tokens: int = 0) -> None:
        """Append one sample (of ``tokens`` tokens); one the format cannot hold: ``problems``."""
        start = self._writer.bytes_written
        try:
            self._writer.write_sample(sample)
        except BadInputError as error:
            self.problems.report(error)
            return
        self._lines.append(f"{start} {self._writer.bytes_written - start}\n")
        if self._tokens is not None:
            self._tokens.append(tokens)

    def finish(self) -> ShardEntry:
        """Complete the shard, flush it to disk and rename it (and its index) into place."""
        self._writer.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        folder = self.spec.folder
        if self.spec.indexed:
            index = f"{self.name}.idx"
            self._index_temp = os.path.join(folder, temp_name(index))
            with create(self._index_temp) as raw:
                raw.write("".join(self._lines).encode("ascii"))
            refuse_link(os.path.join(folder, index))
            os.replace(self._index_temp, os.path.join(folder, index))
        refuse_link(os.path.join(folder, self.name))
        os.replace(self._temp, os.path.join(folder, self.name))
        entry = ShardEntry(
            self.name, self._writer.records, self._out.size, self._out.sha256.hexdigest()
        )
        if self._tokens is None:
            return entry
        return replace(entry, tokens=sum(self._tokens), record_tokens=tuple(self._tokens))

    def discard(self) -> None:
        """Close and delete the temporary file (after a failure)."""
        with contextlib.suppress(OSError):  # a full disk at the last flush: the file goes anyway
            self._raw.close()
        for temp in (self._temp, self._index_temp):
            if temp is not None and os.path.lexists(temp):
                os.unlink(temp)

    def __enter__(self) -> ShardFile:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None:
            self.discard()


def write_shard(
    plan: ShardPlan,
    spec: WriteSpec,
    cursor: ShardCursor,
    tokenizer: DocumentTokenizer | None = None,
) -> ShardResult:
    """Write one shard under its temporary name, then rename it (and its index) into place."""
    problems = Problems(spec.skip_bad)
    loaded = _loaded(plan, cursor, problems)
    records = (
        ((s, 0) for _, s in loaded) if tokenizer is None else tokenizer.records(loaded, problems)
    )
    path = os.path.join(spec.folder, plan.name)
    with naming_full(path), ShardFile(plan.name, spec, problems) as shard:
        for sample, tokens in records:
            shard.write(sample, tokens)
        entry = shard.finish()
    return ShardResult(entry, tuple(problems.skipped))


def write_shards(plans: list[ShardPlan], spec: WriteSpec) -> list[ShardResult]:
    """Write several shards in one process (a worker's task, or the whole run with one)."""
    cursor = ShardCursor()
    tokenizer = None if spec.tokens is None else DocumentTokenizer(spec.tokens, spec.format)
    try:
        return [write_shard(plan, spec, cursor, tokenizer) for plan in plans]
    finally:
        cursor.close()
