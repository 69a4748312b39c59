import sys
from pathlib import Path

import pytest

# The benchmark scripts import each other as plain modules.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def opencl():
    import shim

    try:
        return shim.device("opencl")
    except shim.DeviceUnavailable as e:
        pytest.skip(f"no OpenCL device: {e}")
