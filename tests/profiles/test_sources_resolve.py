"""Every profile `sources:` entry cites something a user can open (issue 26 point 8): a public
address (well-formed https URL), a release file (a path that exists in that vLLM release's sdist),
or a file of this repository (docs/, tests/, overlays/, compose/, profiles/); an entry citing none
of these says why it has no source (a default, an estimate, a derivation, not published)."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.helpers import REPO_ROOT

URL = re.compile(r"https?://[^\s)\]\"'`,;]+")
VERSION = re.compile(r"(?<![\d.])(0\.\d{1,2}\.\d{1,2})(?![\d.])")
# a path inside an sdist: vllm/..., requirements/..., csrc/..., docker/... (a file, or a directory ending in /)
RELEASE_PATH = re.compile(r"(?<![\w/.-])((?:vllm|requirements|csrc|docker)/(?:[\w.-]+/)*[\w.-]*\w/?)")
REPO_PATH = re.compile(r"(?<![\w/.-])((?:docs|tests|overlays|compose|profiles)/[\w./-]*\w(?:\.\w+)?)")
NO_SOURCE_WORDS = ("default", "estimate", "derived", "not published", "assumed", "placeholder", "this project",
                   "measured", "typed", "computed", "unverified", "unknown", "as checked", "not run", "read from")


def _entries() -> list[tuple[str, str, str, str | None]]:
    """(profile file, field, source text, the engine's vLLM version when the profile is an engine).
    An entry whose fields the profile lists as `unverified` is left out: fits() names those as
    unverified wherever they count, which is the honest answer for a value without a source."""
    out = []
    for f in sorted((REPO_ROOT / "profiles").glob("*/*.yaml")):
        data = yaml.safe_load(f.read_text())
        engine_version = data.get("vllm_version") if f.parent.name == "engines" else None
        unverified = {str(u).split(".")[0].split("[")[0] for u in data.get("unverified") or []}

        def walk(o, where):
            if isinstance(o, dict):
                local = unverified if not where else {str(u).split(".")[0].split("[")[0] for u in o.get("unverified") or []}
                for k, v in o.items():
                    if k == "sources" and isinstance(v, dict):
                        out.extend((f.relative_to(REPO_ROOT).as_posix(), f"{where}{key}", str(text), engine_version)
                                   for key, text in v.items()
                                   if not {p.split(".")[0] for p in str(key).split("/")} <= local)
                    elif k == "source" and isinstance(v, str):
                        out.append((f.relative_to(REPO_ROOT).as_posix(), f"{where}source", v, engine_version))
                    else:
                        walk(v, f"{where}{k}.")
            elif isinstance(o, list):
                for i, x in enumerate(o):
                    walk(x, f"{where}{i}.")

        walk(data, "")
    return out


ENTRIES = _entries()


def test_there_are_sources_to_follow() -> None:
    assert len(ENTRIES) > 150


def test_every_url_is_a_well_formed_public_https_address() -> None:
    bad = [(f, k, u) for f, k, t, _ in ENTRIES for u in URL.findall(t)
           if not re.match(r"^https://[a-z0-9.-]+\.[a-z]{2,}(/\S*)?$", u.rstrip("."), re.I)]
    assert not bad, bad


def test_every_repository_file_cited_exists() -> None:
    missing = [(f, k, p) for f, k, t, _ in ENTRIES for p in REPO_PATH.findall(t)
               if not (REPO_ROOT / p.rstrip(".").split("#")[0]).exists()]
    assert not missing, missing


def test_every_entry_cites_something_or_says_why_not() -> None:
    def cites(t: str) -> bool:
        return bool(URL.search(t) or RELEASE_PATH.search(t) or REPO_PATH.search(t) or "METADATA" in t
                    or re.search(r"\btransformers/models/\w+/", t)
                    or re.search(r"\b[\w-]+\.(py|txt|json|md)\b", t))

    bare = [(f, k, t) for f, k, t, _ in ENTRIES if not cites(t) and not any(w in t.lower() for w in NO_SOURCE_WORDS)]
    assert not bare, "\n".join(f"{f} {k}: {t}" for f, k, t in bare)


def _sdist_names(version: str) -> set[str]:
    """Every path in the sdist (directories with a trailing /); the listing is kept next to the cached
    sdist (reading a 35 MB tarball's names is most of this test's time)."""
    import hashlib
    import tarfile

    from manager.releases import cache_dir, sdist

    tarball = sdist(version)
    memo = cache_dir() / "sdist-names" / f"{version}-{hashlib.sha256(str(tarball.stat().st_size).encode()).hexdigest()[:8]}.txt"
    if memo.is_file():
        return set(memo.read_text().splitlines())
    with tarfile.open(tarball) as tf:
        names = set()
        for m in tf.getmembers():
            rel = m.name.split("/", 1)[1] if "/" in m.name else ""
            names.add(rel)
            parts = rel.split("/")
            names.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_suffix(".tmp")
    tmp.write_text("\n".join(sorted(names)) + "\n")
    tmp.replace(memo)
    return names


@pytest.mark.network
def test_every_release_file_cited_exists_in_that_release() -> None:
    """A path like vllm/v1/attention/backends/triton_attn.py or docker/Dockerfile must exist in the sdist
    of a release the entry names (any X.Y.Z in it) or of the engine profile's own release."""
    cache: dict[str, set[str]] = {}
    missing = []
    for f, k, t, engine_version in ENTRIES:
        paths = [p.rstrip(".") for p in RELEASE_PATH.findall(t) if not p.startswith("vllm/vllm-openai")]  # an image
        if not paths:
            continue
        versions = list(dict.fromkeys(VERSION.findall(t) + ([engine_version] if engine_version else [])))
        if not versions:
            continue  # a model or hardware profile naming a path without a release: the path alone is the pointer
        for p in paths:
            found = False
            for v in versions:
                names = cache.setdefault(v, _sdist_names(v))
                if p in names or p.rstrip("/") in names or p.rstrip("/") + "/" in names:
                    found = True
                    break
            if not found:
                missing.append((f, k, versions, p))
    assert not missing, "\n".join(map(str, missing))
