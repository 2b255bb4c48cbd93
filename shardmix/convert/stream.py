"""Writing shards from Python: :class:`ShardWriter` and :func:`write_shards`.

Samples a program makes, written as :func:`~shardmix.convert.convert` writes
(docs/guides/writing.md); a writer holds the prefix's lock until ``close()`` or ``abort()``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from shardmix.convert.api import ConvertSummary, finish_output, prepare_output, run_settings
from shardmix.convert.inputs import BadInputError, Item, Problems, check_key, sample_fields
from shardmix.convert.manifest import ShardEntry
from shardmix.convert.options import ConvertOptions, OutputPattern, Part
from shardmix.convert.outfiles import lock_output
from shardmix.convert.plan import PlanDigest, Roller
from shardmix.convert.tables import dataset_rows, is_hf_dataset
from shardmix.convert.values import cell_fields
from shardmix.convert.writer import ShardFile
from shardmix.errors import ConfigError
from shardmix.formats import KEY_FIELD
from shardmix.formats._common import MARKER_FIELDS, Closing, reserved_field, reserved_message

SOURCE = "<stream>"  # the source of every streamed sample, in messages and the plan digest


class ShardWriter(Closing):
    """Write samples one at a time into shards named by ``pattern``; ``close()`` finishes.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with ShardWriter(f"{folder}/s-%03d.tar", ConvertOptions(max_records=2)) as writer:
    ...     for number in range(3):
    ...         writer.write({"txt": f"sample {number}"})
    >>> writer.summary.shards, writer.summary.records, sorted(os.listdir(folder))
    (2, 3, ['s-000.tar', 's-001.tar', 's.manifest.json'])
    """

    def __init__(self, pattern: str, options: ConvertOptions | None = None) -> None:
        options = options or ConvertOptions()
        if options.shuffle or options.workers != 1:
            raise ConfigError(
                "a ShardWriter writes samples in the order given, in one process: found "
                f"shuffle={options.shuffle}, workers={options.workers}; shuffle the samples "
                "before writing, or list them for shardmix.convert.convert"
            )
        if options.tokens is not None:
            raise ConfigError(
                "a ShardWriter writes samples as given, untokenized: found tokens="
                f"{options.tokens!r}; tokenize with shardmix.convert.convert or "
                "shardmix convert --tokenizer"
            )
        self.options = options
        self.pattern = OutputPattern.parse(pattern)
        self.spec, settings = run_settings(self.pattern, options)
        settings |= {"seed": None, "classes": []}
        self._digest = PlanDigest(settings)
        chosen = {name: value for name, value in settings.items() if name != "part"}
        self._origin = {"inputs": None, "options": json.loads(json.dumps(chosen))}
        self._roller = Roller(self.spec.format, *options.limits())
        self._problems = Problems(options.skip_bad)
        os.makedirs(self.pattern.folder, exist_ok=True)
        manifest_path = os.path.join(self.pattern.folder, self.pattern.manifest_name(options.part))
        with lock_output(self.pattern, options.part, "ShardWriter") as lock:
            prepare_output(self.pattern, options, None, manifest_path)
            self._lock = lock.pop_all()  # held until close or abort
        self._position = 0
        self._keys: set[str] = set()
        self._shard: ShardFile | None = None
        self._entries: list[ShardEntry] = []
        self._started = time.perf_counter()
        self._closed = False
        self.summary: ConvertSummary | None = None  # set by close()

    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample (left out when another part owns its position)."""
        if self._closed:
            raise ConfigError(f"write() on a closed ShardWriter ({self.pattern.folder})")
        position = self._position
        self._position += 1
        part = self.options.part
        if position % part.count != part.index:
            return
        try:
            ready = self._prepared(position, sample)
        except BadInputError as error:
            self._problems.report(error)
            return
        names, sizes = sample_fields(ready)
        if self._roller.add(Item(ready[KEY_FIELD], SOURCE, names, sizes)) or self._shard is None:
            self._next_shard()
        assert self._shard is not None  # opened just above
        self._digest.item(ready[KEY_FIELD], SOURCE)
        self._shard.write(ready)

    def _prepared(self, position: int, sample: Mapping[str, Any]) -> dict[str, Any]:
        where = f"sample {position}"
        if not isinstance(sample, Mapping):
            raise BadInputError(
                f"{where}: expected a mapping of field names to values, found a "
                f"{type(sample).__name__}",
                url=SOURCE,
            )
        key = sample.get(KEY_FIELD, f"{position:08d}")
        if not isinstance(key, str):
            raise BadInputError(f"{where}: __key__ must be a str, found {key!r}", url=SOURCE)
        key = check_key(key, where)
        if key in self._keys:
            raise BadInputError(f"{where}: sample key {key!r} was already written", url=SOURCE)
        marker = reserved_field(map(str, sample), MARKER_FIELDS)
        if marker is not None:
            raise BadInputError(f"{where} (key {key!r}): {reserved_message(marker)}", url=SOURCE)
        ready: dict[str, Any] = {KEY_FIELD: key}
        for column, value in sample.items():
            if not str(column).startswith("__"):
                ready.update(cell_fields(str(column), value, f"{where} (key {key!r})"))
        self._keys.add(key)
        return ready

    def _next_shard(self) -> None:
        self._finish_shard()
        name = self.pattern.shard_name(len(self._entries), self.options.part)
        self._digest.shard(name)
        self._shard = ShardFile(name, self.spec, self._problems)

    def _finish_shard(self) -> None:
        if self._shard is not None:
            self._entries.append(self._shard.finish())
            self._shard = None

    def close(self) -> ConvertSummary:
        """Finish the last shard and write the manifest; the summary of the whole set."""
        if self.summary is not None:
            return self.summary
        self._closed = True
        part, digest = self.options.part, self._digest.hexdigest()
        with self._lock:
            self._finish_shard()
            summary = finish_output(
                self.pattern, part, self.spec, digest, (), self._entries, self._origin
            )
        self.summary = dataclasses.replace(
            summary,
            seconds=time.perf_counter() - self._started,
            skipped=tuple(self._problems.skipped),
        )
        return self.summary

    def abort(self) -> None:
        """Delete the shard being written; keep the finished ones; write no manifest."""
        self._closed = True
        with self._lock:
            if self._shard is not None:
                self._shard.discard()
                self._shard = None


def write_shards(
    samples: Iterable[Mapping[str, Any]] | Any,
    pattern: str,
    options: ConvertOptions | None = None,
    *,
    max_records: int | None = None,
    max_bytes: int | None = None,
    part: Part | str | None = None,
    overwrite: bool | None = None,
) -> ConvertSummary:
    """Write ``samples`` (any iterable of mappings, or a Hugging Face dataset) into shards; the
    keywords override the fields of ``options`` of the same name (``part`` may be ``"I/N"``)."""
    changes: dict[str, Any] = {"max_records": max_records, "max_bytes": max_bytes}
    changes |= {"overwrite": overwrite, "part": Part.parse(part) if isinstance(part, str) else part}
    given = {name: value for name, value in changes.items() if value is not None}
    options = dataclasses.replace(options or ConvertOptions(), **given)
    if is_hf_dataset(samples):
        samples = dataset_rows(samples)
    with ShardWriter(pattern, options) as writer:
        for sample in samples:
            writer.write(sample)
    assert writer.summary is not None  # set when the block ended without an exception
    return writer.summary
