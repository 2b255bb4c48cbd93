"""Tests for shardmix.reading.decode: golden tars from GNU tar and webdataset, safety, errors,
options."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import shardmix
from shardmix.batching.collate import collate_samples
from shardmix.errors import ConfigError, DecodeError
from shardmix.formats.example import decode_example, encode_example
from shardmix.reading.decode import Decoder, ImageOutput, as_decoder

import reads

GOLDEN = Path(__file__).parent.parent / "golden" / "decode"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())


def read_golden(name: str) -> list[dict[str, Any]]:
    """The golden tar's samples as shardmix's tar reader yields them, with a source."""
    with open(GOLDEN / name, "rb") as stream:
        return [{**sample, "__source__": name} for sample in reads.tar_samples(stream, str(name))]


def sha256(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def describe(name: str, value: Any, expected: Any) -> Any:
    """A decoded value in expected.json's terms (images and arrays by shape, dtype, content)."""
    if name.endswith("png"):
        return {
            "shape": list(value.shape),
            "dtype": str(value.dtype),
            "mode": expected["mode"],
            "sha256": sha256(value),
        }
    if name == "jpg":
        close = abs(float(value.mean()) - expected["mean"]) <= expected["tolerance"]
        return {
            **expected,
            "shape": list(value.shape),
            "dtype": str(value.dtype),
            "mean": expected["mean"] if close else float(value.mean()),
        }
    if name == "npy":
        return {"dtype": value.dtype.str, "shape": list(value.shape), "values": value.tolist()}
    return value


def png_bytes(array: np.ndarray, fmt: str = "PNG", **options: Any) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, fmt, **options)
    return buffer.getvalue()


def npy_bytes(array: np.ndarray, *, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


# -- golden tars --------------------------------------------------------------------------


@pytest.mark.parametrize("name", EXPECTED["files"])
def test_golden_tars_decode_as_expected(name: str) -> None:
    samples = read_golden(name)
    assert [sample["__key__"] for sample in samples] == [s["__key__"] for s in EXPECTED["samples"]]
    for sample, expected in zip(samples, EXPECTED["samples"], strict=True):
        decoded = Decoder()(sample)
        assert decoded["__source__"] == name
        assert set(decoded) == set(expected) | {"__source__"}
        got = {
            field: describe(field, value, expected.get(field))
            for field, value in decoded.items()
            if field != "__source__"
        }
        assert got == expected
        assert type(decoded["cls"]) is int and type(decoded["txt"]) is str


@pytest.mark.parametrize("name", EXPECTED["files"])
def test_golden_tars_decode_to_pil_and_torch(name: str) -> None:
    for sample, expected in zip(read_golden(name), EXPECTED["samples"], strict=True):
        pil = Decoder(images="pil")(sample)
        tensors = Decoder(images="torch")(sample)
        arrays = Decoder()(sample)
        for field in ("png", "seg.png", "jpg"):
            height, width = expected[field]["shape"][:2]
            assert isinstance(pil[field], Image.Image)
            assert (pil[field].mode, pil[field].size) == (expected[field]["mode"], (width, height))
            tensor = tensors[field]
            assert tensor.dtype == torch.uint8 and tensor.is_contiguous()
            channels = expected[field]["shape"][2] if len(expected[field]["shape"]) == 3 else 1
            assert tuple(tensor.shape) == (channels, height, width)
            chw = arrays[field] if arrays[field].ndim == 3 else arrays[field][..., np.newaxis]
            assert np.array_equal(tensor.permute(1, 2, 0).numpy(), chw)
        assert sha256(np.asarray(pil["png"])) == expected["png"]["sha256"]


def test_golden_tars_hold_the_same_samples() -> None:
    gnu, ours = (read_golden(name) for name in EXPECTED["files"])
    strip = [{k: v for k, v in s.items() if k != "__source__"} for s in gnu]
    assert strip == [{k: v for k, v in s.items() if k != "__source__"} for s in ours]


@pytest.mark.parametrize("name", EXPECTED["files"])
def test_golden_tars_decode_as_webdataset_decodes_them(name: str) -> None:
    """webdataset's own decoder ("rgb8" images) agrees on every field both decode alike."""
    from webdataset.autodecode import Decoder as WebdatasetDecoder
    from webdataset.autodecode import imagehandler

    theirs = WebdatasetDecoder([imagehandler("rgb8")])
    for sample in read_golden(name):
        ours, reference = Decoder()(sample), theirs(dict(sample))
        for field in ("cls", "txt", "json"):
            assert ours[field] == reference[field]
        for field in ("png", "jpg", "npy"):
            assert ours[field].dtype == reference[field].dtype
            assert np.array_equal(ours[field], reference[field])


def test_images_none_keeps_bytes() -> None:
    sample = read_golden("gnu.tar")[0]
    decoded = Decoder(images=None)(sample)
    assert decoded["png"] == sample["png"] and decoded["jpg"] == sample["jpg"]
    assert decoded["cls"] == 3


# -- what is decoded, and what is not ------------------------------------------------------


def test_extensions_are_case_insensitive_and_use_the_last_part() -> None:
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4)
    sample = {
        "__key__": "k",
        "CLS": b"4",
        "a.Seg.PNG": png_bytes(gray),
        "TXT": b"hi",
        "x.JSON": b"[1]",
        "Index": b"9",
        "ID": b" -2\n",
        "text": b"t",
    }
    decoded = Decoder()(sample)
    assert decoded["CLS"] == 4 and decoded["Index"] == 9 and decoded["ID"] == -2
    assert decoded["TXT"] == "hi" and decoded["text"] == "t" and decoded["x.JSON"] == [1]
    assert decoded["a.Seg.PNG"].shape == (3, 4, 1)
    assert np.array_equal(decoded["a.Seg.PNG"][:, :, 0], gray)


