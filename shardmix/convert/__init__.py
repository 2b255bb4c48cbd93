"""Convert datasets into tar or TFRecord shards: ``convert(inputs, pattern, options)``.

Inputs are folders of files, JSON Lines / CSV / Parquet tables, Hugging Face datasets, or
existing shards; the output is a set of shards named by a pattern such as
``out/train-%06d.tar``, with a JSON manifest beside them. :func:`write_shards` and
:class:`ShardWriter` write samples a program makes. Stages and design: docs/design/convert.md.
"""

from shardmix.convert.api import ConvertSummary, OutputExistsError, convert
from shardmix.convert.inputs import BadInputError
from shardmix.convert.manifest import (
    Manifest,
    ShardEntry,
    merge_manifests,
    merge_part_manifests,
    read_manifest,
)
from shardmix.convert.options import (
    ConvertOptions,
    LabelMode,
    OutputPattern,
    Part,
    TokenOptions,
    parse_size,
)
from shardmix.convert.stream import ShardWriter, write_shards
from shardmix.errors import InputChangedError, OutputBusyError, OutputFullError, OutputLinkError
from shardmix.formats import Format

__all__ = [
    "BadInputError",
    "ConvertOptions",
    "ConvertSummary",
    "Format",
    "InputChangedError",
    "LabelMode",
    "Manifest",
    "OutputBusyError",
    "OutputExistsError",
    "OutputFullError",
    "OutputLinkError",
    "OutputPattern",
    "Part",
    "ShardEntry",
    "ShardWriter",
    "TokenOptions",
    "convert",
    "merge_manifests",
    "merge_part_manifests",
    "parse_size",
    "read_manifest",
    "write_shards",
]
