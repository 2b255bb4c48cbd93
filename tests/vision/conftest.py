import pytest

from vision_photos import made_photos


@pytest.fixture(scope="session")
def photos() -> dict[str, bytes]:
    return made_photos()
