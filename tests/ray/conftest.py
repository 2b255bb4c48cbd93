"""A local Ray with 2 CPUs, one per test module, for the tests of shardmix.ray."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray
import ray.data


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # Sinks see the rows in the order they were made: what the byte-identity checks rely on.
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    yield ray
    ray.shutdown()
