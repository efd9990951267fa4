"""Issue 10, items 1-7: data loss and escapes in the overlay engine.

Each test names the defect it pins (it failed on overlay-manager 0.1.0). A tiny synthetic root
and catalog keep them fast; the kill -9 and concurrency trials on a real vLLM tree are in
tests/overlays/test_kill9_and_concurrency.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from manager.catalog import Catalog
from manager.errors import OverlayError
from manager.overlays import apply, load_overlays, revert, status
from tests.helpers.cli import run_cli

MOD = "def f(x):\n    y = x + 1\n    return y\n"
MOD2 = "def g(x):\n    z = x - 1\n    return z\n"
SNIPPET = "y = y * 2\ny = y - 1\n"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def synthetic_root(base: Path, files: dict[str, bytes] | None = None) -> Path:
    """A tiny package root: vllm/ with `files` (default: two small modules) and a vllm 0.20.0 dist-info."""
    root = base / "site"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    info = root / "vllm-0.20.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.20.0\n\n")
    default = {"vllm/mod.py": MOD.encode(), "vllm/sub/mod2.py": MOD2.encode()}
    for rel, data in (default if files is None else files).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def synthetic_catalog(base: Path, *, targets=("vllm/mod.py",), extra: str = "", edits: str | None = None,
                      snippets: dict[str, str] | None = None, oid: str = "two-lines") -> Path:
    """A catalog dir holding one synthetic overlay (`oid`) whose insert edits target the synthetic root
    (not the shipped overlays: for those, tests.helpers.catalogs.shipped_catalog_dir)."""
    cat = base / "catalog"
    d = cat / "overlays" / oid
    (d / "snippets").mkdir(parents=True, exist_ok=True)
    for name, text in (snippets or {"add.py": SNIPPET, "add2.py": "z = z * 3\n"}).items():
        (d / "snippets" / name).write_text(text)
    if edits is None:
        edits = (
            "  - {name: add, kind: insert, target: vllm/mod.py, scope: f, anchor: 'return y', code: snippets/add.py}\n"
        )
        if "vllm/sub/mod2.py" in targets:
            edits += "  - {name: add2, kind: insert, target: vllm/sub/mod2.py, scope: g, anchor: 'return z', code: snippets/add2.py}\n"
    (d / "overlay.yaml").write_text(
        f"id: {oid}\ntitle: t\nsummary: s\nvendored_on: 2026-11-01\n"
        f"targets: [{', '.join(targets)}]\ndrop_when: never\nsentinel_version: 1\n{extra}edits:\n{edits}"
    )
    return cat


def overlays(cat: Path):
    return load_overlays(Catalog(cat))


def run(cat: Path, *args: str) -> tuple[int, str, str]:
    return run_cli("--catalog", str(cat), *args)


def one_line(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    return lines[0]


def files_under(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): _sha(p.read_bytes()) for p in sorted(d.rglob("*")) if p.is_file()}


# --- (1) revert never removes a block that does not match its sentinel ------------------------


def test_revert_without_ledger_refuses_a_block_missing_one_of_its_lines(tmp_path):
    root, cat = synthetic_root(tmp_path), synthetic_catalog(tmp_path)
    apply(overlays(cat), root)
    p = root / "vllm/mod.py"
    lines = p.read_text().splitlines(keepends=True)
    victim = next(i for i, l in enumerate(lines) if l.strip() == "y = y - 1")
    del lines[victim]  # a hand edit: one of our two inserted lines removed
    p.write_text("".join(lines))
    (root / ".overlay-manager/ledger.json").rename(root / "ledger.aside")  # as the corrupt-ledger message advises
    before = p.read_bytes()
    rc, _, err = run(cat, "revert", "--root", str(root))
    assert rc == 1, err
    line = one_line(err)
    sentinel_line = next(i for i, l in enumerate(p.read_text().splitlines(), 1) if "overlay:two-lines" in l)
    assert "vllm/mod.py" in line and f"line {sentinel_line}" in line and "does not match" in line
    assert "expected 'y = y - 1', found 'return y'" in line  # what differs
    assert p.read_bytes() == before  # `return y` (not ours) is still there
    assert "return y" in p.read_text()


def test_revert_without_ledger_still_removes_an_intact_block(tmp_path):
    root, cat = synthetic_root(tmp_path), synthetic_catalog(tmp_path)
    apply(overlays(cat), root)
    (root / ".overlay-manager/ledger.json").unlink()
    revert(overlays(cat), overlays(cat), root)
    assert (root / "vllm/mod.py").read_text() == MOD


def test_revert_without_ledger_refuses_to_delete_an_edited_new_file(tmp_path):
    root = synthetic_root(tmp_path)
    cat = synthetic_catalog(tmp_path, targets=("vllm/new.py",), snippets={"new.py": "X = 1\n"},
                            edits="  - {name: nf, kind: new-file, source: snippets/new.py}\n")
    apply(overlays(cat), root)
    new = root / "vllm/new.py"
    new.write_text(new.read_text() + "MINE = 2  # added by hand\n")
    (root / ".overlay-manager/ledger.json").unlink()
    with pytest.raises(OverlayError, match=r"revert refused: vllm/new.py: line 1: .*edited after it was written"):
        revert(overlays(cat), overlays(cat), root)
    assert "MINE = 2" in new.read_text()


# --- (2) every path stays inside its root or catalog -----------------------------------------


def test_target_under_a_directory_symlink_leaving_the_root_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "mod2.py").write_text(MOD2)
    root = synthetic_root(tmp_path, {"vllm/mod.py": MOD.encode()})
    (root / "vllm/sub").symlink_to(outside, target_is_directory=True)
    cat = synthetic_catalog(tmp_path, targets=("vllm/mod.py", "vllm/sub/mod2.py"))
    rc, _, err = run(cat, "apply", "--root", str(root))
    assert rc == 1, err
    assert "vllm/sub/mod2.py" in one_line(err) and "outside the root" in err
    assert (outside / "mod2.py").read_text() == MOD2
    assert (root / "vllm/mod.py").read_text() == MOD


@pytest.mark.parametrize("bad", ["../victim.txt", "ABS"], ids=["dotdot", "absolute"])
def test_hand_edited_ledger_path_outside_the_root_never_deletes_it(tmp_path, bad):
    root, cat = synthetic_root(tmp_path), synthetic_catalog(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours\n")
    rel = str(victim) if bad == "ABS" else bad
    state = root / ".overlay-manager"
    state.mkdir()
    (state / "ledger.json").write_text(json.dumps({"files": {rel: {
        "base_sha256": "absent", "post_sha256": _sha(victim.read_bytes()), "overlays": {"two-lines": 1}}}}))
    rc, _, err = run(cat, "revert", "--root", str(root))
    assert rc == 1, err
    assert "ledger.json" in one_line(err) and rel in err and "not a path inside the root" in err
    assert victim.read_text() == "not yours\n"


@pytest.mark.parametrize("field, value", [
    ("code", "../../../secret.py"), ("code", "/etc/hostname"), ("source", "/etc/hostname"), ("source", "../x/../../s"),
])
def test_catalog_snippet_path_outside_the_overlay_is_refused_by_the_manifest(tmp_path, field, value):
    root = synthetic_root(tmp_path)
    edit = (f"  - {{name: a, kind: insert, scope: f, anchor: 'return y', code: '{value}'}}\n" if field == "code"
            else f"  - {{name: a, kind: new-file, source: '{value}'}}\n")
    cat = synthetic_catalog(tmp_path, targets=("vllm/new.py",) if field == "source" else ("vllm/mod.py",), edits=edit)
    before = files_under(root)
    rc, _, err = run(cat, "apply", "--root", str(root))
    assert rc == 1, err
    line = one_line(err)
    assert "overlay.yaml" in line and value in line and "inside the overlay directory" in line
    assert files_under(root) == before


def test_snippet_symlink_out_of_the_overlay_directory_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOKEN = 'host secret'\n")
    root = synthetic_root(tmp_path)
    cat = synthetic_catalog(tmp_path, targets=("vllm/new.py",), snippets={},
                            edits="  - {name: nf, kind: new-file, source: snippets/new.py}\n")
    (cat / "overlays/two-lines/snippets/new.py").symlink_to(secret)
    rc, _, err = run(cat, "apply", "--root", str(root))
    assert rc == 1, err
    assert "snippets/new.py" in one_line(err) and "outside the overlay directory" in err
    assert not (root / "vllm/new.py").exists()


def test_probe_target_outside_the_root_is_refused(tmp_path):
    root = synthetic_root(tmp_path)
    cat = synthetic_catalog(tmp_path, extra="probes:\n  - {target: /etc/hostname, contains: x}\n")
    rc, _, err = run(cat, "status", "--root", str(root))
    assert rc == 1 and "/etc/hostname" in one_line(err) and "relative path" in err
    outside = tmp_path / "outside.py"
    outside.write_text("FIXED = 1\n")
    (root / "vllm/link.py").symlink_to(outside)
    cat = synthetic_catalog(tmp_path / "c2", extra="probes:\n  - {target: vllm/link.py, defines: FIXED}\n")
    rc, out, _ = run(cat, "status", "--root", str(root), "--json")  # the status report is data (stdout)
    details = [t["detail"] for o in json.loads(out)["overlays"] for t in o["targets"] if t["status"] == "error"]
    assert rc == 1 and len(details) == 1 and "vllm/link.py" in details[0] and "outside the root" in details[0]


# --- (3) file symlinks keep their type ------------------------------------------------------


def test_file_symlink_inside_the_root_is_patched_through_and_kept(tmp_path):
    root = synthetic_root(tmp_path, {"vllm/real_mod.py": MOD.encode()})
    (root / "vllm/mod.py").symlink_to("real_mod.py")
    cat = synthetic_catalog(tmp_path)
    apply(overlays(cat), root)
    assert (root / "vllm/mod.py").is_symlink() and os.readlink(root / "vllm/mod.py") == "real_mod.py"
    assert "overlay:two-lines" in (root / "vllm/real_mod.py").read_text()
    assert status(overlays(cat), root).overlays[0].status == "applied"
    revert(overlays(cat), overlays(cat), root)
    assert (root / "vllm/mod.py").is_symlink() and os.readlink(root / "vllm/mod.py") == "real_mod.py"
    assert (root / "vllm/real_mod.py").read_text() == MOD


def test_file_symlink_leaving_the_root_is_refused(tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text(MOD)
    root = synthetic_root(tmp_path, {})
    (root / "vllm/mod.py").symlink_to(outside)
    cat = synthetic_catalog(tmp_path)
    rc, _, err = run(cat, "apply", "--root", str(root))
    assert rc == 1 and "vllm/mod.py" in one_line(err) and "outside the root" in err
    assert outside.read_text() == MOD and (root / "vllm/mod.py").is_symlink()


# --- (4) a write failure part-way rolls back; status fails while a journal exists -----------


def test_write_failure_part_way_rolls_back_the_files_already_written(tmp_path, monkeypatch):
    root, cat = synthetic_root(tmp_path), synthetic_catalog(tmp_path, targets=("vllm/mod.py", "vllm/sub/mod2.py"))
    from manager.overlays import writeset

    real = writeset.WriteSet.commit

    def failing(self, path):
        if Path(path).name == "mod2.py":
            raise PermissionError(13, "Permission denied")
        return real(self, path)

    monkeypatch.setattr(writeset.WriteSet, "commit", failing)
    with pytest.raises(OverlayError, match=r"vllm/sub/mod2.py: cannot write: Permission denied; nothing changed"):
        apply(overlays(cat), root)
    assert (root / "vllm/mod.py").read_text() == MOD  # written first, then put back
    assert (root / "vllm/sub/mod2.py").read_text() == MOD2
    assert not (root / ".overlay-manager/journal.json").exists()
    assert {o.status for o in status(overlays(cat), root).overlays} == {"pending"}


def _as_nobody(args: list[str]) -> tuple[int, str]:
    """`overlay ARGS` in a forked child that dropped to uid/gid 65534 (nobody) when run as root.

    The child runs the CLI in-process: the interpreter under /root is not executable by nobody,
    so everything it needs is imported by the parent first (a warm-up run)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code, err = 3, ""
        try:
            if os.getuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            code, _, err = run_cli(*args)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            err = f"child failed: {exc!r}"
        finally:
            os.write(w, json.dumps([code, err]).encode())
            os._exit(0)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    os.waitpid(pid, 0)
    code, err = json.loads(b"".join(chunks))
    return code, err


