"""A token field's ``.npy`` bytes: the header ``np.save`` writes for a 1-D integer array is read
without ``np.load``, to the same array; any other header goes to ``np.load``, and damaged bytes
are a DecodeError naming the record."""

import io

import numpy as np
import pytest

from shardmix.errors import DecodeError
from shardmix.tokens.documents import document_tokens


def npy(array, version=None):
    out = io.BytesIO()
    np.lib.format.write_array(out, array, version=version)
    return out.getvalue()


@pytest.mark.parametrize("dtype", ["<u2", "<u4", "<i8", ">u2", "|u1", ">i4"])
@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_a_vector_reads_as_np_load_reads_it(dtype, wrap):
    array = (np.arange(300) % 251).astype(dtype)
    for data in (npy(array), npy(array, version=(2, 0)), npy(array[:0])):
        expected = np.load(io.BytesIO(data))
        tokens = document_tokens({"tokens.npy": wrap(data)}, "tokens")
        assert tokens.dtype == expected.dtype and np.array_equal(tokens, expected)


def test_bytes_given_as_a_mutable_buffer_are_copied():
    data = bytearray(npy(np.arange(5, dtype=np.uint16)))
    tokens = document_tokens({"tokens.npy": data}, "tokens")
    data[-2:] = b"\xff\xff"
    assert tokens.tolist() == [0, 1, 2, 3, 4]


def test_short_or_other_arrays_are_named():
    sample = {"__source__": "a.tar", "__index__": 3, "__key__": "k", "__offset__": 512}
    cut = npy(np.arange(10, dtype=np.uint16))[:-4]
    with pytest.raises(DecodeError, match=r"record 3 \(key 'k', byte offset 512\) of a.tar.*"):
        document_tokens({**sample, "tokens.npy": cut}, "tokens")
    with pytest.raises(DecodeError, match="1-D integer array, found uint16 of shape"):
        document_tokens({**sample, "tokens.npy": npy(np.zeros((2, 2), np.uint16))}, "tokens")
    with pytest.raises(DecodeError, match="1-D integer array, found float32"):
        document_tokens({**sample, "tokens.npy": npy(np.zeros(3, np.float32))}, "tokens")