def test_unknown_and_provenance_fields_are_untouched_and_the_sample_is_not_changed() -> None:
    sample = {
        "__key__": "k",
        "__source__": "s.tar",
        "__index__": 3,
        "__offset__": 1536,
        "bin": b"\x00\x01",
        "png.bak": b"junk",
        "cls": b"1",
        "noext": b"5",
        "__cls__": b"x",
        "label": np.array([1, 2]),
    }
    before = dict(sample)
    decoded = Decoder()(sample)
    assert decoded is not sample and sample == before
    assert list(decoded) == list(sample)
    for name in ("__key__", "__source__", "__index__", "__offset__", "bin", "png.bak", "__cls__"):
        assert decoded[name] is sample[name]
    assert decoded["noext"] == b"5" and decoded["cls"] == 1


@pytest.mark.parametrize("field", ["pickle", "pyd", "pth", "x.pyd", "PICKLE"])
def test_pickled_fields_stay_bytes(field: str) -> None:
    payload = pickle.dumps(Exploding())
    assert Decoder()({"__key__": "k", field: payload})[field] == payload
    assert not Exploding.unpickled


def test_raw_fields_are_left_as_read() -> None:
    sample = {"__key__": "k", "id": b"abc-1", "cls": b"2"}
    assert Decoder(raw_fields={"id"})(sample) == {"__key__": "k", "id": b"abc-1", "cls": 2}


def test_memoryview_and_bytearray_values_decode() -> None:
    decoded = Decoder()({"cls": bytearray(b"5"), "txt": memoryview(b"ok")})
    assert decoded == {"cls": 5, "txt": "ok"}


# -- npy never unpickles ------------------------------------------------------------------


class Exploding:
    """Unpickling one records it: the tests check that it never happens."""

    unpickled = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (_mark_unpickled, ())


def _mark_unpickled() -> None:
    Exploding.unpickled = True


def test_npy_arrays_decode() -> None:
    array = np.arange(6, dtype=">i4").reshape(3, 2)
    decoded = Decoder()({"npy": npy_bytes(array)})["npy"]
    assert decoded.dtype == array.dtype and np.array_equal(decoded, array)


