"""Fixtures of the fits() and plan() tests."""

from __future__ import annotations

import pytest

from manager.catalog import Catalog
from manager.profiles import load_profiles
from tests.helpers import REPO_ROOT


@pytest.fixture(scope="module")
def P():
    """The shipped profiles."""
    return load_profiles(Catalog(REPO_ROOT))
