"""``convert()``: list the inputs, plan the shards, write what is missing, write the manifest.

Existing shards of the pattern are refused unless ``overwrite`` or they are the same
conversion, finished or interrupted (docs/design/convert.md, "Existing output").
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import astuple, dataclass
from typing import Any, Union

from shardmix.convert.folder import Found, list_folder
from shardmix.convert.identity import check_unchanged, fingerprints, write_inputs
from shardmix.convert.inputs import Item, Listing, Problems, list_shards, unique_keys
from shardmix.convert.manifest import (
    Journal,
    Manifest,
    ShardEntry,
    merge_part_manifests,
    read_manifest,
    write_manifest,
)
from shardmix.convert.options import ConvertOptions, OutputPattern, Part
from shardmix.convert.outfiles import beside, lock_output, refuse_link
from shardmix.convert.plan import ShardPlan, make_plan, plan_digest, set_origin
from shardmix.convert.tables import (
    is_hf_dataset,
    is_saved_dataset,
    is_table,
    list_dataset,
    list_table,
    load_saved,
)
from shardmix.convert.tokenize import DocumentTokenizer
from shardmix.convert.writer import TEMP_SUFFIX, ShardResult, WriteSpec, write_shards
from shardmix.errors import ShardmixError
from shardmix.workers.lifeline import die_with_parent

Progress = Callable[[int, int], None]
# A path, or a datasets.Dataset / IterableDataset (typed Any: datasets is optional).
InputLike = Union[str, "os.PathLike[str]", Any]


class OutputExistsError(ShardmixError, FileExistsError):
    """The output folder already holds shards of another conversion with this pattern."""


@dataclass(frozen=True)
class ConvertSummary:
    """What a conversion did."""

    shards: int  # shards in the finished set
    shards_written: int  # by this run (the rest were complete from an interrupted run)
    records: int
    bytes: int  # on disk, over the whole set
    seconds: float
    skipped: tuple[str, ...]  # one message per skipped input, row, record or file
    manifest: str
    merged_manifest: str | None = None
    left_out: dict[str, int] = dataclasses.field(default_factory=dict)  # reason: inputs
    tokens: int | None = None  # a tokenized conversion's, over the whole set

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


def list_inputs(
    inputs: Sequence[InputLike], options: ConvertOptions, problems: Problems
) -> Listing:
    """Every input's items, in input order, keys checked unique; folder classes unified."""
    if not inputs:
        raise ShardmixError("convert needs at least one input")
    items: list[Item] = []
    groups: list[tuple[list[Found], list[str]]] = []
    datasets: dict[str, str] = {}
    for position, given in enumerate(inputs):
        in_memory = is_hf_dataset(given)
        source = f"dataset input {position}" if in_memory else os.fspath(given)
        if in_memory or is_saved_dataset(source):
            dataset = given if in_memory else load_saved(source)
            rows, datasets[source] = list_dataset(dataset, source, options, problems)
            items.extend(rows)
        elif os.path.isdir(source):
            found, classes = list_folder(source, options.labels, options.follow_links, problems)
            groups.append((found, classes))
        elif is_table(source):
            items.extend(list_table(source, options, problems))
        else:
            items.extend(list_shards(source, problems))
    names = sorted({name for _, classes in groups for name in classes})
    label = {name: index for index, name in enumerate(names)}
    for found, _ in groups:
        for class_name, item in found:
            if class_name is not None:
                index = label[class_name]
                fields, sizes = item.fields + ("cls",), item.sizes + (len(str(index)),)
                item = dataclasses.replace(item, fields=fields, sizes=sizes, label=index)
            items.append(item)
    kept = unique_keys(items, problems)
    return Listing(kept, names, problems.skipped, datasets, dict(problems.left_out))


def _complete(folder: str, entry: ShardEntry) -> bool:
    path = os.path.join(folder, entry.name)
    return (
        not os.path.islink(path) and os.path.isfile(path) and os.path.getsize(path) == entry.bytes
    )


def prepare_output(
    pattern: OutputPattern,
    options: ConvertOptions,
    digest: str | None,
    manifest_path: str,
    inputs: dict[str, str] | None = None,
) -> dict[str, ShardEntry]:
    """Clean up after an interrupted run; the shards already complete for this plan, trusted
    only when ``inputs`` match the record beside the manifest (``digest`` None trusts none)."""
    folder = pattern.folder
    regex = pattern.shard_regex(options.part)
    manifest_name = os.path.basename(manifest_path)
    for name in os.listdir(folder):
        if name.startswith(".") and name.endswith(TEMP_SUFFIX):
            inner = name[1 : -len(TEMP_SUFFIX)]
            stem = inner.removesuffix(".idx")
            if regex.fullmatch(inner) or regex.fullmatch(stem) or inner.startswith(manifest_name):
                os.unlink(os.path.join(folder, name))
    journal = Journal(beside(manifest_path, "journal"))
    existing = pattern.existing(options.part)
    record = beside(manifest_path, "inputs")
    for path in (manifest_path, record, journal.path):
        refuse_link(path)
    if options.overwrite:
        for name in existing + [manifest_name, os.path.basename(record)]:
            if os.path.lexists(os.path.join(folder, name)):
                os.unlink(os.path.join(folder, name))
        journal.remove()
        return {}
    if digest is not None and os.path.exists(manifest_path):
        manifest = read_manifest(manifest_path)
        if manifest.plan == digest and all(_complete(folder, s) for s in manifest.shards):
            check_unchanged(record, inputs or {}, folder)
            return {shard.name: shard for shard in manifest.shards}
    elif digest is not None:
        done = journal.read(digest)
        if done is not None:
            check_unchanged(record, inputs or {}, folder)
            return {name: entry for name, entry in done.items() if _complete(folder, entry)}
    if existing or os.path.exists(manifest_path):
        raise OutputExistsError(
            f"{folder}: holds output of a different conversion with this pattern "
            f"({(existing or [manifest_name])[0]}, ...); pass --overwrite to replace it, or "
            "choose another output pattern",
            url=folder,
        )
    return {}