def test_npy_object_array_is_refused_and_never_unpickled() -> None:
    payload = npy_bytes(np.array([Exploding(), 1], dtype=object), allow_pickle=True)
    sample = {"__key__": "k7", "__source__": "s.tar", "x.npy": payload}
    with pytest.raises(DecodeError, match=r"field 'x\.npy' of sample 'k7' in s\.tar") as caught:
        Decoder()(sample)
    assert "without Python objects" in str(caught.value)
    assert isinstance(caught.value.__cause__, ValueError)
    assert not Exploding.unpickled


@pytest.mark.parametrize(
    "payload", [pickle.dumps(np.arange(3)), b"PK\x03\x04zip", b"\x93NUMPY\x01\x00trunc"]
)
def test_npy_that_is_not_a_plain_npy_is_refused(payload: bytes) -> None:
    with pytest.raises(DecodeError, match="expected a .npy array"):
        Decoder()({"__key__": "k", "npy": payload})


# -- errors -------------------------------------------------------------------------------


def test_corrupt_png_names_field_key_and_position() -> None:
    good = png_bytes(np.zeros((6, 8, 3), dtype=np.uint8))
    corrupt = good[:40] + b"\x00" * 8 + good[48:]
    sample = {
        "__key__": "shard3/r00007",
        "__source__": "data/train-0003.tar",
        "__index__": 7,
        "__offset__": 5120,
        "seg.png": corrupt,
    }
    with pytest.raises(DecodeError) as caught:
        Decoder()(sample)
    error = caught.value
    message = str(error)
    assert message.startswith(
        "cannot decode field 'seg.png' of sample 'shard3/r00007' in data/train-0003.tar "
        "(record 7 at byte offset 5120): expected an image (PNG, JPEG"
    )
    assert "found b'\\x89PNG\\r\\n\\x1a\\n" in message and f"({len(corrupt)} bytes;" in message
    assert "Decoder(raw_fields={'seg.png'})" in message
    assert error.__cause__ is not None and not isinstance(error.__cause__, DecodeError)
    assert (error.url, error.record, error.offset) == ("data/train-0003.tar", 7, 5120)
    assert isinstance(error, ValueError)
    rebuilt = pickle.loads(pickle.dumps(error))
    assert type(rebuilt) is DecodeError and str(rebuilt) == message


@pytest.mark.parametrize(
    ("field", "payload", "expected"),
    [
        ("cls", b"cat", "an integer in ASCII digits"),
        ("cls", b"", "an integer in ASCII digits"),
        ("index", b"1_000", "an integer in ASCII digits"),
        ("id", "\uff11".encode(), "an integer in ASCII digits"),
        ("txt", b"\xff\xfe", "UTF-8 text"),
        ("json", b"{bad", "a JSON document"),
        ("jpg", b"not an image at all, just some text", "an image"),
    ],
)
def test_undecodable_values_raise_decode_error(field: str, payload: bytes, expected: str) -> None:
    with pytest.raises(DecodeError, match=f"field '{field}' of sample 'k': expected {expected}"):
        Decoder()({"__key__": "k", field: payload})


def test_error_without_provenance_still_reads() -> None:
    with pytest.raises(DecodeError, match=r"^cannot decode field 'cls' of sample None: ") as caught:
        Decoder()({"cls": b"x" * 40})
    assert "b'xxxxxxxxxxxxxxxx'... (40 bytes" in str(caught.value)


def test_image_formats_outside_the_list_are_refused() -> None:
    """A mislabelled field never reaches other Pillow plugins (EPS would run Ghostscript)."""
    pcx = png_bytes(np.zeros((4, 4, 3), dtype=np.uint8), "PCX")
    assert Image.open(io.BytesIO(pcx)).format == "PCX"
    with pytest.raises(DecodeError, match="expected an image"):
        Decoder()({"__key__": "k", "png": pcx})


