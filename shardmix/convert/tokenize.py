"""Tokenized conversions: each document's text becomes its token ids, a ``tokens`` field.

Texts are tokenized as each shard is written, :data:`BATCH` at a time, in every writer process;
a document without a text is a bad input (docs/design/convert.md, "Tokenized conversions").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from shardmix.convert.inputs import BadInputError, FileItem, Item, Problems, RecordItem, RowItem
from shardmix.convert.options import TokenOptions
from shardmix.errors import ConfigError
from shardmix.formats import KEY_FIELD, Format, Sample

BATCH = 1024  # texts per encode_batch call
EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[EOS]")


def eos_id(tokenizer: Any, options: TokenOptions) -> int:
    """The id of ``eos_token``, else of the one special token named like an EOS token."""
    name = options.eos_token
    if name is None:
        special = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special]
        found = [content for content in special if content in EOS_NAMES]
        if len(found) != 1:
            raise ConfigError(
                f"{options.tokenizer}: cannot tell the EOS token: expected one special token "
                f"among {list(EOS_NAMES)}, found {found or 'none'} (special tokens: "
                f"{special[:20]}); name it with --eos-token"
            )
        name = found[0]
    token = tokenizer.token_to_id(name)
    if token is None:
        raise ConfigError(
            f"{options.tokenizer}: the EOS token {name!r} is not in the tokenizer's vocabulary; "
            "name one that is with --eos-token"
        )
    return int(token)


def _place(item: Item) -> str:
    if isinstance(item, RowItem) and item.row is not None:
        return f"{item.source}: row {item.row}"
    if isinstance(item, RecordItem):
        return f"{item.source}: record {item.record}"
    return f"{item.source}: sample {item.key!r}"


class DocumentTokenizer:
    """Turns loaded samples into document records with one tokenizer, a batch at a time."""

    def __init__(self, options: TokenOptions, fmt: Format) -> None:
        self.options = options
        try:
            from tokenizers import Tokenizer
        except ImportError as error:
            raise ImportError(
                "tokenizing needs the tokenizers library; install it with "
                "pip install 'shardmix[tokens]'"
            ) from error
        try:
            self.tokenizer = Tokenizer.from_file(options.tokenizer)
        except Exception as error:  # tokenizers raises a bare Exception
            raise ConfigError(
                f"{options.tokenizer}: cannot load a tokenizer ({error}); pass a local "
                "tokenizer.json, as tokenizer.save() or a model folder holds it"
            ) from error
        top = max(self.tokenizer.get_vocab(with_added_tokens=True).values(), default=0)
        self.dtype = np.uint16 if top < 1 << 16 else np.uint32
        self.eos = eos_id(self.tokenizer, options) if options.append_eos else None
        self.field = "tokens.npy" if fmt is Format.TAR else "tokens"

    def settings(self) -> dict[str, object]:
        """The tokenization, as the plan's settings record it."""
        with open(self.options.tokenizer, "rb") as file:
            sha256 = hashlib.sha256(file.read()).hexdigest()
        chosen = {"tokenizer": sha256, "text_column": self.options.text_column, "eos": self.eos}
        return chosen | {"keep_columns": list(self.options.keep_columns)}

    def text(self, item: Item, sample: Sample) -> str:
        """The document's text, or the :class:`BadInputError` that names the input."""
        column = self.options.text_column
        value = sample.get(column)
        if value is None and isinstance(item, FileItem) and len(item.paths) == 1:
            value = sample[item.fields[0]]  # a folder's file is a document, whatever its extension
        if isinstance(value, str):
            return value
        if isinstance(value, bytes):
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError as error:
                found = f"bytes that are not UTF-8 ({error})"
        elif value is None:
            fields = sorted(name for name in sample if not name.startswith("__"))
            found = f"no such field (its fields: {fields}); name the text's with --text-column"
        else:
            found = f"a value of type {type(value).__name__}"
        raise BadInputError(
            f"{_place(item)}: expected a text in {column!r}, found {found}", url=item.source
        )

    def records(
        self, loaded: Iterable[tuple[Item, Sample]], problems: Problems
    ) -> Iterator[tuple[Sample, int]]:
        """``(record, token count)`` per loaded sample; one without a text goes to ``problems``."""
        batch: list[tuple[Sample, str]] = []
        for item, sample in loaded:
            try:
                batch.append((sample, self.text(item, sample)))
            except BadInputError as error:
                problems.report(error)
            if len(batch) == BATCH:
                yield from self._encoded(batch)
                batch = []
        yield from self._encoded(batch)

    def _encoded(self, batch: list[tuple[Sample, str]]) -> Iterator[tuple[Sample, int]]:
        encodings = self.tokenizer.encode_batch([text for _, text in batch]) if batch else []
        eos = [] if self.eos is None else [self.eos]
        for (sample, _), encoding in zip(batch, encodings, strict=True):
            tokens = np.array(encoding.ids + eos, dtype=self.dtype)
            record = {KEY_FIELD: sample[KEY_FIELD], self.field: tokens}
            record |= {name: sample[name] for name in self.options.keep_columns if name in sample}
            yield record, len(tokens)
