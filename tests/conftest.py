import pytest

from servers import s3_server, server  # noqa: F401  (fixtures: servers on 127.0.0.1)
from shards import UNEVEN_SIZES, write_shards


@pytest.fixture(params=["tar", "tfrecord"])
def fmt(request) -> str:
    return request.param


@pytest.fixture
def uneven_shards(tmp_path, fmt) -> str:
    return write_shards(tmp_path / fmt, fmt, UNEVEN_SIZES)
