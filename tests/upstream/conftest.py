"""Fixtures of the upstream tests: a real git history shaped like upstream's, and a local GitHub whose
compare API answers from it (tests/helpers/fake_github.py)."""

from __future__ import annotations

import pytest

from tests.helpers.fake_github import UPSTREAM_REPO, FakeGitHub, build_upstream_repo


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """The history (fake_github.UpstreamRepo), built once per module."""
    return build_upstream_repo(tmp_path_factory.mktemp("up"))


@pytest.fixture
def gh(upstream):
    """A local GitHub answering compare for UPSTREAM_REPO from `upstream` (no pulls yet)."""
    with FakeGitHub() as fake:
        fake.repos[UPSTREAM_REPO] = upstream.path
        yield fake
