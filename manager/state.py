"""What the restart path, the engine, the ledger and the CLI agree on, in the standard library only.

A leaf: it imports nothing from the package at module level (the catalog lookup is imported
when asked for), so `manager.fastpath` and `manager.overlays.plans` can read it before click,
rich, pydantic, yaml or libcst load, and every library module can import it without reaching
the entry point.

- `overlay_digest` / `package_version`: the fingerprints the ledger records and checks.
- `STATE_DIR`, `LEDGER_FILE`, `JOURNAL_FILE`, `ORIGINALS_DIR`, `ABSENT`: the state directory
  under a package root and its files.
- `APPLY_SKIPS` / `SKIP_UNLESS_NAMED`: the overlay statuses `apply` leaves alone.
- `catalog_dir` / `vllm_root`: where a `--catalog` / `--root` argument (or their defaults) point.
"""

from __future__ import annotations

import os
import stat
import sys

TYPE_CHECKING = False  # not typing's: `typing` imports `re`, which the warm no-op never loads (tests/test_fastpath.py)
if TYPE_CHECKING:  # annotations only: the leaf imports nothing of the package when it runs
    from .overlays.model import Status

try:  # the builtin module: no OpenSSL load (~3 ms of every container start)
    from _sha256 import sha256 as sha256  # type: ignore[import-not-found,unused-ignore]  # Python <= 3.11
except ImportError:  # pragma: no cover - Python >= 3.12 names it _sha2
    try:
        from _sha2 import sha256 as sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
    except ImportError:
        from hashlib import sha256 as sha256  # type: ignore[assignment,unused-ignore]

STATE_DIR = ".overlay-manager"  # under the package root
LEDGER_FILE = "ledger.json"
JOURNAL_FILE = "journal.json"
ORIGINALS_DIR = "originals"
ABSENT = "absent"  # the recorded hash of a file that does not exist

# apply skips these: the overlay needs nothing written. When its ids were named, a
# superseded/missing-target overlay is an error (reported by the full CLI); unnamed, it is skipped.
APPLY_SKIPS: frozenset[Status] = frozenset({"applied", "upstream", "not-applicable"})
SKIP_UNLESS_NAMED: frozenset[Status] = frozenset({"superseded", "missing-target"})

# compiled on first use (re's cache), and `re` imported then: the warm no-op never reads a
# _version.py, and a bare python (an image's) does not import re at start-up (~5 ms)
_VERSION_RE = r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]"""


MAX_READ = 256 << 20  # the largest file any reader here takes whole (a target, a plan, a state file)

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


class UnreadableFile(OSError):
    """A path that is not a regular file (FIFO, device, socket, directory) or is over a size bound.

    An OSError, so every existing `except OSError` (a skipped plan, one error line) applies;
    `str()` is the reason without the path."""

    def __str__(self) -> str:
        return self.strerror or "unreadable"


def read_bounded(path: str, limit: int = MAX_READ) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, never blocking.

    Opened non-blocking and fstat()ed before any read: a FIFO, a device (a `/dev/zero`
    symlink), a socket or a directory raises UnreadableFile, as does a file over `limit` (also
    one that grows past it while read). FileNotFoundError when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except IsADirectoryError:
        raise UnreadableFile(21, "is a directory, not a regular file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "a special file")
            raise UnreadableFile(22, f"is {kind}, not a regular file")
        if st.st_size > limit:
            raise UnreadableFile(27, f"is {st.st_size} bytes, over the {limit}-byte limit")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise UnreadableFile(27, f"grew past the {limit}-byte limit while read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def overlay_digest(overlay_dir: os.PathLike[str] | str) -> str:
    """sha256 over an overlay directory: the manifest and every file it may read.

    Only regular files inside the directory are read (bounded): a symlink is hashed as its link
    text (never followed: one pointing outside is refused when an edit reads it), and a FIFO,
    device or socket by its kind, so hashing can neither block nor read the host."""
    base = os.fspath(overlay_dir)
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        files.extend(os.path.join(dirpath, f) for f in filenames)
        files.extend(os.path.join(dirpath, d) for d in dirnames if os.path.islink(os.path.join(dirpath, d)))
    h = sha256()
    for path in sorted(files, key=lambda f: os.path.relpath(f, base).split(os.sep)):
        h.update(os.path.relpath(path, base).replace(os.sep, "/").encode() + b"\0")
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                data = b"symlink:" + os.fsencode(os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                data = read_bounded(path)
            else:
                data = b"special:" + _KINDS.get(stat.S_IFMT(st.st_mode), "special").encode()
        except OSError as exc:
            data = b"unreadable:" + str(exc).encode()
        h.update(data + b"\0")
    return str(h.hexdigest())


def package_version(root: os.PathLike[str] | str, package: str = "vllm") -> str | None:
    """The installed version, from the dist-info METADATA or `<package>/_version.py`."""
    root = os.fspath(root)
    prefix = package.replace("-", "_") + "-"
    try:
        infos = sorted(n for n in os.listdir(root) if n.startswith(prefix) and n.endswith(".dist-info"))
    except OSError:
        infos = []
    for info in infos:
        try:
            with open(os.path.join(root, info, "METADATA"), errors="replace") as fh:
                for line in fh:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break
        except OSError:
            continue
    import re

    try:
        with open(os.path.join(root, package, "_version.py"), errors="replace") as fh:
            m = re.search(_VERSION_RE, fh.read(), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


def file_sha(path: str) -> str:
    """sha256 of a regular file; ABSENT when missing, "not-a-regular-file" for anything else
    (a FIFO, a device, a directory, a file over MAX_READ: never blocks, never reads unbounded)."""
    try:
        return str(sha256(read_bounded(path)).hexdigest())
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    except UnreadableFile as exc:
        return ABSENT if exc.errno == 21 else "not-a-regular-file"  # matches no recorded hash


def catalog_overlay_ids(overlays_dir: str, *, any_kind: bool = False) -> list[str] | None:
    """Sorted ids of the catalog's overlays (folders with an overlay.yaml; `.`/`_` folders skipped), or None when
    unreadable. `any_kind`: an overlay.yaml that is not a regular file counts too (the loader then names it)."""
    present = os.path.lexists if any_kind else os.path.isfile
    try:
        return sorted(n for n in os.listdir(overlays_dir) if not n.startswith((".", "_"))
                      and present(os.path.join(overlays_dir, n, "overlay.yaml")))
    except OSError:
        return None


def catalog_dir(arg: str | None) -> str | None:
    """`--catalog DIR`, else $OVERLAY_CATALOG, else the shipped catalog (None when there is none)."""
    raw = arg or os.environ.get("OVERLAY_CATALOG")
    if raw:
        return os.path.realpath(os.path.expanduser(raw))
    from .catalog import default_catalog_dir

    found = default_catalog_dir()
    return os.fspath(found) if found is not None else None


def vllm_root(arg: str | None, package: str = "vllm") -> str | None:
    """`--root DIR`, else the directory holding the `package` on sys.path (not imported); None when not found.
    The one root finder: `overlays.root.find_root` is this plus the checks that raise."""
    if arg:
        return os.path.realpath(os.path.expanduser(arg))
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec(package, sys.path)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(os.path.realpath(next(iter(spec.submodule_search_locations))))
