"""Issue 28 point 1, the rest: a prepared plan is believed about the bytes it writes inside its
targets only when it was signed with the plan key (manager/overlays/plankey.py). A plan whose
bytes were changed and whose every hash was recomputed to match (the attack of point 1) is
refused in one line naming the file, nothing is written, and the full engine then applies."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from manager.fsutil import sha256_bytes
from manager.overlays import apply, load_overlays
from manager.overlays import plankey
from manager.overlays.plankey import KEY_BYTES, PlanKeyError, load_key
from manager.overlays.plans import PlanRefused, apply_hunks, apply_plan
from manager.overlays.prepare import prepare
from tests.helpers.catalogs import GEMMA4, shipped_catalog
from tests.helpers.cli import overlay_process
from tests.overlays.test_prepared_plans import ALL_IDS, _fresh, _tree
from tests.helpers.fifos import finishes

EVIL = "import os; os.system('echo pwned')  # not what the engine writes\n"


@pytest.fixture
def catalog(tmp_path):
    return shipped_catalog(tmp_path / "cat", ids=ALL_IDS)


def _key(path: Path, fill: bytes | None = None) -> Path:
    path.write_bytes(fill if fill is not None else os.urandom(KEY_BYTES))
    return path


def forge(plan_path: Path, base: bytes) -> None:
    """Point 1's attack: other bytes inside the overlay's block of GEMMA4 (its sentinel kept), and
    every hash that names them recomputed, so the plan is consistent with itself."""
    plan = json.loads(plan_path.read_text())
    w = next(w for w in plan["writes"] if w["path"] == GEMMA4)
    first = w["hunks"][0][2]
    nl = first.index("\n") + 1  # after the sentinel line
    w["hunks"][0][2] = first[:nl] + " " * (len(first) - len(first.lstrip(" "))) + EVIL + first[nl:]
    post = sha256_bytes(apply_hunks(base, w["hunks"], "forge"))
    w["post_sha256"] = post
    plan["ledger"]["files"][GEMMA4]["post_sha256"] = post
    plan["ledger"]["observed"][GEMMA4] = post
    plan_path.write_text(json.dumps(plan, indent=1, sort_keys=True))


@pytest.mark.network
def test_a_forged_cache_plan_with_consistent_hashes_is_refused_naming_it_and_the_engine_applies(tmp_path, catalog):
    every = load_overlays(catalog)
    cache, key = tmp_path / "cache", _key(tmp_path / "plan-key")
    env = {"OVERLAY_PLAN_CACHE": str(cache), "OVERLAY_PLAN_KEY": str(key), "OVERLAY_PLANS": ""}
    first, second = _fresh(tmp_path, every, "first"), _fresh(tmp_path, every, "second")
    pristine = (second / GEMMA4).read_bytes()

    def run(root: Path):
        return overlay_process("--catalog", str(catalog.root), "apply", "--root", str(root), env=env, timeout=300)

    p1 = run(first)
    assert p1.returncode == 0, p1.stderr
    (plan_path,) = cache.rglob("*.json")
    forge(plan_path, pristine)
    p2 = run(second)
    assert p2.returncode == 0, p2.stderr
    assert EVIL.encode() not in (second / GEMMA4).read_bytes()
    refused = [ln for ln in p2.stderr.splitlines() if "refused" in ln]
    assert len(refused) == 1 and str(plan_path) in refused[0] and "running the full engine" in refused[0], p2.stderr
    assert "signature" in refused[0]
    assert "(prepared plan" not in p2.stderr
    assert _tree(second) == _tree(first)  # the engine's bytes
    # the engine's run recorded its own plan over the forged one: the next container uses it
    third = _fresh(tmp_path, every, "third")
    p3 = run(third)
    assert p3.returncode == 0 and "prepared plan, hashes verified; signature verified" in p3.stderr, p3.stderr
    assert _tree(third) == _tree(first)


@pytest.mark.network
def test_the_forged_plan_is_refused_by_apply_plan_before_anything_is_written(tmp_path, catalog):
    every = load_overlays(catalog)
    key = load_key(_key(tmp_path / "k"))
    (made,) = prepare(every, ["0.20.0"], [], tmp_path / "plans", key=key)
    root = _fresh(tmp_path, every, "root")
    forge(Path(made.path), (root / GEMMA4).read_bytes())
    before = _tree(root)
    with pytest.raises(PlanRefused, match=rf"{made.path}: its signature does not verify under the plan key"):
        apply_plan(str(catalog.root), str(root), [], [str(tmp_path / "plans")], key=key)
    assert _tree(root) == before and not (root / ".overlay-manager").exists()


@pytest.mark.network
def test_a_plan_signed_with_another_key_is_refused_and_an_unsigned_one_too_when_a_key_is_set(tmp_path, catalog):
    every = load_overlays(catalog)
    mine, theirs = load_key(_key(tmp_path / "mine")), load_key(_key(tmp_path / "theirs"))
    (made,) = prepare(every, ["0.20.0"], [], tmp_path / "theirs-plans", key=theirs)
    root = _fresh(tmp_path, every, "root")
    with pytest.raises(PlanRefused, match=f"signed with key id {theirs.key_id}, this key is {mine.key_id}"):
        apply_plan(str(catalog.root), str(root), [], [str(tmp_path / "theirs-plans")], key=mine)
    (plain,) = prepare(every, ["0.20.0"], [], tmp_path / "plain", key=None)
    assert "mac" not in json.loads(Path(plain.path).read_text())
    with pytest.raises(PlanRefused, match=f"{plain.path}: unsigned, but a plan key is configured"):
        apply_plan(str(catalog.root), str(root), [], [str(tmp_path / "plain")], key=mine)
    assert not (root / ".overlay-manager").exists()
    # the same explicit, unsigned plan with no key configured: used, and said to be unsigned
    done = apply_plan(str(catalog.root), str(root), [], [str(tmp_path / "plain")], key=None)
    assert done is not None and done["signed"] is None and "unsigned" in done["auth"]


@pytest.mark.network
def test_without_a_key_the_plan_cache_is_neither_used_nor_filled_and_says_so_once_each(tmp_path, catalog):
    every = load_overlays(catalog)
    key = load_key(_key(tmp_path / "k"))
    cache = tmp_path / "cache"
    # a valid plan where the cache keeps plans of that key: still not used without the key
    prepare(every, ["0.20.0"], [], cache / key.key_id, key=key)
    root, ref = _fresh(tmp_path, every, "root"), _fresh(tmp_path, every, "ref")
    apply(every, ref)
    with pytest.raises(PlanRefused, match="no plan key is configured"):
        apply_plan(str(catalog.root), str(root), [], [], cache=str(cache), key=None)
    assert not (root / ".overlay-manager").exists()
    before = sorted(p.name for p in cache.rglob("*"))
    proc = overlay_process("--catalog", str(catalog.root), "apply", "--root", str(root), timeout=300,
                           env={"OVERLAY_PLAN_CACHE": str(cache), "OVERLAY_PLAN_KEY": "", "OVERLAY_PLANS": ""})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len([ln for ln in lines if "no plan key is configured" in ln]) == 2, proc.stderr  # not used, not recorded
    assert any("plan not recorded" in ln for ln in lines) and "(prepared plan" not in proc.stderr
    assert _tree(root) == _tree(ref)
    assert sorted(p.name for p in cache.rglob("*")) == before  # nothing unsigned was added


@pytest.mark.network
def test_signed_explicit_and_cache_plans_apply_as_the_engine(tmp_path, catalog):
    every = load_overlays(catalog)
    key = load_key(_key(tmp_path / "k"))
    (made,) = prepare(every, ["0.20.0"], [], tmp_path / "plans", key=key)
    assert json.loads(Path(made.path).read_text())["mac"]["key_id"] == key.key_id
    ref = _fresh(tmp_path, every, "ref")
    apply(every, ref)
    a, b = _fresh(tmp_path, every, "a"), _fresh(tmp_path, every, "b")
    done = apply_plan(str(catalog.root), str(a), [], [str(tmp_path / "plans")], key=key)
    assert done is not None and done["signed"] == key.key_id
    assert _tree(a) == _tree(ref)
    cache = tmp_path / "cache"
    (cache / key.key_id).mkdir(parents=True)
    os.replace(made.path, cache / key.key_id / Path(made.path).name)
    done = apply_plan(str(catalog.root), str(b), [], [], cache=str(cache), key=key)
    assert done is not None and done["plan"] == str(cache / key.key_id / Path(made.path).name)
    assert _tree(b) == _tree(ref)


# --- the key file and the signature, without a release --------------------------------------

PLAN = {"format": "overlay-manager-plan/1", "tool_version": "1", "package_version": "0.20.0", "explicit": False,
        "requested": ["a"], "overlays": [{"id": "a", "digest": "d" * 64}],
        "inputs": {"vllm/x.py": "1" * 64}, "writes": [{"path": "vllm/x.py", "pre_sha256": "1" * 64,
                                                        "post_sha256": "2" * 64, "hunks": [[0, 0, "y\n"]]}],
        "ledger": {"files": {}, "observed": {}, "overlays": {}}, "report": {"changes": [], "skipped": []}}


def test_the_signature_covers_every_field_the_file_name_and_the_format(tmp_path):
    key = load_key(_key(tmp_path / "k"))
    signed = plankey.sign(PLAN, "stem", key)
    assert plankey.mac_problem(json.loads(json.dumps(signed)), "stem", key) is None
    assert plankey.mac_problem(signed, "other-stem", key) is not None  # renamed to another request's key
    mutations = [
        lambda p: p.__setitem__("format", "overlay-manager-plan/2"),
        lambda p: p["writes"][0]["hunks"][0].__setitem__(2, "z\n"),
        lambda p: p["writes"][0].__setitem__("post_sha256", "3" * 64),
        lambda p: p["inputs"].__setitem__("vllm/x.py", "4" * 64),
        lambda p: p["overlays"][0].__setitem__("digest", "e" * 64),
        lambda p: p["ledger"]["observed"].__setitem__("vllm/x.py", "2" * 64),
        lambda p: p.__setitem__("extra", 1),
        lambda p: p["report"]["skipped"].append(["a", "why"]),
    ]
    for mutate in mutations:
        p = json.loads(json.dumps(signed))
        mutate(p)
        assert "does not verify" in plankey.mac_problem(p, "stem", key)
    for bad in ({"alg": "hmac-sha1", "value": "00"}, {"alg": "hmac-sha256", "value": "zz"}, "x", {"value": "é" * 64}):
        p = dict(signed, mac=bad)
        assert "malformed signature" in plankey.mac_problem(p, "stem", key)


def test_the_mac_is_compared_in_constant_time(tmp_path, monkeypatch):
    import hmac

    key = load_key(_key(tmp_path / "k"))
    signed = plankey.sign(PLAN, "stem", key)
    seen = []
    real = plankey._compare_digest
    assert real is hmac.compare_digest or real.__name__ in ("compare_digest", "_compare_digest")
    monkeypatch.setattr(plankey, "_compare_digest", lambda a, b: seen.append((a, b)) or real(a, b))
    assert plankey.mac_problem(signed, "stem", key) is None
    assert len(seen) == 1 and len(seen[0][0]) == len(seen[0][1]) == 32


def test_the_builtin_hmac_sha256_equals_the_stdlibs_and_rfc_4231(tmp_path):
    import hmac

    # RFC 4231 test case 2 and 6 (a key longer than the block)
    assert plankey.hmac_sha256(b"Jefe", b"what do ya want for nothing?").hex() == (
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    assert plankey.hmac_sha256(b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First").hex() == (
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
    for n in (0, 1, 32, 63, 64, 65, 200):
        k, m = os.urandom(n), os.urandom(n * 37)
        assert plankey.hmac_sha256(k, m) == hmac.new(k, m, "sha256").digest()


def test_the_plan_path_does_not_load_openssl_for_the_signature():
    import subprocess
    import sys

    code = ("import sys, os; from manager.overlays import plankey; k = plankey.PlanKey('k', os.urandom(32)); "
            "p = plankey.sign({'format': 'x'}, 's', k); assert plankey.mac_problem(p, 's', k) is None; "
            "print('_hashlib' in sys.modules, 'hmac' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_a_key_file_is_32_raw_bytes_or_64_hex_digits_and_its_id_is_stable(tmp_path):
    raw = os.urandom(32)
    a = load_key(_key(tmp_path / "raw", raw))
    b = load_key(_key(tmp_path / "hex", raw.hex().encode() + b"\n"))
    assert a.secret == b.secret == raw and a.key_id == b.key_id and len(a.key_id) == 16
    assert raw.hex() not in repr(a) and a.key_id != raw.hex()[:16]


@pytest.mark.parametrize("make, why", [
    (lambda p: p.write_bytes(b"short"), "is 5 bytes"),
    (lambda p: p.write_bytes(os.urandom(33)), "is 33 bytes"),
    (lambda p: p.write_bytes(b"g" * 64), "is 64 bytes"),
    (lambda p: p.mkdir(), "directory"),
    (lambda p: None, "no such file"),
    (lambda p: p.symlink_to("/dev/zero"), "character device"),
    (lambda p: os.mkfifo(p), "FIFO"),
])
def test_an_unusable_key_file_is_one_line_naming_it_without_blocking(tmp_path, make, why):
    path = tmp_path / "plan-key"
    make(path)
    done, got = finishes(lambda: load_key(str(path)))
    if path.is_fifo():
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert done, "reading the key blocked"
    assert isinstance(got, PlanKeyError), got
    assert str(got).startswith(f"plan key {path}: ") and why in str(got) and "\n" not in str(got)


@pytest.mark.network
def test_an_unusable_key_never_fails_the_start_the_engine_applies_and_says_why(tmp_path, catalog):
    every = load_overlays(catalog)
    key = _key(tmp_path / "plan-key", b"not a key\n")
    key_ok = load_key(_key(tmp_path / "good"))
    cache = tmp_path / "cache"
    prepare(every, ["0.20.0"], [], cache / key_ok.key_id, key=key_ok)
    root, ref = _fresh(tmp_path, every, "root"), _fresh(tmp_path, every, "ref")
    apply(every, ref)
    proc = overlay_process("--catalog", str(catalog.root), "apply", "--root", str(root), timeout=300,
                           env={"OVERLAY_PLAN_CACHE": str(cache), "OVERLAY_PLAN_KEY": str(key), "OVERLAY_PLANS": ""})
    assert proc.returncode == 0, proc.stderr
    named = [ln for ln in proc.stderr.splitlines() if f"plan key {key}: is 10 bytes" in ln]
    assert len(named) == 2, proc.stderr  # the plan path's line and the recording's note
    assert "(prepared plan" not in proc.stderr and "internal error" not in proc.stderr
    assert _tree(root) == _tree(ref)
