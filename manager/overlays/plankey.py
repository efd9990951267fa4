"""The plan key: which prepared plans the plan path may believe about the bytes they write.

A plan (manager.overlays.plans) is hash-checked against itself and scope-checked against the
catalog, but the bytes it writes inside its targets are not recomputed (that needs the engine the
plan path exists to avoid). So a plan is taken only from a writer holding the plan key: 32 random
bytes in a file (`$OVERLAY_PLAN_KEY` names it; `overlay bundle` makes one per bundle and its
wrapper exports its path). A plan written by `overlay prepare`, `overlay bundle` or a full-engine
first apply carries `"mac": {"alg": "hmac-sha256", "key_id": ..., "value": <hex>}`: HMAC-SHA256
under the key over

    b"overlay-manager-plan-mac/1\\0" + <the plan's file name stem> + b"\\0" + canonical JSON

where the canonical JSON is every field of the plan but "mac" (format, tool and package version,
request, overlay digests, every input hash, every write with its hunks and pre/post hashes, the
ledger, the report), `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=True)` of the
parsed plan: what is verified is exactly what the replay then uses. The key id (16 hex digits of a
sha256 of the key, which tells nothing about it) only names the key in messages and in the plan
cache's layout (`$OVERLAY_PLAN_CACHE/<key id>/<stem>.json`).

Standard library only (it runs in the start-up path, before click and the rest are imported),
and not even `hmac`/`hashlib`: importing them loads OpenSSL's `_hashlib`, ~3 ms of a plan apply's
~35 ms (measured with `python -X importtime`). HMAC-SHA256 is RFC 2104 on the builtin sha256 that
`manager.state` already uses (as CPython's own `hmac` does without OpenSSL), checked against the
stdlib's `hmac` by the tests; the MAC is compared with `_operator._compare_digest`, the constant-time
comparison `hmac.compare_digest` is.
"""

from __future__ import annotations

import json
import os

from ..state import UnreadableFile, read_bounded
from ..state import sha256 as _sha256

try:
    from _operator import _compare_digest
except ImportError:  # another Python implementation
    from hmac import compare_digest as _compare_digest  # type: ignore[no-redef]

ENV_KEY = "OVERLAY_PLAN_KEY"
ENV_CACHE = "OVERLAY_PLAN_CACHE"
KEY_BYTES = 32
MAC_ALG = "hmac-sha256"
_DOMAIN = b"overlay-manager-plan-mac/1\0"
_KEY_FILE_MAX = 4096  # a key file is 32 or 64-65 bytes: anything longer is refused unread past this


class PlanKeyError(Exception):
    """The configured plan key cannot be used (one line naming the file)."""


class PlanKey:
    """A loaded plan key: the file it came from and its 32 bytes (never shown)."""

    __slots__ = ("key_id", "path", "secret")

    def __init__(self, path: str, secret: bytes) -> None:
        self.path = path
        self.secret = secret
        self.key_id = _sha256(b"overlay-manager plan key id\0" + secret).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"PlanKey({self.path!r}, key_id={self.key_id!r})"


def _parse(data: bytes, path: str) -> bytes:
    if len(data) == KEY_BYTES:
        return data
    text = data[:-1] if data.endswith(b"\n") else data
    if len(text) == 2 * KEY_BYTES:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except ValueError:
            pass
    raise PlanKeyError(f"plan key {path}: is {len(data)} bytes: a plan key is {KEY_BYTES} random bytes "
                       f"(or {2 * KEY_BYTES} hex digits)")


def load_key(path: str | os.PathLike) -> PlanKey:
    """The key in `path`: a regular file (a symlink to one, as a mounted secret is, is followed)
    of 32 raw bytes or 64 hex digits and an optional newline. Read without blocking and bounded;
    anything else raises PlanKeyError."""
    path = os.fspath(path)
    try:
        data = read_bounded(path, _KEY_FILE_MAX)
    except FileNotFoundError:
        raise PlanKeyError(f"plan key {path}: no such file") from None
    except UnreadableFile as exc:
        raise PlanKeyError(f"plan key {path}: {exc.strerror}") from None
    except OSError as exc:
        raise PlanKeyError(f"plan key {path}: cannot read it ({exc.strerror or exc})") from None
    return PlanKey(path, _parse(data, path))


