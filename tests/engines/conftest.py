"""Real wheels from PyPI, audited once and kept only as a small JSON report.

`audited(project, filename)`: the wheel's URL and sha256 from PyPI's PEP 691 JSON index, the
report cached under ~/.cache/overlay-manager/audits/<wheel sha256>-<auditor hash>.json (the
auditor hash covers manager/engines/*.py, so a code change re-audits, and the older reports of
that wheel are deleted). A miss downloads the
wheel into a temporary file (checked against the sha256), audits it on sm_70 and deletes it.
`wheel_file(project, filename)`: a small wheel itself, kept in the same cache directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.request
from pathlib import Path

import pytest

import manager.engines as engines_pkg
from manager.engines.audit import audit_wheel

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "overlay-manager" / "audits"
INDEX = "https://pypi.org/simple/{project}/"


def auditor_hash() -> str:
    h = hashlib.sha256()
    for path in sorted(Path(engines_pkg.__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


AUDITOR = auditor_hash()  # of the code this run imported, not of files edited while it runs


def pypi_file(project: str, filename: str) -> tuple[str, str]:
    req = urllib.request.Request(INDEX.format(project=project),
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = json.load(resp)
    except OSError as exc:
        pytest.skip(f"PyPI not reachable: {exc}")
    for f in data["files"]:
        if f["filename"] == filename:
            return f["url"], f["hashes"]["sha256"]
    raise AssertionError(f"{filename} is not on PyPI's index of {project}")


def _download(url: str, sha256: str, dest: Path) -> None:
    h = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=120) as resp, open(dest, "wb") as out:
        while chunk := resp.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
    assert h.hexdigest() == sha256, f"{url}: sha256 mismatch"


def audited(project: str, filename: str) -> dict:
    url, sha = pypi_file(project, filename)
    CACHE.mkdir(parents=True, exist_ok=True)
    report = CACHE / f"{sha}-{AUDITOR}.json"
    if report.is_file():
        return json.loads(report.read_text())
    with tempfile.TemporaryDirectory(prefix="overlay-audit-wheel-", dir=CACHE) as tmp:
        wheel = Path(tmp) / filename
        _download(url, sha, wheel)
        data = audit_wheel(wheel, 70).as_dict(with_tus=True)
    data["wheel"] = {"filename": filename, "sha256": sha}
    tmp_report = report.with_suffix(".tmp")
    tmp_report.write_text(json.dumps(data))
    tmp_report.replace(report)
    for stale in CACHE.glob(f"{sha}-*.json"):  # reports of this wheel by an older auditor
        if stale != report:
            stale.unlink(missing_ok=True)
    return data


def wheel_file(project: str, filename: str) -> Path:
    url, sha = pypi_file(project, filename)
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / "wheels" / sha / filename
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(".part")
        _download(url, sha, part)
        part.replace(path)
    return path
