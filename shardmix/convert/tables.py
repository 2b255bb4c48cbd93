"""Row inputs: JSON Lines, CSV, Parquet files and Hugging Face datasets, one sample per row.

Keys, CSV number columns, inlined files and datasets: docs/design/convert.md, "Table inputs".
pyarrow and datasets are imported only when a Parquet input or a saved dataset is listed.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from shardmix.convert.identity import ArrowDigest
from shardmix.convert.inputs import Item, Problems, RowItem, check_field, check_key, value_size
from shardmix.convert.options import ConvertOptions
from shardmix.convert.values import cell_fields
from shardmix.errors import BadInputError
from shardmix.formats import KEY_FIELD

_BATCH_ROWS = 1024
_INFO_FILES = ("dataset_info.json", "state.json")
TABLE_SUFFIXES = (".jsonl", ".ndjson", ".csv", ".tsv", ".parquet", ".pq")
Row = Mapping[str, Any]


def is_table(path: str) -> bool:
    return path.lower().endswith(TABLE_SUFFIXES)


def _jsonl_rows(path: str, problems: Problems) -> Iterator[Row]:
    with open(path, encoding="utf-8") as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
                if not isinstance(value, dict):
                    raise ValueError(f"expected a JSON object, found {type(value).__name__}")
            except ValueError as error:
                where = f"{path}: line {line_number}"
                problems.report(BadInputError(f"{where}: not a JSON object: {error}", url=path))
                continue
            yield value


def _csv_rows(path: str, problems: Problems) -> Iterator[Row]:
    delimiter = "\t" if path.lower().endswith(".tsv") else ","
    rows: list[dict[str, Any]] = []  # all of them first: a column's kind is all its values'
    with open(path, encoding="utf-8", newline="") as file:
        try:
            rows.extend(csv.DictReader(file, delimiter=delimiter))
        except (ValueError, csv.Error) as error:  # the rows before it are kept, as JSON Lines'
            problems.report(BadInputError(f"{path}: cannot read the table: {error}", url=path))
    kinds = {column: _number_kind(rows, column) for column in (rows[0] if rows else ())}
    for row in rows:
        yield {column: _cell(value, kinds.get(column)) for column, value in row.items()}


# A CSV number as JSON writes one: no sign but '-', no leading zero ('007' is text), no '_'.
_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def _number_kind(rows: list[dict[str, Any]], column: str) -> type | None:
    """``int`` or ``float`` when every non-empty value of ``column`` is one, else None (text).

    >>> _number_kind([{"a": "1"}, {"a": ""}, {"a": "-20"}], "a"), _number_kind([{"a": "1.5"}], "a")
    (<class 'int'>, <class 'float'>)
    >>> _number_kind([{"a": "007"}], "a") is None and _number_kind([{"a": ""}], "a") is None
    True
    """
    values = [row.get(column) for row in rows]
    texts = [value for value in values if isinstance(value, str) and value != ""]
    if not texts or len(texts) != sum(value != "" for value in values):
        return None
    if all(_INT.fullmatch(value) for value in texts):
        return int
    if all(_FLOAT.fullmatch(value) for value in texts):
        return float
    return None


def _cell(value: Any, kind: type | None) -> Any:
    """A CSV cell in its column's kind; an empty cell of a number column is null (left out)."""
    if kind is None:
        return value
    return None if value == "" else kind(value)


def _parquet_rows(path: str) -> Iterator[Row]:
    try:
        import pyarrow.parquet as parquet
    except ImportError as error:
        raise ImportError(
            f"{path}: reading Parquet needs pyarrow; install it with "
            "pip install 'shardmix[parquet]'"
        ) from error
    for batch in parquet.ParquetFile(path).iter_batches(batch_size=4096):
        yield from batch.to_pylist()


def _rows(path: str, problems: Problems) -> Iterator[Row]:
    lower = path.lower()
    if lower.endswith((".csv", ".tsv")):
        return _csv_rows(path, problems)
    if lower.endswith((".parquet", ".pq")):
        return _parquet_rows(path)
    return _jsonl_rows(path, problems)


