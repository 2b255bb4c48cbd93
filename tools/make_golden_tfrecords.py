"""Write the TFRecord golden files in tests/golden/tfrecord/ with real TensorFlow.

Runs under a separate virtualenv that has TensorFlow (not a shardmix dependency)::

    python3 -m venv /work/tfvenv && /work/tfvenv/bin/pip install tensorflow-cpu
    /work/tfvenv/bin/python tools/make_golden_tfrecords.py [OUTPUT_DIR]

It writes, with ``tf.io.TFRecordWriter``:

- ``examples.tfrecord``: ``tf.train.Example`` records with int64, float and bytes features,
  including multi-value bytes, an empty bytes value, empty lists, a feature with no kind set,
  and one record that carries its own ``__key__`` feature;
- ``examples.tfrecord.gz``: the same records, GZIP-compressed by TensorFlow;
- ``raw.tfrecord``: records whose payloads are arbitrary bytes, not Examples;
- ``expected.json``: what each file holds, as TensorFlow reads it back. Features are
  ``{"kind": "int64" | "float" | "bytes" | "none", "value": [...]}``; floats are the values
  float32 rounds them to, bytes are hex strings. Keys are the ones shardmix must produce.

The output is small (a few KB) and committed; rerun only to change the golden set.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import tensorflow as tf

DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "tests" / "golden" / "tfrecord"


def _bytes(*values: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))


def _floats(*values: float) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


def _ints(*values: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def _examples() -> list[tf.train.Example]:
    """A handful of Examples covering every feature kind and the edge cases of each."""
    pattern = bytes(range(256))
    records: list[dict[str, tf.train.Feature]] = [
        {
            "__key__": _bytes(b"sample-zero"),
            "label": _ints(7),
            "score": _floats(0.1),
            "text": _bytes("héllo".encode()),
        },
        {
            "label": _ints(-1, 0, 2**62, -(2**63)),
            "score": _floats(1.5, -2.25, 3.4e38, 1e-40),
            "tags": _bytes(b"a", b"", b"\x00\xff"),
            "image": _bytes(pattern * 4),
        },
        {
            "label": _ints(),
            "score": _floats(),
            "tags": _bytes(),
            "unset": tf.train.Feature(),
        },
        {"only_bytes": _bytes(b"")},
        {},
    ]
    return [tf.train.Example(features=tf.train.Features(feature=f)) for f in records]


def _raw_payloads() -> list[bytes]:
    return [b"", b"not an example \xff\xfe", bytes(range(256)) * 3, b"\x00" * 17]


def _write(path: Path, payloads: list[bytes], options: str | None = None) -> None:
    with tf.io.TFRecordWriter(str(path), options=options) as writer:
        for payload in payloads:
            writer.write(payload)


def _read_back(path: Path, compression: str | None = None) -> list[bytes]:
    dataset = tf.data.TFRecordDataset(str(path), compression_type=compression)
    return [record.numpy() for record in dataset]


def _feature_json(feature: tf.train.Feature) -> dict[str, Any]:
    kind = feature.WhichOneof("kind")
    if kind == "int64_list":
        return {"kind": "int64", "value": [int(v) for v in feature.int64_list.value]}
    if kind == "float_list":
        # the protobuf field is float32; widen each value exactly for JSON
        values = tf.constant(list(feature.float_list.value), dtype=tf.float32).numpy()
        return {"kind": "float", "value": [float(v) for v in values]}
    if kind == "bytes_list":
        return {"kind": "bytes", "value": [v.hex() for v in feature.bytes_list.value]}
    return {"kind": "none", "value": []}


def _example_json(payload: bytes, stem: str, index: int) -> dict[str, Any]:
    example = tf.train.Example.FromString(payload)
    features = {name: _feature_json(f) for name, f in sorted(example.features.feature.items())}
    key = f"{stem}/{index:08d}"
    own_key = features.pop("__key__", None)
    if own_key is not None:
        key = bytes.fromhex(own_key["value"][0]).decode("utf-8")
    return {"__key__": key, "features": features}


def main(output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    examples = [example.SerializeToString() for example in _examples()]
    _write(output / "examples.tfrecord", examples)
    _write(output / "examples.tfrecord.gz", examples, options="GZIP")
    _write(output / "raw.tfrecord", _raw_payloads())

    plain = _read_back(output / "examples.tfrecord")
    gzipped = _read_back(output / "examples.tfrecord.gz", "GZIP")
    if plain != examples or gzipped != examples:
        raise SystemExit("TensorFlow did not read back what it wrote")
    expected = {
        "examples.tfrecord": {
            "payload": "example",
            "records": [_example_json(p, "examples", i) for i, p in enumerate(plain)],
        },
        "examples.tfrecord.gz": {
            "payload": "example",
            "records": [_example_json(p, "examples", i) for i, p in enumerate(gzipped)],
        },
        "raw.tfrecord": {
            "payload": "raw",
            "records": [
                {"__key__": f"raw/{i:08d}", "hex": p.hex()}
                for i, p in enumerate(_read_back(output / "raw.tfrecord"))
            ],
        },
        "generator": f"tools/make_golden_tfrecords.py with TensorFlow {tf.__version__}",
    }
    text = json.dumps(expected, indent=1, sort_keys=True) + "\n"
    (output / "expected.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT)
