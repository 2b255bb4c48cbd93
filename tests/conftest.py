import pytest

from shards import UNEVEN_SIZES, write_shards


@pytest.fixture(params=["tar", "tfrecord"])
def fmt(request) -> str:
    return request.param


@pytest.fixture
def uneven_shards(tmp_path, fmt) -> str:
    return write_shards(tmp_path / fmt, fmt, UNEVEN_SIZES)