class RowMaker:
    """Turns the rows of one table into items."""

    def __init__(
        self,
        path: str,
        options: ConvertOptions,
        problems: Problems,
        *,
        folder: str | None = None,
        stem: str | None = None,
    ) -> None:
        self.path = path  # or another name of the rows' source, for messages
        self.folder = os.path.realpath(folder or os.path.dirname(os.path.abspath(path)))
        self.stem = stem or os.path.basename(path).split(".", 1)[0]
        self.inline = frozenset(options.inline_columns)
        self.key_column, self.follow_links = options.key_column, options.follow_links
        self.problems = problems

    def key(self, index: int, row: Row) -> str:
        column = self.key_column or (KEY_FIELD if KEY_FIELD in row else None)
        if column is None:
            return f"{self.stem}/{index:08d}"
        value = row.get(column)
        if value is None or value == "":
            raise BadInputError(
                f"{self.path}: row {index} has no value in key column {column!r}", url=self.path
            )
        text = value.decode() if isinstance(value, bytes) else str(value)
        return check_key(text, f"{self.path} row {index}")

    def inline_path(self, index: int, value: Any) -> str:
        name = os.fsdecode(value) if isinstance(value, (str, bytes)) else None
        where = f"{self.path}: row {index}"
        if not name:
            raise BadInputError(f"{where}: an inlined column needs a file path", url=self.path)
        path = os.path.realpath(os.path.join(self.folder, name))
        if not self.follow_links and not path.startswith(self.folder + os.sep):
            raise BadInputError(
                f"{where}: inlined file {name!r} lies outside the table's folder {self.folder} "
                "(pass --follow-links to allow it)",
                url=self.path,
            )
        if not os.path.isfile(path):
            raise BadInputError(f"{where}: inlined file {name!r} does not exist", url=self.path)
        return path

    def item(self, index: int, row: Row) -> Item:
        key = self.key(index, row)
        fields, values, sizes = [], [], []
        for column in sorted(row):
            if column == KEY_FIELD or (column == self.key_column and column.startswith("__")):
                continue  # a key column named like a reserved field is the key, not a field
            check_field(column, f"{self.path}: row {index}")
            for name, value in cell_fields(column, row[column], f"{self.path}: row {index}"):
                inlined = self.inline_path(index, value) if name in self.inline else None
                fields.append(name)
                values.append(value if inlined is None else inlined)
                sizes.append(value_size(value) if inlined is None else os.path.getsize(inlined))
        missing = self.inline.difference(fields)
        if missing:
            raise BadInputError(
                f"{self.path}: row {index} has no value in inlined column(s) {sorted(missing)}",
                url=self.path,
            )
        return RowItem(
            key, self.path, tuple(fields), tuple(sizes), tuple(values), self.inline, index
        )


def list_table(path: str, options: ConvertOptions, problems: Problems) -> list[Item]:
    """The rows of one table file, as items."""
    items: list[Item] = []
    try:
        items.extend(row_items(RowMaker(path, options, problems), _rows(path, problems)))
    except BadInputError:
        raise
    except (OSError, ValueError, csv.Error) as error:  # the rows before it are kept
        problems.report(BadInputError(f"{path}: cannot read the table: {error}", url=path))
    return items


def row_items(maker: RowMaker, rows: Iterable[Row]) -> Iterator[Item]:
    """Rows as items; a bad row goes to the maker's ``problems``."""
    for index, row in enumerate(rows):
        try:
            yield maker.item(index, row)
        except BadInputError as error:
            maker.problems.report(error)


def is_hf_dataset(value: object) -> bool:
    """Whether ``value`` is a ``datasets.Dataset`` or ``datasets.IterableDataset``."""
    module = sys.modules.get("datasets")  # not imported: it cannot be one
    return module is not None and isinstance(value, (module.Dataset, module.IterableDataset))


def is_saved_dataset(path: str) -> bool:
    """Whether ``path`` is a folder written by ``Dataset.save_to_disk``."""
    names = os.listdir(path) if os.path.isdir(path) else []
    return any(name in names for name in _INFO_FILES) and any(n.endswith(".arrow") for n in names)


def load_saved(path: str) -> Any:
    """The ``datasets.Dataset`` saved in the folder ``path``."""
    try:
        import datasets
    except ImportError as error:
        raise ImportError(
            f"{path}: reading a saved Hugging Face dataset needs datasets; install it with "
            "pip install 'shardmix[hf]'"
        ) from error
    try:
        return datasets.load_from_disk(path)
    except (OSError, ValueError) as error:
        raise BadInputError(
            f"{path}: cannot load the saved Hugging Face dataset: {error}", url=path
        ) from error


def dataset_rows(dataset: Any, digest: ArrowDigest | None = None) -> Iterator[Row]:
    """A dataset's rows, undecoded (Image/Audio as ``{bytes, path}``); each Arrow batch goes
    through ``digest`` (when given) as it is read."""
    for batch in dataset.with_format("arrow").iter(batch_size=_BATCH_ROWS):
        if digest is not None:
            digest.update(batch)
        yield from batch.to_pylist()


def list_dataset(
    dataset: Any, source: str, options: ConvertOptions, problems: Problems
) -> tuple[list[Item], str]:
    """A dataset's rows as items, and its fingerprint; ``source`` names it in keys and messages."""
    saved = os.path.isdir(source)
    stem = os.path.basename(os.path.normpath(source)) if saved else "dataset"
    maker = RowMaker(source, options, problems, folder=source if saved else os.getcwd(), stem=stem)
    digest = ArrowDigest()
    items = list(row_items(maker, dataset_rows(dataset, digest)))
    return items, digest.fingerprint()