def test_write_failure_as_a_non_root_user_leaves_nothing_half_applied(tmp_path):
    """chmod 555 on one target directory, apply as an unprivileged user (CI runs as root: setuid)."""
    warm_root, warm_cat = synthetic_root(tmp_path / "warm"), synthetic_catalog(tmp_path / "warm")
    run(warm_cat, "apply", "--root", str(warm_root))  # imports everything apply/status need
    run(warm_cat, "status", "--root", str(warm_root))
    base = Path(tempfile.mkdtemp(prefix="overlay-nonroot-"))
    try:
        base.chmod(0o755)
        root, cat = synthetic_root(base), synthetic_catalog(base, targets=("vllm/mod.py", "vllm/sub/mod2.py"))
        if os.getuid() == 0:
            for p in [base, *base.rglob("*")]:
                os.lchown(p, 65534, 65534)
        (root / "vllm/sub").chmod(0o555)
        rc, err = _as_nobody(["--catalog", str(cat), "apply", "--root", str(root)])
        assert rc == 1, err
        assert "vllm/sub/mod2.py" in err and "Permission denied" in err and "nothing changed" in err
        assert (root / "vllm/mod.py").read_text() == MOD
        assert (root / "vllm/sub/mod2.py").read_text() == MOD2
        assert not (root / ".overlay-manager/journal.json").exists()
        assert not [p for p in (root / "vllm").iterdir() if p.name.startswith(".")]  # no temp file either
        rc, err = _as_nobody(["--catalog", str(cat), "status", "--root", str(root)])
        assert rc == 0, err  # all pending: nothing half-applied
    finally:
        if (base / "site/vllm/sub").exists():
            (base / "site/vllm/sub").chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_status_exits_nonzero_while_a_journal_is_present(tmp_path):
    root, cat = synthetic_root(tmp_path), synthetic_catalog(tmp_path)
    assert run(cat, "status", "--root", str(root))[0] == 0
    (root / ".overlay-manager").mkdir()
    data = (root / "vllm/mod.py").read_bytes()
    (root / ".overlay-manager/journal.json").write_text(json.dumps({"vllm/mod.py": {
        "base_sha256": _sha(data), "pre_sha256": _sha(data), "post_sha256": "0" * 64, "overlays": {"two-lines": 1}}}))
    rc, out, err = run(cat, "status", "--root", str(root), "--json")
    assert rc == 1, err
    assert "interrupted" in json.loads(out)["interrupted"] and "journal.json" in err
    # the next apply folds the journal in and completes; status is clean again
    assert run(cat, "apply", "--root", str(root))[0] == 0
    assert run(cat, "status", "--root", str(root))[0] == 0