def key_from_env(environ=None) -> PlanKey | None:
    """The key `$OVERLAY_PLAN_KEY` names; None when it is unset or empty (PlanKeyError when it
    names a file that cannot be used)."""
    raw = (os.environ if environ is None else environ).get(ENV_KEY)
    if not raw:
        return None
    return load_key(os.path.expanduser(raw))


def create_key_file(path: str | os.PathLike, mode: int = 0o444) -> PlanKey:
    """A new random key in a new file (mode 0444 for a bundle's: the bundle is read-only, and
    readable by the container's user, whoever that is)."""
    path = os.fspath(path)
    secret = os.urandom(KEY_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, secret)
        os.fsync(fd)
    finally:
        os.close(fd)
    return PlanKey(path, secret)


def kept_key(path: str | os.PathLike) -> PlanKey:
    """The key in `path`, made there (mode 0600) the first time."""
    try:
        return load_key(path)
    except PlanKeyError:
        if os.path.lexists(path):
            raise
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    try:
        return create_key_file(path, 0o600)
    except FileExistsError:  # made by a concurrent run
        return load_key(path)


_BLOCK = 64  # sha256's block size
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


def hmac_sha256(key: bytes, msg: bytes) -> bytes:
    """HMAC-SHA256 (RFC 2104): H((K ^ opad) || H((K ^ ipad) || msg)), K zero-padded to the block."""
    if len(key) > _BLOCK:
        key = _sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    inner = _sha256(key.translate(_IPAD))
    inner.update(msg)
    return _sha256(key.translate(_OPAD) + inner.digest()).digest()


def _message(plan: dict, stem: str) -> bytes:
    body = {k: v for k, v in plan.items() if k != "mac"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return _DOMAIN + stem.encode("utf-8") + b"\0" + text.encode("ascii")


def sign(plan: dict, stem: str, key: PlanKey) -> dict:
    """The plan with its "mac" (over every other field and the file name stem)."""
    value = hmac_sha256(key.secret, _message(plan, stem))
    return {**plan, "mac": {"alg": MAC_ALG, "key_id": key.key_id, "value": value.hex()}}


def mac_problem(plan: dict, stem: str, key: PlanKey) -> str | None:
    """None when the plan's "mac" verifies under `key` for the file name `stem`, else why not
    (compared in constant time)."""
    mac = plan.get("mac")
    if mac is None:
        return f"unsigned, but a plan key is configured ({key.path}): only plans signed with it are used"
    given = None
    if isinstance(mac, dict) and mac.get("alg") == MAC_ALG and isinstance(mac.get("value"), str):
        try:
            given = bytes.fromhex(mac["value"])
        except ValueError:
            given = None
    if given is None or len(given) != 32:
        return f"malformed signature ('mac'): expected {{\"alg\": \"{MAC_ALG}\", \"value\": <64 hex digits>}}"
    try:
        want = hmac_sha256(key.secret, _message(plan, stem))
    except (ValueError, TypeError, RecursionError, UnicodeError):
        return "its signature does not verify: the plan has no canonical encoding"
    if _compare_digest(want, given):
        return None
    signer = mac.get("key_id")
    signer = signer if isinstance(signer, str) and len(signer) <= 64 and signer.isalnum() else "?"
    return (f"its signature does not verify under the plan key {key.path} (signed with key id {signer}, "
            f"this key is {key.key_id}): changed after it was signed, or signed with another key")


def signature(plan: object, stem: str, key: PlanKey | None) -> tuple[str | None, str]:
    """(why the plan may not be used, or None; what the printed line says of its signature).
    Without a key the plan is unsigned: the caller uses it only from a directory named explicitly."""
    if key is None:
        return None, f"; unsigned: no plan key is configured (${ENV_KEY}), taken as named by --plans/$OVERLAY_PLANS"
    problem = mac_problem(plan, stem, key) if isinstance(plan, dict) else "not a JSON object"
    return problem, f"; signature verified (plan key {key.key_id})"


def cache_dir() -> str | None:
    """$OVERLAY_PLAN_CACHE, resolved; None when unset or empty."""
    raw = os.environ.get(ENV_CACHE)
    return os.path.realpath(os.path.expanduser(raw)) if raw else None


def cache_plans(cache: str, key: PlanKey) -> str:
    """The directory of the plan cache that holds the plans signed with `key` (one per key id: two
    bundles sharing the cache never overwrite each other's plans)."""
    return os.path.join(cache, key.key_id)
