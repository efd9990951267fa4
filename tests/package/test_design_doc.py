"""docs/design.md's generated parts stay current: the module map (every module of manager/ with
its docstring's first line) and the public signatures the contracts name.

Regenerate after adding a module or changing a listed signature:
    .venv/bin/python -m tests.package.test_design_doc --write
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT

DOC = REPO_ROOT / "docs" / "design.md"

# The public entry points docs/design.md's contracts describe, by module.
SIGNATURES = {
    "manager.overlays": ["load_overlays", "select", "status", "status_on_release", "apply", "diff", "revert",
                         "find_root", "package_version"],
    "manager.overlays.plans": ["apply_plan"],
    "manager.overlays.prepare": ["prepare"],
    "manager.overlays.applying": ["apply_overlays", "apply_and_record"],
    "manager.state": ["overlay_digest", "package_version"],
    "manager.profiles": ["load_profiles"],
    "manager.fits": ["fits", "plan"],
    "manager.inspect": ["inspect_checkpoint"],
    "manager.compose": ["load_registry", "render_compose"],
    "manager.compose.plan": ["plan_deployment"],
    "manager.compose.check": ["run_check"],
    "manager.compose.bundle": ["build_bundle"],
    "manager.compose.verify": ["verify_image"],
    "manager.upstream": ["check", "decide"],
    "manager.kernels": ["build"],
}


def _first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    line = doc.strip().splitlines()[0] if doc.strip() else ""
    return line.replace("|", "\\|")


def module_map() -> str:
    rows = ["| module | what it holds |", "|---|---|"]
    for p in sorted((REPO_ROOT / "manager").rglob("*.py")):
        rel = p.relative_to(REPO_ROOT).as_posix()
        if "/_catalog/" in rel:
            continue
        rows.append(f"| `{rel}` | {_first_line(p)} |")
    return "\n".join(rows)


def signatures() -> str:
    out = ["```"]
    for mod, names in SIGNATURES.items():
        m = importlib.import_module(mod)
        for name in names:
            sig = str(inspect.signature(getattr(m, name))).replace("'", "")
            out.append(f"{mod}.{name}{sig}")
    out.append("```")
    return "\n".join(out)


def _blocks() -> dict[str, str]:
    return {"module-map": module_map(), "signatures": signatures()}


def render(text: str) -> str:
    for name, body in _blocks().items():
        pattern = re.compile(rf"(<!-- generated: {name} .*?-->\n)(?:.*?\n)?(<!-- /generated: {name} -->)", re.S)
        assert pattern.search(text), f"docs/design.md lacks the generated block {name!r}"
        text = pattern.sub(lambda mo: mo.group(1) + body + "\n" + mo.group(2), text)
    return text


def test_design_doc_generated_blocks_are_current():
    text = DOC.read_text()
    assert render(text) == text, "docs/design.md is stale: run `.venv/bin/python -m tests.package.test_design_doc --write`"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        DOC.write_text(render(DOC.read_text()))
    else:
        sys.stdout.write(render(DOC.read_text()))