# --- (5) the ledger/journal schema: what we write we can read -------------------------------


def test_apply_that_writes_nothing_leaves_a_ledger_the_next_run_accepts(tmp_path):
    root = synthetic_root(tmp_path, {"vllm/mod.py": (MOD + "FIXED = True\n").encode()})
    cat = synthetic_catalog(tmp_path, extra="probes:\n  - {target: vllm/mod.py, defines: FIXED}\n")
    for _ in range(2):
        rc, _, err = run(cat, "apply", "--root", str(root))
        assert rc == 0, err
        assert status(overlays(cat), root).overlays[0].status == "upstream"
    ledger = json.loads((root / ".overlay-manager/ledger.json").read_text())
    assert ledger["files"] == {} and ledger["overlays"]["two-lines"]["status"] == "upstream"
    rc, _, err = run(cat, "revert", "--root", str(root))
    assert rc == 0, err


@pytest.mark.parametrize("name, text, says", [
    ("ledger.json", "[]", "expected a mapping, got list"),
    ("ledger.json", '{"files": {"vllm/mod.py": {"base_sha256": "absent"}}}', "missing key 'post_sha256'"),
    ("ledger.json", '{"files": {}, "observed": {"vllm/mod.py": 3}}', "is not a sha256"),
    ("journal.json", '{"vllm/mod.py": []}', "expected a mapping, got list"),
    ("journal.json", '{"/etc/passwd": {}}', "not a path inside the root"),
], ids=["ledger-list", "ledger-missing-key", "ledger-bad-sha", "journal-list", "journal-absolute"])
def test_ledger_and_journal_of_the_wrong_shape_are_one_line_errors(tmp_path, name, text, says):
    root, cat = synthetic_root(tmp_path), synthetic_catalog(tmp_path)
    (root / ".overlay-manager").mkdir()
    (root / ".overlay-manager" / name).write_text(text)
    before = files_under(root)
    for cmd in ("apply", "revert"):
        rc, _, err = run(cat, cmd, "--root", str(root))
        assert rc == 1, err
        assert name in one_line(err) and says in err
    assert {k: v for k, v in files_under(root).items() if not k.endswith("lock")} == before


