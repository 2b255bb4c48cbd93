"""What a conversion is asked to do: options, the output pattern, sizes and parts."""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass

from shardmix.errors import ConfigError, UnsupportedURLError
from shardmix.formats import Format, infer_format, is_gzipped

DEFAULT_MAX_BYTES = 1 << 30  # when neither max_records nor max_bytes is given

_UNITS = {"": 1, "b": 1}
_UNITS |= {f"{prefix}{b}": 1000**power for power, prefix in enumerate("kmgt", 1) for b in ("", "b")}
_UNITS |= {f"{prefix}ib": 1 << 10 * power for power, prefix in enumerate("kmgt", 1)}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")
_DIRECTIVE = re.compile(r"%(0?)(\d*)d")


def parse_size(text: str) -> int:
    """Bytes from ``"512MiB"``, ``"1GB"``, ``"100k"`` or ``"4096"`` (SI and binary units).

    >>> parse_size("1GB"), parse_size("512MiB"), parse_size("1.5k")
    (1000000000, 536870912, 1500)
    """
    match = _SIZE.match(text.lower())
    if match is None or match.group(2) not in _UNITS:
        raise ConfigError(
            f"cannot read {text!r} as a size; write a number with an optional unit "
            f"({', '.join(unit for unit in _UNITS if unit)}), e.g. 1GB or 512MiB"
        )
    value = int(float(match.group(1)) * _UNITS[match.group(2)])
    if value <= 0:
        raise ConfigError(f"size {text!r} must be positive")
    return value


@dataclass(frozen=True)
class Part:
    """Part ``index`` of ``count``: which share of the input one run converts.

    >>> Part.parse("1/4")
    Part(index=1, count=4)
    """

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ConfigError(
                f"part {self.index}/{self.count} does not exist: write I/N with 0 <= I < N"
            )

    @classmethod
    def parse(cls, text: str) -> Part:
        index, slash, count = text.partition("/")
        if not slash or not index.strip().isdigit() or not count.strip().isdigit():
            raise ConfigError(f"cannot read part {text!r}; write I/N, e.g. 0/4")
        return cls(int(index), int(count))

    @property
    def tag(self) -> str:
        """The part's name segment: ``p0001`` (wider when ``count`` needs it)."""
        width = max(4, len(str(self.count - 1)))
        return f"p{self.index:0{width}d}"


@dataclass(frozen=True)
class TokenOptions:
    """A tokenized conversion (:mod:`shardmix.convert.tokenize`): the local ``tokenizer.json``,
    the text's field, whether to append the EOS id (``eos_token``, else the tokenizer's), and
    the fields a record keeps beside its tokens (the text only if named)."""

    tokenizer: str
    text_column: str = "text"
    append_eos: bool = False
    eos_token: str | None = None
    keep_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.keep_columns, str):
            raise ConfigError("keep_columns must be a sequence of column names, not a str")
        object.__setattr__(self, "keep_columns", tuple(self.keep_columns))
        if self.eos_token is not None and not self.append_eos:
            raise ConfigError("eos_token names the id --append-eos appends: pass append_eos too")
        if {"tokens", "tokens.npy"} & set(self.keep_columns):
            raise ConfigError("a kept column cannot be named tokens: that is the tokens' field")


class LabelMode(enum.Enum):
    """Whether the first subfolder level of a folder input names each sample's class."""

    AUTO = "auto"  # class labels when every file sits in a subfolder of the input folder
    SUBFOLDER = "subfolder"  # always (files directly in the input folder are an error)
    NONE = "none"  # never


@dataclass(frozen=True)
class OutputPattern:
    """An output pattern such as ``out/train-%06d.tar``: one ``%d`` directive in the file name;
    a part's tag goes before the number (``train-p0001-000003.tar``), the manifest is named after
    the prefix (``train.manifest.json``, ``train-p0001.manifest.json``)."""

    folder: str
    prefix: str
    width: int
    suffix: str

    @classmethod
    def parse(cls, pattern: str) -> OutputPattern:
        folder, name = os.path.split(pattern)
        matches = list(_DIRECTIVE.finditer(name))
        if len(matches) != 1 or "%" in _DIRECTIVE.sub("", name) or "%" in folder:
            raise ConfigError(
                f"output pattern {pattern!r} needs exactly one %d directive in its file name "
                "(and no other %), e.g. out/train-%06d.tar"
            )
        match = matches[0]
        width = int(match.group(2) or 0) if match.group(1) else 0
        return cls(
            os.path.abspath(folder or "."), name[: match.start()], width, name[match.end() :]
        )

    def shard_name(self, index: int, part: Part) -> str:
        number = f"{index:0{self.width}d}"
        if part.count > 1:
            number = f"{part.tag}-{number}"
        return f"{self.prefix}{number}{self.suffix}"

    def shard_regex(self, part: Part) -> re.Pattern[str]:
        """Matches this part's shard names (any number of digits)."""
        tag = re.escape(part.tag + "-") if part.count > 1 else ""
        return re.compile(f"{re.escape(self.prefix)}{tag}\\d+{re.escape(self.suffix)}")

    def existing(self, part: Part) -> list[str]:
        """The names in the folder of this part's shards and their indexes, sorted."""
        regex = self.shard_regex(part)
        return sorted(
            name for name in os.listdir(self.folder) if regex.fullmatch(name.removesuffix(".idx"))
        )

    def manifest_name(self, part: Part | None) -> str:
        stem = self.prefix.rstrip("-_.") or "shards"
        if part is not None and part.count > 1:
            stem = f"{stem}-{part.tag}"
        return f"{stem}.manifest.json"

    def format(self) -> Format:
        try:
            return infer_format(self.shard_name(0, Part()))
        except UnsupportedURLError as error:
            raise ConfigError(
                f"cannot tell the output format from {self.suffix!r}; pass --format tar|tfrecord"
            ) from error

    def gzipped(self) -> bool:
        return is_gzipped(self.suffix)


@dataclass(frozen=True)
class ConvertOptions:
    """How to convert; validated at construction.

    ``max_records`` and ``max_bytes`` (uncompressed) close a shard before the record that would
    pass either (docs/design/convert.md); with neither, shards roll at :data:`DEFAULT_MAX_BYTES`.
    ``format`` and ``gzip`` default to what the output pattern's extension says.
    """

    format: Format | None = None
    gzip: bool | None = None
    max_records: int | None = None
    max_bytes: int | None = None
    shuffle: bool = False
    seed: int = 0
    workers: int = 1
    part: Part = Part()
    skip_bad: bool = False
    overwrite: bool = False
    follow_links: bool = False
    labels: LabelMode = LabelMode.AUTO
    inline_columns: tuple[str, ...] = ()
    key_column: str | None = None
    write_index: bool = True
    tokens: TokenOptions | None = None  # tokenize each document's text (needs a tokenizer)

    def __post_init__(self) -> None:
        for name in ("max_records", "max_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"workers must be at least 1, got {self.workers!r}")
        if self.format is not None and not isinstance(self.format, Format):
            object.__setattr__(self, "format", Format(self.format))
        if not isinstance(self.labels, LabelMode):
            object.__setattr__(self, "labels", LabelMode(self.labels))
        if isinstance(self.inline_columns, str):
            raise ConfigError("inline_columns must be a sequence of column names, not a str")
        object.__setattr__(self, "inline_columns", tuple(self.inline_columns))

    def limits(self) -> tuple[int | None, int | None]:
        """``(max_records, max_bytes)`` with the default applied."""
        if self.max_records is None and self.max_bytes is None:
            return None, DEFAULT_MAX_BYTES
        return self.max_records, self.max_bytes
