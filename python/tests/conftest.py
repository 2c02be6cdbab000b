"""The Python frontend's tests need python3-torch (scripts/setup.sh installs it) and the built
package (PYTHONPATH=build/python; ctest sets it). Without torch every test is skipped, and pytest
exits with 5 so that ctest reports the skip."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.exit("skipped: python3-torch is not installed (scripts/setup.sh installs it)", returncode=5)
    try:
        import gradsync  # noqa: F401
    except ImportError as e:
        pytest.exit("the gradsync package is not importable (%s); build it and set PYTHONPATH=build/python" % e,
                    returncode=1)