def test_ledger_write_is_validated_by_the_same_schema(tmp_path):
    from manager.overlays.ledger import Ledger

    led = Ledger(synthetic_root(tmp_path))
    led.files["../escape"] = {"base_sha256": "absent", "post_sha256": "absent", "overlays": {}}
    with pytest.raises(AssertionError, match="invalid ledger"):
        led.save("0.20.0")
    assert not led.path.exists()


# --- (6) encoding bytes kept exactly -------------------------------------------------------


def assert_applied_and_reverted_exactly(cat: Path, root: Path, rel: str, original: bytes) -> None:
    """The applied overlay reads back `applied`; revert gives `original` back to the byte, with the ledger
    and, after a fresh apply, without it (blocks removed from the file itself)."""
    assert status(overlays(cat), root, use_ledger=False).overlays[0].status == "applied"
    revert(overlays(cat), overlays(cat), root)
    assert (root / rel).read_bytes() == original
    apply(overlays(cat), root)
    (root / ".overlay-manager/ledger.json").unlink()
    revert(overlays(cat), overlays(cat), root)
    assert (root / rel).read_bytes() == original


@pytest.mark.parametrize("name, data", [
    ("bom", b"\xef\xbb\xbf" + MOD.encode()),
    ("crlf", MOD.replace("\n", "\r\n").encode()),
    ("bom-crlf", b"\xef\xbb\xbf" + MOD.replace("\n", "\r\n").encode()),
    ("latin-1", ("# -*- coding: latin-1 -*-\n# caf\u00e9\n" + MOD).encode("latin-1")),
], ids=["bom", "crlf", "bom-crlf", "latin-1"])
def test_encoding_bytes_survive_apply_and_revert(tmp_path, name, data):
    root = synthetic_root(tmp_path, {"vllm/mod.py": data})
    cat = synthetic_catalog(tmp_path)
    apply(overlays(cat), root)
    patched = (root / "vllm/mod.py").read_bytes()
    assert b"overlay:two-lines" in patched
    assert patched.startswith(b"\xef\xbb\xbf") == data.startswith(b"\xef\xbb\xbf")
    if b"\r\n" in data:
        assert patched.count(b"\n") == patched.count(b"\r\n")  # every line, ours included, CRLF
    if name == "latin-1":
        assert b"caf\xe9" in patched
    assert_applied_and_reverted_exactly(cat, root, "vllm/mod.py", data)


