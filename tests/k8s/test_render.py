"""`overlay k8s render` of every registry deployment in every layout, validated offline (tests/k8s/schemas.py).

Every slug x layout renders, or is refused with one line when the layout cannot carry it (helm-values: kernel
overlays need a pre-start build the chart has no place for); every rendered core object validates against the
strict schemas of Kubernetes 1.30, 1.33 and 1.37 (kubernetes-validate 1.37.0); the arguments are compose's, the
pods are read-only and unprivileged, and the plan hash is the catalog's.
"""

from __future__ import annotations

import yaml
import pytest

from manager.catalog import Catalog
from manager.compose.plan import plan_all
from manager.compose.registry import load_registry
from manager.errors import ComposeError
from manager.k8s.planhash import PLAN_HASH_ANNOTATION
from manager.k8s.render import LAYOUTS, render, render_plan
from tests.k8s.schemas import VERSIONS, core_objects, validate

CATALOG = Catalog.locate(None)
PLANS = plan_all(load_registry(CATALOG), CATALOG)
CASES = [(slug, layout) for slug in sorted(PLANS) for layout in LAYOUTS]
COUNTS: dict[str, int] = {}


def _refused(slug: str, layout: str) -> bool:
    return layout == "helm-values" and bool(PLANS[slug].kernel_overlays)


@pytest.mark.parametrize(("slug", "layout"), CASES)
def test_every_deployment_and_layout_validates_offline_or_is_refused_in_one_line(slug, layout):
    if _refused(slug, layout):
        with pytest.raises(ComposeError, match=r"^[^\n]*kernel overlays[^\n]*$"):
            render_plan(PLANS[slug], CATALOG, layout)
        return
    r = render_plan(PLANS[slug], CATALOG, layout)
    assert list(yaml.safe_load_all(r.text)) == list(r.objects)  # the text is the objects
    for obj in core_objects(list(r.objects)):
        for version in VERSIONS:
            assert validate(obj, version) == version.rsplit(".", 1)[0]


def _server(obj):
    if obj["kind"] == "Deployment":
        return [obj["spec"]["template"]]
    t = obj["spec"]["leaderWorkerTemplate"]
    return [t["leaderTemplate"], t["workerTemplate"]]


@pytest.mark.parametrize("slug", sorted(PLANS))
def test_pods_run_compose_arguments_read_only_with_gpus_and_the_catalog_plan_hash(slug):
    plan = PLANS[slug]
    for layout, per_pod in (("deployment", plan.gpus), ("lws", 1)):
        r = render_plan(plan, CATALOG, layout)
        for tmpl in _server(r.objects[0]):
            assert tmpl["metadata"]["annotations"][PLAN_HASH_ANNOTATION] == r.plan_hash
            (c,) = tmpl["spec"]["containers"]
            assert c["args"][:len(plan.serve_args)] == list(plan.serve_args)
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["resources"]["limits"]["nvidia.com/gpu"] == per_pod
            mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
            assert mounts["/opt/overlay"]["readOnly"] is True and mounts["/models"]["readOnly"] is True
            assert "/tmp" in mounts and "/dev/shm" in mounts
            (init,) = tmpl["spec"]["initContainers"]
            assert init["volumeMounts"] == [{"name": "overlay-bundle", "mountPath": "/opt/overlay"}]


def test_lws_leader_serves_and_workers_join_headless_with_the_group_size():
    plan = PLANS["gemma4-26b-a4b-awq-3090-tp2"]
    (lws, svc) = render_plan(plan, CATALOG, "lws").objects
    t = lws["spec"]["leaderWorkerTemplate"]
    assert t["size"] == 2
    leader, = t["leaderTemplate"]["spec"]["containers"]
    worker, = t["workerTemplate"]["spec"]["containers"]
    assert leader["args"][-4:] == ["--nnodes", "2", "--master-port", "29501"]
    assert worker["args"][-5:] == ["--nnodes", "2", "--master-port", "29501", "--headless"]
    assert "startupProbe" in leader and "startupProbe" not in worker
    assert svc["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": plan.slug, "role": "leader"}
    with pytest.raises(ComposeError, match="--nodes 3 does not divide tp=2"):
        render_plan(plan, CATALOG, "lws", nodes=3)


def test_helm_values_carry_compose_arguments_without_the_flags_the_chart_sets():
    plan = PLANS["gemma4-26b-a4b-awq-3090-tp2"]
    (values,) = render_plan(plan, CATALOG, "helm-values").objects
    (m,) = values["servingEngineSpec"]["modelSpec"]
    args = list(plan.serve_args)
    for flag in ("--host", "--port"):
        i = args.index(flag)
        del args[i:i + 2]
    assert [m["modelURL"], *m["vllmConfig"]["extraArgs"]] == args
    env = {e["name"]: e.get("value") for e in m["env"]}
    assert env["PYTHONPATH"] == "/opt/overlay/memory" and env["OVERLAY_DELIVERY"] == "memory"


def test_a_changed_overlay_changes_the_plan_hash(tmp_path):
    import shutil

    cat = tmp_path / "cat"
    shutil.copytree(CATALOG.overlays_dir, cat / "overlays", symlinks=True)
    (cat / "profiles").symlink_to(CATALOG.profiles_dir)
    (cat / "compose").mkdir()
    shutil.copy(CATALOG.compose_dir / "deployments.yaml", cat / "compose")
    slug = "gemma4-26b-a4b-awq-3090-tp1"
    (before,) = render(Catalog(cat), [slug], "deployment")
    manifest = cat / "overlays" / PLANS[slug].overlays[0] / "overlay.yaml"
    manifest.write_text(manifest.read_text() + "\n# changed\n")
    (after,) = render(Catalog(cat), [slug], "deployment")
    assert before.plan_hash != after.plan_hash


def test_the_validator_refuses_what_a_cluster_would_refuse():
    import kubernetes_validate

    plan = PLANS["gemma4-26b-a4b-awq-3090-tp1"]
    dep = render_plan(plan, CATALOG, "deployment").objects[0]
    bad = yaml.safe_load(yaml.safe_dump(dep))
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(bad, VERSIONS[-1])
    bad = yaml.safe_load(yaml.safe_dump(dep))
    bad["spec"]["template"]["spec"]["containers"][0]["readOnly"] = True  # no such field (strict)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(bad, VERSIONS[-1])
