"""The plan hash a pod carries as an annotation, and the start-up check that refuses a rank whose plan differs.

The hash is the prepared-plan key (manager/overlays/plans.py `plan_key`) of the deployment's overlay set:
the tool version, the vLLM version, and the (id, directory digest) of every overlay the deployment selects
(edits and kernels). At render time it is computed from the engine profile's pinned vLLM version and the
catalog; at start each rank computes it again from the vLLM package the image holds and the bundle's
catalog, with the bundle's own tool. A rank whose image, bundle or tool differs from what was rendered
prints one line and exits 3 before the server starts, so a multi-node group never mixes overlay sets.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..catalog import Catalog
from ..compose.render import ServicePlan, sh
from ..errors import ComposeError

PLAN_HASH_ANNOTATION = "overlay-manager.io/plan-hash"
PLAN_HASH_ENV = "OVERLAY_PLAN_HASH"
REFUSED_EXIT = 3

# Runs with the image's python3 and the bundle's site/ first on sys.path (standard library + manager only).
_COMPUTE = (
    "import os, sys; from manager.overlays.plans import plan_key; "
    "from manager.state import overlay_digest, package_version, vllm_root; "
    "root = vllm_root(None); d = os.path.join(sys.argv[1], 'catalog', 'overlays'); "
    "print(plan_key(package_version(root) if root else None, True, "
    "{i: overlay_digest(os.path.join(d, i)) for i in sys.argv[2:]}))"
)


def selected_ids(plan: ServicePlan) -> tuple[str, ...]:
    """Every overlay the deployment selects: those `apply` (or the import hook) delivers, then kernel-only ones."""
    return tuple(dict.fromkeys((*plan.overlays, *plan.kernel_overlays)))


def plan_hash(plan: ServicePlan, catalog: Catalog) -> str:
    """The hash each rank must reproduce at start (see the module docstring)."""
    from ..overlays.plans import plan_key
    from ..state import overlay_digest

    requested = {}
    for oid in selected_ids(plan):
        path = catalog.overlays_dir / oid
        if not (path / "overlay.yaml").is_file():
            raise ComposeError(f"{plan.slug}: overlay {oid!r} is not in the catalog ({catalog.overlays_dir})")
        requested[oid] = overlay_digest(os.fspath(path))
    return plan_key(plan.vllm_version or None, True, requested)


def rank_check_script(ids: Sequence[str], bundle_dir: str, rank_flags: bool) -> str:
    """POSIX sh lines that refuse to start when this rank's plan hash differs from $OVERLAY_PLAN_HASH (the pod
    annotation, through the downward API). `rank_flags`: append `--node-rank $LWS_WORKER_INDEX --master-addr
    $LWS_LEADER_ADDRESS` (LeaderWorkerSet >= 0.6 sets both) to the server's arguments."""
    words = " ".join(sh(i) for i in ids)
    lines = [
        "# the plan hash of this rank (its image's vLLM, the bundle's overlays and tool) against the pod's annotation",
        "rank=${LWS_WORKER_INDEX:-0}",
        f'got=$(PYTHONPATH={sh(bundle_dir + "/site")}"${{PYTHONPATH:+:$PYTHONPATH}}" '
        f'"${{OVERLAY_PYTHON:-python3}}" -B -c {sh(_COMPUTE)} {sh(bundle_dir)} {words}) || '
        f'{{ echo "overlay-manager: rank $rank: cannot compute the plan hash" >&2; exit {REFUSED_EXIT}; }}',
        f'if [ "$got" != "${{{PLAN_HASH_ENV}:-}}" ]; then',
        f'  echo "overlay-manager: rank $rank: plan hash $got differs from the pod annotation '
        f'{PLAN_HASH_ANNOTATION}=${{{PLAN_HASH_ENV}:-(none)}}; refusing to join" >&2',
        f"  exit {REFUSED_EXIT}",
        "fi",
    ]
    if rank_flags:
        lines += [
            ': "${LWS_WORKER_INDEX:?set by LeaderWorkerSet >= 0.6}" "${LWS_LEADER_ADDRESS:?set by LeaderWorkerSet}"',
            'set -- "$@" --node-rank "$LWS_WORKER_INDEX" --master-addr "$LWS_LEADER_ADDRESS"',
        ]
    return "\n".join(lines) + "\n"