def test_missing_pillow_is_a_config_error_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ConfigError, match=r"pip install 'shardmix\[image\]'") as caught:
        Decoder()({"__key__": "k", "png": b"\x89PNG"})
    assert not isinstance(caught.value, DecodeError)
    assert Decoder(images=None)({"png": b"\x89PNG", "cls": b"1"}) == {"png": b"\x89PNG", "cls": 1}


# -- image modes ----------------------------------------------------------------------------


def test_colour_modes_become_rgb_and_grayscale_keeps_its_depth() -> None:
    rgba = np.zeros((2, 3, 4), dtype=np.uint8)
    rgba[..., 0], rgba[..., 3] = 200, 10
    wide = np.array([[0, 1000], [65535, 7]], dtype=np.uint16)
    bilevel = Image.new("1", (3, 2), 1)
    bilevel.putpixel((0, 0), 0)
    palette = Image.new("P", (2, 2), 1)
    palette.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
    with io.BytesIO() as pbm, io.BytesIO() as gif:
        bilevel.save(pbm, "PPM")
        palette.save(gif, "GIF")
        sample = {
            "rgba.png": png_bytes(rgba),
            "depth.png": png_bytes(wide),
            "mask.pbm": pbm.getvalue(),
            "p.gif": gif.getvalue(),
        }
    decoded = Decoder()(sample)
    assert decoded["rgba.png"].shape == (2, 3, 3)
    assert decoded["rgba.png"][0, 0].tolist() == [200, 0, 0]
    assert decoded["depth.png"].dtype == np.uint16 and decoded["depth.png"].shape == (2, 2, 1)
    assert np.array_equal(decoded["depth.png"][:, :, 0], wide)
    assert decoded["mask.pbm"].dtype == np.uint8
    assert decoded["mask.pbm"][:, :, 0].tolist() == [[0, 255, 255], [255, 255, 255]]
    assert decoded["p.gif"].shape == (2, 2, 3) and decoded["p.gif"][1, 1].tolist() == [10, 20, 30]
    pil = Decoder(images=ImageOutput.PIL)(sample)
    assert pil["rgba.png"].mode == "RGBA" and pil["p.gif"].mode == "P"
    depth = Decoder(images="torch")(sample)["depth.png"]
    assert tuple(depth.shape) == (1, 2, 2) and depth[0].numpy().tolist() == wide.tolist()


# -- scalars (TFRecord features) -------------------------------------------------------------


def test_scalars_turn_one_element_features_into_numpy_scalars() -> None:
    example = decode_example(
        encode_example({"label": 3, "score": 0.5, "tags": [1, 2], "text": "hi", "one": [b"x"]})
    )
    sample = {"__key__": "r0", "__index__": 0, **example}
    decoded = Decoder(scalars=True)(sample)
    assert type(decoded["label"]) is np.int64 and decoded["label"] == 3
    assert type(decoded["score"]) is np.float32 and decoded["score"] == np.float32(0.5)
    assert decoded["tags"] is sample["tags"] and decoded["text"] == "hi"
    assert decoded["one"] == b"x" and decoded["__index__"] == 0
    plain = Decoder()(sample)
    assert plain["label"] is sample["label"] and plain["score"] is sample["score"]
    batch = collate_samples([decoded, Decoder(scalars=True)({**sample, "__key__": "r1"})])
    assert batch["label"].shape == (2,) and batch["label"].dtype == torch.int64
    assert batch["score"].shape == (2,) and batch["score"].dtype == torch.float32


def test_scalars_leave_other_arrays_alone() -> None:
    sample = {
        "a": np.array([1], dtype=np.int32),
        "b": np.array([[1.0]], dtype=np.float32),
        "c": np.array([1.0]),
        "d": np.array([], dtype=np.int64),
    }
    decoded = Decoder(scalars=True)(sample)
    assert all(decoded[name] is sample[name] for name in sample)


# -- construction ---------------------------------------------------------------------------


