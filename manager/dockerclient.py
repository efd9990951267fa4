"""The one way this package reaches a Docker engine (`overlay verify --image`, `overlay image build`,
`overlay engine audit --image`): the Docker SDK of the `[verify]` extra, pinged once, or one line
saying which of the two is missing, raised as the caller's error class."""

from __future__ import annotations

from typing import Any

from .errors import ManagerError


def docker_client(command: str, error: type[ManagerError], timeout: int | None = None) -> Any:
    """A live client for `command` (named in the message when the SDK is missing); `timeout` is the
    SDK's per-request timeout in seconds (its default when None)."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        from .extras import install_hint

        raise error(f"{command} needs the docker SDK; {install_hint('verify')}") from None
    try:
        client = docker.from_env() if timeout is None else docker.from_env(timeout=timeout)
        client.ping()
    except DockerException as exc:
        raise error(f"no Docker engine answers: {str(exc).splitlines()[0]}") from None
    return client
