"""patcher check --compile (work in progress)."""

import pytest


@pytest.mark.docker
def test_builder_image_available(builder_image_cpu_1131):
    assert builder_image_cpu_1131.tag