# --- (7) temp files: unmistakable names, cleaned by the next run ----------------------------


def test_atomic_write_temp_names_carry_the_marker(tmp_path, monkeypatch):
    from manager import fsutil

    seen = []

    def boom(src, dst):
        seen.append(Path(src).name)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsutil.os, "replace", boom)
    with pytest.raises(OSError):
        fsutil.atomic_write(tmp_path / "x.py", b"data")
    assert len(seen) == 1 and seen[0].startswith(".x.py" + fsutil.TMP_MARK) and fsutil.is_temp_name(seen[0])
    assert list(tmp_path.iterdir()) == []
    for other in (".x.py.swp", ".x.py.abc.tmp", "x.py.overlay-manager-tmp-abcdef12", ".x.py.overlay-manager-tmp-"):
        assert not fsutil.is_temp_name(other), other


def test_next_run_removes_temp_files_a_killed_run_left(tmp_path):
    root, cat = synthetic_root(tmp_path), synthetic_catalog(tmp_path)
    litter = [root / "vllm/.mod.py.overlay-manager-tmp-k1ll3d_x", root / "vllm/.mod.py.ab12cd34.tmp",
              root / ".overlay-manager/.ledger.json.overlay-manager-tmp-zz9y8x7w"]
    keep = [root / "vllm/.mod.py.notes.tmp", root / "vllm/.other.py.ab12cd34.tmp", root / "vllm/mod.py.bak"]
    (root / ".overlay-manager").mkdir()
    for p in litter + keep:
        p.write_text("x")
    rc, _, err = run(cat, "apply", "--root", str(root))
    assert rc == 0, err
    assert [p for p in litter if p.exists()] == []
    assert all(p.exists() for p in keep)
    assert "left by an interrupted run" in err
    (root / "vllm/.mod.py.overlay-manager-tmp-again123").write_text("x")
    rc, _, err = run(cat, "revert", "--root", str(root))
    assert rc == 0 and not (root / "vllm/.mod.py.overlay-manager-tmp-again123").exists()


