"""The Python frontend's tests need python3-torch (scripts/setup.sh installs it) and the built
package (PYTHONPATH=build/python; ctest sets it). Without torch every test is skipped, and pytest
exits with 5 so that ctest reports the skip; under CI=true, or when torch is there but does not
import, they fail instead."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    try:
        import torch  # noqa: F401
    except ImportError as e:
        # Only torch that is not there is a skip; a torch that is there but fails to import is a
        # failure, and so is a missing one under CI=true (CI must run every test).
        if getattr(e, "name", None) != "torch":
            pytest.exit("python3-torch is installed but does not import: %s" % e, returncode=1)
        if os.environ.get("CI") == "true":
            pytest.exit("python3-torch is not installed (scripts/setup.sh installs it); CI=true: a missing "
                        "prerequisite fails", returncode=1)
        pytest.exit("skipped: python3-torch is not installed (scripts/setup.sh installs it)", returncode=5)
    try:
        import gradsync  # noqa: F401
    except ImportError as e:
        pytest.exit("the gradsync package is not importable (%s); build it and set PYTHONPATH=build/python" % e,
                    returncode=1)