def _write_all(
    todo: list[ShardPlan], spec: WriteSpec, workers: int, on_result: Callable[[ShardResult], None]
) -> None:
    """Write the shards in this process or in a pool; ``on_result`` as each one completes."""
    if workers == 1 or len(todo) <= 1:
        for plan in todo:
            on_result(write_shards([plan], spec)[0])
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    # Each writer ends with this process, however it ends (a SIGKILL leaves no writer behind).
    with ProcessPoolExecutor(min(workers, len(todo)), context, initializer=die_with_parent) as pool:
        futures = [pool.submit(write_shards, [plan], spec) for plan in todo]
        try:
            for future in as_completed(futures):
                on_result(future.result()[0])
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def run_settings(
    pattern: OutputPattern, options: ConvertOptions
) -> tuple[WriteSpec, dict[str, object]]:
    """A run's write spec, and the settings its plan digest covers but the seed and classes."""
    fmt = options.format or pattern.format()
    gzip = pattern.gzipped() if options.gzip is None else options.gzip
    spec = WriteSpec(
        pattern.folder, fmt, gzip, options.write_index, options.skip_bad, options.tokens
    )
    settings: dict[str, object] = {"format": fmt.value, "gzip": gzip, "index": spec.indexed}
    return spec, settings | {"limits": options.limits(), "part": list(astuple(options.part))}


def convert(
    inputs: InputLike | Sequence[InputLike],
    output_pattern: str,
    options: ConvertOptions | None = None,
    *,
    progress: Progress | None = None,
) -> ConvertSummary:
    """Convert ``inputs`` (folders, tables, shards, Hugging Face datasets) into shards named
    by ``output_pattern``; ``progress(records written, records planned)`` as shards complete."""
    started = time.perf_counter()
    if isinstance(inputs, (str, os.PathLike)) or is_hf_dataset(inputs):
        inputs = [inputs]
    options = options or ConvertOptions()
    pattern = OutputPattern.parse(output_pattern)
    spec, settings = run_settings(pattern, options)
    if options.tokens is not None:  # loaded here: a bad tokenizer fails before the listing
        settings["tokens"] = DocumentTokenizer(options.tokens, spec.format).settings()
    listing = list_inputs(inputs, options, Problems(options.skip_bad))
    plans = make_plan(listing.items, pattern, spec.format, options)
    settings |= {"seed": options.seed if options.shuffle else None, "classes": listing.classes}
    digest = plan_digest(plans, settings)
    given = [str(i) if isinstance(i, (str, os.PathLike)) else "<dataset>" for i in inputs]
    origin = set_origin(given, listing.items, settings, options)
    os.makedirs(pattern.folder, exist_ok=True)
    with lock_output(pattern, options.part, "convert"):
        manifest_path = os.path.join(pattern.folder, pattern.manifest_name(options.part))
        found = fingerprints(plans, listing.datasets)
        done = prepare_output(pattern, options, digest, manifest_path, found)
        write_inputs(beside(manifest_path, "inputs"), found)
        journal = Journal(beside(manifest_path, "journal"))
        journal.start(digest, list(done.values()))
        entries, skipped = dict(done), list(listing.skipped)
        total = sum(len(plan.items) for plan in plans)
        written = sum(entry.records for entry in done.values())

        def on_result(result: ShardResult) -> None:
            nonlocal written
            journal.append(result.entry)
            entries[result.entry.name] = result.entry
            skipped.extend(result.skipped)
            written += result.entry.records
            if progress is not None:
                progress(written, total)

        todo = [plan for plan in plans if plan.name not in done]
        _write_all(todo, spec, options.workers, on_result)
        shards = [entries[plan.name] for plan in plans]
        summary = finish_output(
            pattern, options.part, spec, digest, listing.classes, shards, origin
        )
        journal.remove()
    return dataclasses.replace(
        summary,
        shards_written=len(todo),
        seconds=time.perf_counter() - started,
        skipped=tuple(skipped),
        left_out=listing.left_out,
    )


def finish_output(
    pattern: OutputPattern,
    part: Part,
    spec: WriteSpec,
    digest: str,
    classes: Sequence[str],
    shards: Sequence[ShardEntry],
    origin: dict[str, Any] | None = None,
) -> ConvertSummary:
    """Write the manifest of a finished set (and merge the parts' when all are done)."""
    manifest_path = os.path.join(pattern.folder, pattern.manifest_name(part))
    manifest = Manifest(
        spec.format.value,
        spec.gzip,
        spec.indexed,
        part.index if part.count > 1 else None,
        part.count,
        digest,
        tuple(classes),
        tuple(shards),
        origin,
    )
    write_manifest(manifest_path, manifest)
    merged = merge_part_manifests(pattern, part.count, required=False) if part.count > 1 else None
    return ConvertSummary(
        shards=len(shards),
        shards_written=len(shards),
        records=manifest.records,
        bytes=manifest.bytes,
        seconds=0.0,
        skipped=(),
        manifest=manifest_path,
        merged_manifest=merged,
        tokens=manifest.tokens,
    )