def test_state_directory_symlinked_out_of_the_root_is_refused(tmp_path):
    root, cat = synthetic_root(tmp_path), synthetic_catalog(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / ".overlay-manager").symlink_to(elsewhere, target_is_directory=True)
    rc, _, err = run(cat, "apply", "--root", str(root))
    assert rc == 1 and ".overlay-manager" in one_line(err) and "outside the root" in err
    assert list(elsewhere.iterdir()) == [] and (root / "vllm/mod.py").read_text() == MOD


def test_kernel_source_symlinked_out_of_the_overlay_is_refused(tmp_path):
    from manager.errors import BuildError
    from manager.kernels import builder
    from manager.kernels.spec import KernelsSpec

    d = tmp_path / "k"
    (d / "csrc").mkdir(parents=True)
    (tmp_path / "host.cu").write_text("// a host file\n")
    (d / "csrc/a.cu").symlink_to(tmp_path / "host.cu")
    spec = KernelsSpec.model_validate({"sources": [{"path": "csrc/a.cu", "entries": [{"name": "k", "params": []}]}]})
    with pytest.raises(BuildError, match=r"csrc/a.cu: resolves to .*outside the overlay directory"):
        builder.build_overlay("k", d, spec, tmp_path / "cache", progress=False,
                              nv_for=lambda arch: type("NoCompiler", (), {"version_str": "none"})())


def test_crlf_c_source_keeps_crlf_through_text_insert_apply_and_revert(tmp_path):
    cu = b"__global__ void k(float* x) {\r\n  int i = threadIdx.x;\r\n  x[i] = 0.f;\r\n}\r\n"
    root = synthetic_root(tmp_path, {"vllm/csrc/k.cu": cu})
    cat = synthetic_catalog(tmp_path, targets=("vllm/csrc/k.cu",), snippets={"k.cu": "if (i > 4) return;\n"},
                            edits="  - {name: guard, kind: text-insert, anchor: 'x[i] = 0.f;', code: snippets/k.cu}\n")
    apply(overlays(cat), root)
    patched = (root / "vllm/csrc/k.cu").read_bytes()
    assert b"overlay:two-lines" in patched and b"if (i > 4) return;" in patched
    assert patched.count(b"\n") == patched.count(b"\r\n")
    assert_applied_and_reverted_exactly(cat, root, "vllm/csrc/k.cu", cu)