def test_decoder_pickles_round_trip_and_compares_equal() -> None:
    decoder = Decoder(images="torch", scalars=True, raw_fields=["id"])
    copy = pickle.loads(pickle.dumps(decoder))
    assert copy == decoder and copy.images is ImageOutput.TORCH
    assert copy.raw_fields == frozenset({"id"})
    assert copy({"id": b"x", "cls": b"1"}) == {"id": b"x", "cls": 1}
    assert hash(copy) == hash(decoder)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"images": "jpeg"}, r"images must be one of 'numpy', 'pil', 'torch' or None, got 'jpeg'"),
        ({"images": True}, r"images must be one of .* got True"),
        ({"scalars": "yes"}, r"scalars must be True or False, got 'yes'"),
        ({"raw_fields": "id"}, r"raw_fields must be a collection of field names"),
        ({"raw_fields": 3}, r"raw_fields must be a collection of field names"),
        ({"raw_fields": [1]}, r"raw_fields must hold field names \(str\)"),
    ],
)
def test_bad_options_are_refused_at_construction(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Decoder(**kwargs)


def test_as_decoder() -> None:
    assert as_decoder(None) is None and as_decoder(False) is None
    assert as_decoder(True) == Decoder()
    assert as_decoder("pil") == Decoder(images="pil")
    assert as_decoder(ImageOutput.TORCH) == Decoder(images="torch")
    decoder = Decoder(scalars=True)
    assert as_decoder(decoder) is decoder
    for bad in ("jpeg", 1, 0, {"images": "pil"}):
        with pytest.raises(ConfigError, match="decode must be True, False, None, an image output"):
            as_decoder(bad)  # type: ignore[arg-type]


def test_decoder_is_exported() -> None:
    assert shardmix.Decoder is Decoder and "Decoder" in shardmix.__all__


def test_gzipped_fields_are_gunzipped_then_decoded_by_the_extension_before(tmp_path: Path) -> None:
    import gzip
    import tarfile

    fields = {
        "txt.gz": gzip.compress("héllo".encode()),
        "json.gz": gzip.compress(b'{"a": 1}') + gzip.compress(b""),  # two gzip members
        "cls.gz": gzip.compress(b"7"),
        "bin.gz": gzip.compress(b"raw"),
    }
    path = tmp_path / "g.tar"
    with tarfile.open(path, "w") as archive:
        for field, data in fields.items():
            info = tarfile.TarInfo(f"k.{field}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    (sample,) = shardmix.ShardDataset(str(path), decode=True)
    assert {name: sample[name] for name in fields} == {
        "txt.gz": "héllo",
        "json.gz": {"a": 1},
        "cls.gz": 7,
        "bin.gz": b"raw",
    }
    (raw,) = shardmix.ShardDataset(str(path))
    assert raw["txt.gz"] == fields["txt.gz"]


@pytest.mark.parametrize(
    ("data", "found"),
    [
        (b"not gzip", "incorrect header check"),
        (b"\x1f\x8b" + b"\x08\x00" + b"\x00" * 6 + b"\x03\x00", "cut short"),
    ],
)
def test_a_bad_gzipped_field_is_a_decode_error(data: bytes, found: str) -> None:
    with pytest.raises(DecodeError, match=rf"cannot decode field 'txt\.gz' of sample 'k'.*{found}"):
        Decoder()({"__key__": "k", "txt.gz": data})


def test_a_gzipped_field_past_the_bound_is_a_decode_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip

    import shardmix.reading.decode

    monkeypatch.setattr(shardmix.reading.decode, "MAX_GUNZIP_BYTES", 1000)
    assert Decoder()({"__key__": "k", "txt.gz": gzip.compress(b"a" * 1000)})["txt.gz"] == "a" * 1000
    with pytest.raises(DecodeError, match="at most 1000 bytes decompressed.*past the bound"):
        Decoder()({"__key__": "k", "txt.gz": gzip.compress(b"a" * 1001)})
