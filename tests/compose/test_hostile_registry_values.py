"""Hostile values in compose/deployments.yaml, through `overlay compose render` (issue 10: the
campaign's hostile compose payloads as a permanent test).

Each payload goes into one registry field of a real deployment. The outcome must be one of:
- refused: exit 1, one `error:` line naming deployments.yaml; or
- rendered inertly: the output parses as YAML, has exactly the services/keys/volumes/command
  length of the unmodified deployment (nothing injected), and the value comes back verbatim where
  it belongs (Compose's `$$` unescaped).
Nothing may be written anywhere. The payload list is fixed (PAYLOADS x FIELDS = 78 cases); set
OVERLAY_HOSTILE_COMPOSE_EXTRA=N to add N random payloads per field (seeded, reproducible).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO_ROOT
from tests.helpers.cli import run_cli

SLUG = "gemma4-26b-a4b-awq-3090-tp1"
PWNED = Path("/tmp/pwned-by-compose")

PAYLOADS = [
    'x"\nprivileged: true\ny: "',
    "x\n    privileged: true",
    "x\nservices:\n  evil:\n    image: evil",
    "'; touch /tmp/pwned-by-compose; '",
    "$(touch /tmp/pwned-by-compose)",
    "`touch /tmp/pwned-by-compose`",
    "${HOME}:/host:rw",
    "$${HOME}",
    "key: value # comment",
    "- list item",
    "{a: 1, privileged: true}",
    "&anchor *alias !!python/object:os.system",
    "\\\"escaped\\\"",
]
FIELDS = ("note", "served_name", "model_dir", "extra_args", "env_value", "shm_size")
_ALPHABET = "ab$'\"`\\\n\t :-#{}[]&*!|>%@,?\x00"


def _extra_payloads() -> list[str]:
    n = int(os.environ.get("OVERLAY_HOSTILE_COMPOSE_EXTRA", "0") or 0)
    rng = random.Random(10)
    return ["".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 24))) for _ in range(n)]


CASES = [(f, p) for f in FIELDS for p in PAYLOADS + _extra_payloads()]


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> Path:
    cat = tmp_path_factory.mktemp("compose-cat")
    for sub in ("overlays", "profiles"):
        os.symlink(REPO_ROOT / sub, cat / sub)
    (cat / "compose").mkdir()
    return cat


def _registry(base: dict, field: str, payload: str) -> dict:
    dep = dict(base)
    if field == "extra_args":
        dep["extra_args"] = ["--disable-log-stats", payload]
    elif field == "env_value":
        dep["env"] = {"EXTRA": payload}
    else:
        dep[field] = payload
    return {"deployments": {SLUG: dep}}


def _render(catalog: Path, registry: dict) -> tuple[int, str, list[str]]:
    (catalog / "compose" / "deployments.yaml").write_text(yaml.safe_dump(registry, sort_keys=False))
    res = run_cli("--catalog", str(catalog), "compose", "render", SLUG)
    return res.exit_code, res.stdout, res.err_lines


@pytest.fixture(scope="module")
def baseline(catalog) -> tuple[dict, dict]:
    shipped = yaml.safe_load((REPO_ROOT / "compose" / "deployments.yaml").read_text())["deployments"][SLUG]
    rc, out, err = _render(catalog, {"deployments": {SLUG: shipped}})
    assert rc == 0, err
    return shipped, yaml.safe_load(out)


def _unescape(value: str) -> str:
    return value.replace("$$", "$")


@pytest.mark.parametrize("field, payload", CASES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(CASES)])
def test_hostile_registry_value_is_refused_or_rendered_inertly(catalog, baseline, field, payload):
    shipped, base_doc = baseline
    existed = PWNED.exists()
    rc, out, err = _render(catalog, _registry(shipped, field, payload))
    assert PWNED.exists() == existed
    assert not (catalog / "compose" / "generated").exists()
    if rc == 1:
        assert len(err) == 1 and err[0].startswith("error: ") and "deployments.yaml" in err[0], err
        return
    assert rc == 0, err
    doc = yaml.safe_load(out)
    assert set(doc) == set(base_doc) and set(doc["services"]) == {SLUG}
    svc, base = doc["services"][SLUG], base_doc["services"][SLUG]
    assert set(svc) == set(base), sorted(set(svc) ^ set(base))
    assert len(svc.get("volumes", [])) == len(base.get("volumes", []))
    assert set(svc.get("environment", {})) - {"EXTRA"} == set(base.get("environment", {}))
    if field == "note":
        assert _unescape(svc["labels"]["io.overlay-manager.note"]) == payload
    elif field == "env_value":
        assert _unescape(svc["environment"]["EXTRA"]) == payload
    elif field == "extra_args":
        assert len(svc["command"]) == len(base["command"]) + 2
        assert _unescape(svc["command"][-1]) == payload
    elif field == "served_name":
        assert len(svc["command"]) == len(base["command"])
        assert payload in [_unescape(a) for a in svc["command"]]
    elif field == "model_dir":
        assert len(svc["command"]) == len(base["command"])
        assert any(_unescape(a).endswith("/" + payload) for a in svc["command"])
    elif field == "shm_size":
        assert _unescape(str(svc.get("shm_size"))) == payload


def test_the_payload_table_has_the_campaigns_size():
    assert len(PAYLOADS) * len(FIELDS) == 78
