"""`overlay engine audit --image`: a small image from the project's debootstrap base holding the
real CUDA `.so` files of the torchaudio 2.10.0 wheel (1.9 MB) and a synthetic vllm `_C` without
sm_70; the audit streams the image's site-packages out, never running its code."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile

import pytest

from manager.engines.audit import audit_dir, audit_image
from tests.helpers import containers as dh
from tests.helpers.fatbins import engine_so

from .conftest import wheel_file
from .test_real_wheels import TORCHAUDIO

pytestmark = [pytest.mark.docker, pytest.mark.network]


def _image(client) -> tuple[str, dict[str, bytes]]:
    files: dict[str, bytes] = {"vllm/_C.abi3.so": engine_so((75, 80))}
    with zipfile.ZipFile(wheel_file("torchaudio", TORCHAUDIO)) as zf:
        for name in zf.namelist():
            if name.endswith(".so"):
                files[name] = zf.read(name)
    digest = hashlib.sha256(b"".join(k.encode() + v for k, v in sorted(files.items()))).hexdigest()[:10]
    tag = f"overlay-manager-test/audit-image:{digest}"
    try:
        client.images.get(tag)
        return tag, files
    except Exception:  # noqa: BLE001 - not built yet
        pass
    base = dh.base_image(client)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for arc, data in {"Dockerfile": f"FROM {base}\nCOPY rootfs/ /\n".encode(),
                          **{f"rootfs{dh.SITE}/{k}": v for k, v in files.items()}}.items():
            info = tarfile.TarInfo(arc)
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    client.images.build(fileobj=buf, custom_context=True, tag=tag, rm=True, network_mode="none", pull=False)
    return tag, files


def test_image_audit_reads_the_same_binaries_as_the_files_themselves(tmp_path, cli_run):
    client = dh.docker_client()
    tag, files = _image(client)
    site = tmp_path / "site"
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    from_image = audit_image(tag, 70)
    from_files = audit_dir(site, 70)
    assert [b.as_dict() for b in from_image.binaries] == [b.as_dict() for b in from_files.binaries]
    audio = {b.path: b for b in from_image.binaries}["torchaudio/lib/libtorchaudio.so"]
    assert (audio.tu_count, audio.tus_with_sass) == (3, 3) and "sm_70" in audio.sass
    res = cli_run("engine", "audit", "--image", tag, "--sm", "70", "--json")
    assert res.exit_code == 1  # the synthetic vllm _C has no sm_70 code
    data = json.loads(res.stdout)
    assert data["verdict"] == "does not run" and data["source"] == tag
    assert "vllm _C: cache, rms_norm, activation, rotary, sampler, topk" in data["failing"]
    assert cli_run("engine", "audit", "--image", tag, "--sm", "80").exit_code == 0


def test_an_unknown_image_is_one_line_and_exit_1(cli_run):
    dh.docker_client()
    res = cli_run("engine", "audit", "--image", "overlay-manager-test/no-such-image:0")
    assert res.exit_code == 1
    assert "is not present locally" in res.stderr and len(res.stderr.strip().splitlines()) == 1
