"""Inputs of a conversion: list every sample to write, cheaply, before anything is written.

An :class:`Item` is a small, picklable description of one sample, read by :meth:`Item.load`;
existing shards are listed here. :func:`check_key` refuses a key that would extract outside the
output folder; :class:`Problems` raises or counts bad inputs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from shardmix.errors import BadInputError, ShardmixError
from shardmix.formats import KEY_FIELD, Format, Sample, ShardRead, infer_format, reader_for
from shardmix.formats._common import samples_only
from shardmix.plan.urls import expand_urls
from shardmix.sources import open_shard

LABEL_FIELD = "cls"


class Problems:
    """Raise each input problem, or with ``skip_bad`` count it and go on."""

    def __init__(self, skip_bad: bool) -> None:
        self.skip_bad = skip_bad
        self.skipped: list[str] = []
        self.left_out: Counter[str] = Counter()  # inputs not written by rule, per reason

    def report(self, error: BadInputError) -> None:
        if not self.skip_bad:
            error.add_note("pass --skip-bad (skip_bad=True) to skip bad inputs and count them")
            raise error
        self.skipped.append(str(error))


def check_key(key: str, source: str) -> str:
    """``key`` when it is a safe relative member path, else :class:`BadInputError`.

    >>> check_key("cat/img001", "x")
    'cat/img001'
    """
    parts = key.split("/")
    if (
        not key
        or key.startswith("/")
        or "\x00" in key
        or "\\" in key
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise BadInputError(
            f"{source}: sample key {key!r} is not a plain relative path (absolute, empty part, "
            "'.', '..', backslash or NUL); it could name a file outside the output folder",
            url=source,
        )
    return key


def check_field(name: str, source: str) -> str:
    """``name`` unless it starts with ``__`` (reserved): then :class:`BadInputError`.

    >>> check_field("jpg", "x")
    'jpg'
    """
    if name.startswith("__"):
        raise BadInputError(
            f"{source}: field {name!r} starts with '__', which shardmix reserves for its own "
            "fields (__key__, __url__, __index__, ...); rename it or leave it out of the input",
            url=source,
        )
    return name


def value_size(value: Any) -> int:
    """The bytes a field value takes in a tar shard, as planning counts them."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogateescape"))
    if isinstance(value, (int, float)):
        return len(str(value))
    if hasattr(value, "nbytes"):
        return int(value.nbytes) * 3  # numpy arrays become text in a tar shard
    if isinstance(value, (list, tuple)):
        return sum(value_size(item) + 2 for item in value) + 2
    return len(json.dumps(value, default=str))


@dataclass(frozen=True)
class Item:
    """One sample to write: its key, field names and sizes, and where it comes from."""

    key: str
    source: str  # the path or URL it is read from, for messages
    fields: tuple[str, ...]
    sizes: tuple[int, ...]  # value_size of each field

    def load(self, cursor: ShardCursor) -> Sample:
        raise NotImplementedError


@dataclass(frozen=True)
class FileItem(Item):
    """A sample made of files sharing a path stem, plus its class label."""

    paths: tuple[str, ...]  # one per field; a label is the last field and has no path
    label: int | None = None

    def load(self, cursor: ShardCursor) -> Sample:
        sample: Sample = {KEY_FIELD: self.key}
        for name, path in zip(self.fields, self.paths, strict=False):
            sample[name] = read_file(path)
        if self.label is not None:
            sample[LABEL_FIELD] = self.label
        return sample


@dataclass(frozen=True)
class RowItem(Item):
    """A table row: its values, with the paths of inlined columns still to be read."""

    values: tuple[Any, ...]
    inline: frozenset[str] = field(default_factory=frozenset)
    row: int | None = None  # in its table or dataset, for messages

    def load(self, cursor: ShardCursor) -> Sample:
        sample: Sample = {KEY_FIELD: self.key}
        for name, value in zip(self.fields, self.values, strict=True):
            sample[name] = read_file(value) if name in self.inline else value
        return sample


@dataclass(frozen=True)
class RecordItem(Item):
    """A record of an existing shard."""

    format: Format
    record: int

    def load(self, cursor: ShardCursor) -> Sample:
        sample = cursor.read(self.source, self.format, self.record)
        sample[KEY_FIELD] = self.key
        return sample


def read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise BadInputError(f"{path}: cannot read the file: {error}", url=path) from error


class ShardCursor:
    """Reads records of input shards, cheaply when they are asked for in file order."""

    def __init__(self) -> None:
        self._url: str | None = None
        self._next = 0
        self._stream: BinaryIO | None = None
        self._samples: Iterator[Sample] = iter(())

    def read(self, url: str, fmt: Format, record: int) -> Sample:
        if url != self._url or record != self._next:
            self.close()
            self._stream = open_shard(url)
            self._samples = samples_only(
                reader_for(fmt).records(self._stream, url, ShardRead(record))
            )
            self._url = url
        try:
            sample = next(self._samples)
        except StopIteration:
            raise BadInputError(f"{url}: record {record} is gone", url=url) from None
        except (ShardmixError, OSError) as error:
            self.close()
            raise BadInputError(f"{url}: cannot read record {record}: {error}", url=url) from error
        self._next = record + 1
        return sample

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream, self._url, self._next = None, None, 0


@dataclass
class Listing:
    """What the inputs hold, in input order."""

    items: list[Item]
    classes: list[str]
    skipped: list[str]
    datasets: dict[str, str] = field(default_factory=dict)  # source: Arrow fingerprint
    left_out: dict[str, int] = field(default_factory=dict)  # reason: inputs not written


def sample_fields(sample: Sample) -> tuple[tuple[str, ...], tuple[int, ...]]:
    names = tuple(sorted(name for name in sample if not name.startswith("__")))
    return names, tuple(value_size(sample[name]) for name in names)


def list_shards(pattern: str, problems: Problems) -> Iterator[Item]:
    """The records of the shards a pattern names (read once to learn keys and sizes)."""
    for url in expand_urls(pattern):
        fmt = infer_format(url)
        try:
            with open_shard(url) as stream:
                for record, _, sample in reader_for(fmt).records(stream, url):
                    key = check_key(sample[KEY_FIELD], f"{url} record {record}")
                    names, sizes = sample_fields(sample)
                    yield RecordItem(key, url, names, sizes, fmt, record)
        except BadInputError as error:
            problems.report(error)
        except (ShardmixError, OSError) as error:
            problems.report(BadInputError(f"{url}: cannot read the shard: {error}", url=url))


def unique_keys(items: Sequence[Item], problems: Problems) -> list[Item]:
    """The items, without any whose key an earlier item already has."""
    seen: dict[str, Item] = {}
    for item in items:
        if item.key not in seen:
            seen[item.key] = item
            continue
        problems.report(
            BadInputError(
                f"{item.source}: sample key {item.key!r} was already taken by "
                f"{seen[item.key].source}; keys must be unique across all inputs",
                url=item.source,
            )
        )
    return list(seen.values())
