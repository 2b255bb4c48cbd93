"""Ray Data in and out: write a Dataset as shards (:class:`ShardSink`), read shards as one,
convert inputs into shards on Ray (:func:`convert_on_ray`); the guarantees: docs/ray.md.

Samples travel as Python objects in one column (:data:`~shardmix.formats.SAMPLE_COLUMN`), whose
types an Arrow column per field would change.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import ray
import ray.data
from ray.data.block import Block, BlockAccessor, BlockMetadata
from ray.data.datasource import Datasink, Datasource, ReadTask

from shardmix.convert.api import InputLike, OutputExistsError, list_inputs
from shardmix.convert.inputs import Item, Problems, ShardCursor
from shardmix.convert.manifest import Manifest, ShardEntry, read_manifest, write_manifest
from shardmix.convert.options import ConvertOptions, OutputPattern, Part
from shardmix.convert.outfiles import lock_output
from shardmix.convert.plan import shuffled
from shardmix.convert.stream import ShardWriter
from shardmix.errors import ConfigError
from shardmix.formats import (
    KEY_FIELD,
    SAMPLE_COLUMN,
    SOURCE_KEY,
    Format,
    infer_format,
    read_samples,
)
from shardmix.plan.urls import expand_urls
from shardmix.sources import open_shard

__all__ = ["RayConvertSummary", "ShardSink", "convert_on_ray", "read_shards"]

ROWS_PER_BLOCK = 1024
_PRINTF = re.compile(r"%0?[0-9]*d")  # an output pattern's shard number, as ShardSink takes it


class ShardSink(Datasink[dict[str, Any]]):
    """A Ray Data sink writing tar or TFRecord shards named by ``pattern``
    (``out/train-%06d.tar``) and their manifest; ``max_records``/``max_bytes`` roll the shards."""

    def __init__(
        self,
        pattern: str,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        overwrite: bool = False,
    ) -> None:
        self.pattern = OutputPattern.parse(pattern)
        self.format = self.pattern.format()
        self.options = ConvertOptions(
            format=self.format, max_records=max_records, max_bytes=max_bytes
        )
        self.overwrite = overwrite
        self.manifest_path = os.path.join(self.pattern.folder, self.pattern.manifest_name(None))
        stem = self.pattern.manifest_name(None).removesuffix(".manifest.json")
        self.staging = os.path.join(self.pattern.folder, f".{stem}.staging-{uuid.uuid4().hex[:12]}")
        self._lock: ExitStack | None = None  # the prefix's, held by the driver while it writes

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lock": None}  # the driver's lock stays with the driver

    def on_write_start(self, schema: Any = None) -> None:
        os.makedirs(self.pattern.folder, exist_ok=True)
        self._lock = lock_output(self.pattern, Part(), "ShardSink")  # until the commit
        try:
            self._clean_output()
            os.makedirs(self.staging)
        except BaseException:
            self._release()
            raise

    def _clean_output(self) -> None:
        """Refuse existing output (unless ``overwrite``); delete what dead runs left staged."""
        ours = self._existing()
        if ours and not self.overwrite:
            manifest = ours[-1].endswith(".manifest.json")
            interrupted = "" if manifest else " (no manifest: an interrupted write)"
            raise OutputExistsError(
                f"{self.pattern.folder}: already holds {ours[0]} (and {len(ours) - 1} more) for "
                f"this pattern{interrupted}; pass overwrite=True to replace them, or choose "
                "another pattern",
                url=self.pattern.folder,
            )
        for name in ours:
            os.unlink(os.path.join(self.pattern.folder, name))
        stem = os.path.basename(self.staging).rsplit("-", 1)[0]
        for name in os.listdir(self.pattern.folder):
            if name.startswith(f"{stem}-"):  # no writer holds the lock: its run is dead
                shutil.rmtree(os.path.join(self.pattern.folder, name), ignore_errors=True)

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def write(self, blocks: Iterable[Block], ctx: Any) -> dict[str, Any]:
        task = int(ctx.task_idx)
        attempt = os.path.join(self.staging, f"task-{task:06d}-{uuid.uuid4().hex[:8]}")
        path = os.path.join(attempt, f"s-%06d{self.pattern.suffix}")
        with ShardWriter(path, self.options) as writer:
            position = 0
            for block in blocks:
                row: Any
                for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True):
                    sample = dict(row)
                    if SAMPLE_COLUMN in sample:
                        sample = dict(sample[SAMPLE_COLUMN])
                    key = sample.pop(KEY_FIELD, None) or f"t{task:06d}-{position:08d}"
                    writer.write({KEY_FIELD: key, **sample})
                    position += 1
        return {"task": task, "attempt": attempt, "manifest": "s.manifest.json"}

    def on_write_complete(self, write_result: Any) -> None:
        returns = sorted(write_result.write_returns, key=lambda result: result["task"])
        tasks = [result["task"] for result in returns]
        if len(set(tasks)) != len(tasks):
            raise ConfigError(f"{self.staging}: two results for one write task: {tasks}")
        entries: list[ShardEntry] = []
        index = False
        for result in returns:
            part = read_manifest(os.path.join(result["attempt"], result["manifest"]))
            index = part.index
            for shard in part.shards:
                name = self.pattern.shard_name(len(entries), Part())
                self._move(result["attempt"], shard.name, name, part.index)
                entries.append(ShardEntry(name, shard.records, shard.bytes, shard.sha256))
        digest = hashlib.sha256(json.dumps([e.sha256 for e in entries]).encode()).hexdigest()
        gzip = self.pattern.gzipped()
        manifest = Manifest(self.format.value, gzip, index, None, 1, digest, (), tuple(entries))
        write_manifest(self.manifest_path, manifest)
        shutil.rmtree(self.staging, ignore_errors=True)
        self._release()

    def on_write_failed(self, error: Exception) -> None:
        if self._lock is not None:  # a sink refused at its start has nothing of its own yet
            shutil.rmtree(self.staging, ignore_errors=True)
        self._release()

    def _move(self, attempt: str, staged: str, name: str, index: bool) -> None:
        folder = self.pattern.folder
        os.replace(os.path.join(attempt, staged), os.path.join(folder, name))
        if index and os.path.exists(os.path.join(attempt, staged + ".idx")):
            os.replace(os.path.join(attempt, staged + ".idx"), os.path.join(folder, name + ".idx"))

    def _existing(self) -> list[str]:
        names = self.pattern.existing(Part())
        if os.path.exists(self.manifest_path):
            names.append(os.path.basename(self.manifest_path))
        return names

    @property
    def supports_distributed_writes(self) -> bool:
        return False  # the shards go to a local folder, which the driver renames


def committed_shards(pattern: str) -> tuple[Manifest, list[str]]:
    """The manifest of an output pattern (or a manifest's path), and its shards' paths."""
    if pattern.endswith(".manifest.json"):
        path = pattern
    else:
        parsed = OutputPattern.parse(pattern)
        path = os.path.join(parsed.folder, parsed.manifest_name(None))
    if not os.path.exists(path):
        raise ConfigError(
            f"{path}: no manifest, so no committed shards: the write has not finished, or "
            "failed (a ShardSink writes the manifest last)"
        )
    manifest = read_manifest(path)
    folder = os.path.dirname(path)
    return manifest, [os.path.join(folder, shard.name) for shard in manifest.shards]


def _read_shard(url: str, fmt: Format) -> Iterator[pa.Table]:
    rows: list[dict[str, Any]] = []
    with open_shard(url) as stream:
        for sample in read_samples(stream, url, fmt):
            rows.append({**sample, SOURCE_KEY: url})
            if len(rows) == ROWS_PER_BLOCK:
                yield pa.Table.from_pylist(rows)
                rows = []
    if rows:
        yield pa.Table.from_pylist(rows)


@dataclass(frozen=True)
class _Shard:
    url: str
    format: Format
    records: int | None  # from a manifest, when there is one
    bytes: int | None


class _ShardsDatasource(Datasource):
    def __init__(self, shards: list[_Shard]) -> None:
        self.shards = shards

    def estimate_inmemory_data_size(self) -> int | None:
        sizes = [shard.bytes for shard in self.shards]
        return None if None in sizes else sum(size or 0 for size in sizes)

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        return [
            ReadTask(
                partial(_read_shard, shard.url, shard.format),
                BlockMetadata(
                    num_rows=shard.records,
                    size_bytes=shard.bytes,
                    exec_stats=None,
                    input_files=(shard.url,),
                ),
            )
            for shard in self.shards
        ]


def read_shards(urls: str | Sequence[str], *, format: str | None = None) -> ray.data.Dataset:
    """Shards as a Dataset, a read task per shard, a row per sample: ``urls`` and ``format`` as
    :class:`~shardmix.ShardDataset` takes them, or a :class:`ShardSink` output pattern or a
    manifest's path, which reads the committed shards (refused before the manifest is written).
    """
    if isinstance(urls, str) and (_PRINTF.search(urls) or urls.endswith(".manifest.json")):
        manifest, paths = committed_shards(urls)
        fmt = Format(manifest.format)
        shards = [
            _Shard(path, fmt, entry.records, entry.bytes)
            for path, entry in zip(paths, manifest.shards, strict=True)
        ]
    else:
        expanded = expand_urls(urls)
        forced = Format(format) if format is not None else None
        shards = [_Shard(url, forced or infer_format(url), None, None) for url in expanded]
    return ray.data.read_datasource(
        _ShardsDatasource(shards), override_num_blocks=max(1, len(shards))
    )


ITEMS_PER_TASK = 2048


@dataclass(frozen=True)
class RayConvertSummary:
    """What a conversion on Ray wrote."""

    shards: int
    records: int
    bytes: int
    seconds: float
    manifest: str
    skipped: list[str]
    left_out: dict[str, int]


def convert_on_ray(
    inputs: Sequence[InputLike],
    output: str,
    options: ConvertOptions | None = None,
    *,
    address: str | None = None,
) -> RayConvertSummary:
    """Convert ``inputs`` into the shards ``output`` names, reading and writing on Ray at
    ``address`` (``ray.init(address=...)``; None: the Ray joined, or a local one)."""
    options = options or ConvertOptions()
    if options.part != Part() or options.workers != 1:
        raise ConfigError(
            "--engine ray spreads the work itself: leave out --part and --workers (they are "
            "the local engine's)"
        )
    if options.tokens is not None:
        raise ConfigError("--engine ray does not tokenize: leave out --tokenizer (local engine)")
    began = time.monotonic()
    OutputPattern.parse(output)  # a bad pattern fails before Ray starts
    problems = Problems(options.skip_bad)
    listing = list_inputs(inputs, options, problems)
    items = listing.items
    if options.shuffle:
        items = shuffled(items, options.seed, Part())
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # the listing's order, in every run
    blocks = max(1, -(-len(items) // ITEMS_PER_TASK))
    held = ray.put(items)
    rows = ray.data.range(len(items), override_num_blocks=blocks)
    samples = rows.map_batches(
        _load_items,  # type: ignore[arg-type]  # the fn_kwargs argument is not in Ray's type
        fn_kwargs={"held": [held]},
        batch_size=ITEMS_PER_TASK,
        batch_format="numpy",
    )
    sink = ShardSink(
        output,
        max_records=options.max_records,
        max_bytes=options.max_bytes,
        overwrite=options.overwrite,
    )
    samples.write_datasink(sink)
    manifest, _ = committed_shards(output)
    return RayConvertSummary(
        shards=len(manifest.shards),
        records=manifest.records,
        bytes=manifest.bytes,
        seconds=time.monotonic() - began,
        manifest=os.path.abspath(sink.manifest_path),
        skipped=list(listing.skipped),
        left_out=dict(listing.left_out),
    )


def _load_items(batch: dict[str, np.ndarray], held: list[Any]) -> dict[str, Any]:
    """The samples of a read task's items, as objects in the sample column."""
    items: list[Item] = ray.get(held[0])
    cursor = ShardCursor()
    try:
        loaded = [items[int(i)].load(cursor) for i in batch["id"]]
    finally:
        cursor.close()
    column = np.empty(len(loaded), dtype=object)
    column[:] = loaded
    return {SAMPLE_COLUMN: column}
