"""The Helm chart, rendered by the real Helm engine, checked the way platform teams check charts."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "flashrt"
CRD = CHART / "crds" / "seatprofiles.flashrt.io.yaml"
K8S = "1.30"
# Kinds outside Kubernetes' own schemas; the CRD-defined SeatProfile is checked against the CRD.
NOT_IN_K8S = {"SeatProfile", "ClusterKopfPeering", "PodMonitor", "PrometheusRule", "Issuer", "Certificate"}

COMBINATIONS = {
    "defaults": {},
    "cert-manager": {"certManager": {"enabled": True}},
    "monitoring": {"monitoring": {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}},
    "single replica": {"replicas": 1},
    "everything": {"certManager": {"enabled": True}, "replicas": 3, "webhook": {"failurePolicy": "Fail"},
                   "monitoring": {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}},
}  # fmt: skip


def render(values: dict) -> list[dict]:
    out = helm_python.Chart.load(str(CHART)).render(values, name="fr", namespace="flashrt-system")
    docs = []
    for name, text in out.items():
        if name.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


@pytest.mark.parametrize("values", COMBINATIONS.values(), ids=COMBINATIONS.keys())
def test_every_rendered_object_validates(values):
    docs = render(values)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "MutatingWebhookConfiguration", "ClusterRole", "Service"} <= kinds
    crd_schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for doc in docs:
        if doc["kind"] == "SeatProfile":
            jsonschema.Draft4Validator(crd_schema).validate(doc)
        elif doc["kind"] not in NOT_IN_K8S:
            kubernetes_validate.validate(doc, K8S, strict=True)


def test_strict_lint_is_clean():
    result = helm_python.lint(str(CHART), strict=True)
    assert result["errors"] == [] and [m for m in result["messages"] if m["severity"] > 1] == []


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"replica": 2}, "replica"),
        ({"replicas": "two"}, "replicas"),
        ({"webhook": {"failurePolicy": "Deny"}}, "failurePolicy"),
        ({"monitoring": {"podMonitor": {"interval": "often"}}}, "interval"),
    ],
)
def test_bad_values_are_rejected_by_the_schema(values, field):
    with pytest.raises(helm_python.HelmError, match=field):
        render(values)


def test_rbac_names_every_verb_resource_and_group():
    for doc in render(COMBINATIONS["everything"]):
        for rule in doc.get("rules", []) if doc["kind"] in ("ClusterRole", "Role") else []:
            for key in ("verbs", "resources", "apiGroups"):
                assert "*" not in rule.get(key, []), (doc["metadata"]["name"], rule)


def test_every_workload_container_is_pod_security_restricted():
    for doc in render(COMBINATIONS["everything"]):
        for c in _containers(doc):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"] and sc["readOnlyRootFilesystem"]
            assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault"
            assert c["resources"]["requests"] and c["resources"]["limits"]
            assert c.get("livenessProbe") and c.get("readinessProbe")


def test_webhook_only_sees_opted_in_pods_and_never_its_own_namespace():
    hook = next(d for d in render({}) if d["kind"] == "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["objectSelector"] == {"matchLabels": {"flashrt.io/inject": "enabled"}}
    excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
    assert {"kube-system", "flashrt-system"} <= set(excluded)
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None" and hook["timeoutSeconds"] <= 10
    assert hook["clientConfig"]["service"]["path"] == "/inject"


def test_generated_ca_signs_the_served_certificate():
    docs = render({})
    secret = next(d for d in docs if d["kind"] == "Secret")
    hook = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b((?:flashrt|vllm)[:_][a-zA-Z0-9_:]+)", expr))


def test_dashboard_and_alerts_use_documented_metrics_and_show_every_seat_metric():
    documented = set(re.findall(r"^\| `(flashrt_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text(), re.M))
    documented |= {"flashrt_operator_admissions_total", "flashrt_operator_handler_errors_total"}
    dashboard = json.loads((CHART / "dashboards" / "flashrt-seats.json").read_text())
    used_dashboard = set().union(*(_metric_names(t["expr"]) for p in dashboard["panels"] for t in p["targets"]))
    rules = next(d for d in render(COMBINATIONS["monitoring"]) if d["kind"] == "PrometheusRule")
    used_alerts = set().union(*(_metric_names(r["expr"]) for g in rules["spec"]["groups"] for r in g["rules"]))
    ours = {m for m in used_dashboard | used_alerts if m.startswith("flashrt")}
    assert ours <= documented, ours - documented
    seat_metrics = {m for m in documented if m.startswith(("flashrt_seat", "flashrt_seats"))}
    assert seat_metrics <= used_dashboard, seat_metrics - used_dashboard
    assert any(m.startswith("vllm:") for m in used_dashboard), "vLLM's own throughput sits beside the seats"


def test_every_alert_and_dashboard_query_is_promql():
    """Prometheus's grammar (``promql-parser``) on each rendered alert and each dashboard query,
    Grafana's variables given values: a query that does not parse never fires or draws, and
    nothing else would say so."""
    import promql_parser

    rules = next(d for d in render(COMBINATIONS["monitoring"]) if d["kind"] == "PrometheusRule")
    alerts = {r["alert"]: r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]}
    dashboard = json.loads((CHART / "dashboards" / "flashrt-seats.json").read_text())
    grafana = {"$__rate_interval": "5m", "$__range": "1h", "$namespace": "default"}
    queries = {f"{p['title']}: {t['expr']}": t["expr"] for p in dashboard["panels"] for t in p["targets"]}
    for name, expr in (alerts | queries).items():
        for variable, value in grafana.items():
            expr = expr.replace(variable, value)
        try:
            promql_parser.parse(expr)
        except ValueError as exc:
            raise AssertionError(f"{name}: {exc}") from exc
    assert "FlashrtSeatsIdle" in alerts
    with pytest.raises(ValueError):
        promql_parser.parse(alerts["FlashrtSeatsIdle"].replace("(rate(", "(rate((", 1))


def test_crd_is_valid_and_its_defaults_are_the_profile_defaults():
    """The CRD, the operator's profile and the runtime's agree: a profile that sets nothing
    gives a pod the runtime's own defaults."""
    from flashrt.operator.profile import Profile, from_object
    from flashrt.runtime.profile import SeatProfile

    crd = yaml.safe_load(CRD.read_text())
    kubernetes_validate.validate(crd, K8S, strict=True)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    defaults = {k: v["default"] for k, v in spec.items() if "default" in v}
    parsed = from_object({"metadata": {"name": "default"}, "spec": defaults})
    assert parsed == Profile()
    assert spec["parityFloor"]["default"] == Profile().parity_floor == SeatProfile().parity_floor
    # No band in the CRD or the operator: the pod gets no FLASHRT_MOE_BAND_T, and the runtime
    # picks the GPU's own (``ops.moe_band``), which the operator cannot know.
    assert "default" not in spec["moeBandT"] and Profile().moe_band_t is None is SeatProfile().moe_band_t
    assert "FLASHRT_MOE_BAND_T" not in dict(Profile().env())


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or str(Path(__import__("sys").executable).with_name("hadolint"))
    done = subprocess.run(
        [hadolint, "--failure-threshold", "warning", str(ROOT / "Dockerfile")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


CHART_README = CHART / "README.md"


def _checkov() -> str:
    """The checkov of ``make test`` (its own environment); run outside make, the same path."""
    return os.environ.get("FLASHRT_CHECKOV") or str(Path(__file__).resolve().parents[1] / ".venv-checkov/bin/checkov")


@pytest.mark.parametrize("values", COMBINATIONS.values(), ids=COMBINATIONS.keys())
def test_checkov_finds_nothing_the_chart_readme_does_not_justify(values, tmp_path):
    for i, doc in enumerate(render(values)):
        (tmp_path / f"{i:02d}-{doc['kind']}.yaml").write_text(yaml.safe_dump(doc))
    done = subprocess.run(
        [_checkov(), "-d", str(tmp_path), "--framework", "kubernetes", "--skip-download", "--quiet", "-o", "json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert report["summary"]["passed"] > 50, "checkov ran its Kubernetes checks"
    failed = {check["check_id"] for check in report["results"]["failed_checks"]}
    justified = set(re.findall(r"^\| (CKV\w+) \|", CHART_README.read_text(), flags=re.M))
    assert failed <= justified, f"unjustified checkov findings: {sorted(failed - justified)}"
    assert "CKV2_K8S_6" not in failed, "the NetworkPolicy selects the operator pods"


def test_images_are_pulled_by_digest_when_one_is_given():
    digest = "sha256:" + "ab" * 32
    docs = render({"image": {"repository": "r/operator", "digest": digest},
                   "runtimeImage": {"repository": "r/runtime", "digest": digest}})  # fmt: skip
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"r/operator@{digest}"
    assert {"name": "FLASHRT_OPERATOR_RUNTIME_IMAGE", "value": f"r/runtime@{digest}"} in container["env"]


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_operator_image_installs_from_wheels_alone_on_amd64_and_arm64(arch, tmp_path):
    """The operator stage is Debian bookworm's Python 3.11 with no compiler: every dependency of
    ``flashrt[operator]`` must exist as a binary wheel for amd64 and for arm64 (Jetson Thor
    nodes), or the image would not build there (its install says ``--only-binary=:all:``).
    Resolved by pip for that platform, as the Dockerfile's install does, without building it."""
    import sys
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["operator"]
    platforms = [f"--platform={p}_{arch}" for p in ("manylinux2014", "manylinux_2_17", "manylinux_2_28")]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.11",
         "--implementation", "cp", *platforms, "-d", str(tmp_path), *extra],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    wheels = [w.name for w in tmp_path.glob("*.whl")]
    assert any(w.startswith("kopf-") for w in wheels) and any(w.startswith("uvloop-") for w in wheels)
    assert all(w.endswith("-none-any.whl") or arch in w for w in wheels), wheels


def _stages() -> dict[str, dict]:
    """The Dockerfile's stages by name: the image each starts from and its instructions."""
    stages: dict[str, dict] = {}
    for line in (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines():
        words = line.split()
        if words and words[0] == "FROM":
            base, name = [w for w in words[1:] if not w.startswith("--")][::2]
            stage = stages[name] = {"from": base, "platform": "--platform=$BUILDPLATFORM" in words}
        elif words and not line.startswith("#") and stages:
            stage.setdefault(words[0], []).append(line.split(maxsplit=1)[1])
    return stages


def test_every_image_starts_from_debian_or_scratch_so_one_archive_builds_both():
    """Every stage starts from ``DEBIAN`` (debian:bookworm-slim), an earlier stage or nothing, so
    that ``make images`` builds both images where only the Debian archive is reachable; the pure
    Python stage runs on the builder's platform; both images run as the pod's user; and the
    runtime image run bare does what the init container the webhook adds does."""
    import json

    from flashrt.operator.constants import BUNDLE_MOUNT
    from flashrt.operator.inject import RESTRICTED_SECURITY_CONTEXT

    text = (ROOT / "Dockerfile").read_text()
    assert "ARG DEBIAN=debian:bookworm-slim" in text.splitlines()
    stages = _stages()
    assert set(stages) == {"build", "busybox", "runtime", "operator"}
    for name, stage in stages.items():
        earlier = list(stages)[: list(stages).index(name)]
        assert stage["from"] in {"${DEBIAN}", "scratch", *earlier}, (name, stage["from"])
        copied = [c.split()[0].removeprefix("--from=") for c in stage.get("COPY", []) if c.startswith("--from=")]
        assert set(copied) <= set(earlier), (name, copied)
    assert stages["build"]["platform"] and not stages["operator"]["platform"] and not stages["runtime"]["platform"]
    uid = str(RESTRICTED_SECURITY_CONTEXT["runAsUser"])
    for image in ("runtime", "operator"):
        assert stages[image]["USER"] == [f"{uid}:{uid}"], image
    runtime = stages["runtime"]
    assert json.loads(runtime["CMD"][0]) == [BUNDLE_MOUNT]
    build_images = _build_images()  # it checks each image as the pod runs it: the same folder and user
    assert build_images.BUNDLE_MOUNT == BUNDLE_MOUNT and f"{uid}:{uid}" == build_images.POD_USER
    assert json.loads(runtime["ENTRYPOINT"][0])[0] == "/bin/busybox"
    assert "--only-binary=:all:" in " ".join(stages["operator"]["RUN"])
    # The build context is what .dockerignore lets through: every source a COPY names, and no more
    # (not the virtual environments or bench/results/).
    text = (ROOT / ".dockerignore").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    kept = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    from_context = [c for stage in stages.values() for c in stage.get("COPY", []) if not c.startswith("--from=")]
    assert lines[0] == "*" and kept == {w.rstrip("/") for c in from_context for w in c.split()[:-1]}
    assert "bench/results/" in lines


def test_the_runtime_bundle_has_no_compiled_file_so_one_layer_serves_every_architecture(tmp_path):
    """The runtime image is a static busybox and the bundle. The bundle holding Python sources
    and metadata alone is what makes the same layer right for amd64 and arm64."""
    import sys

    bundle = tmp_path / "bundle"
    flashrt = str(Path(sys.executable).with_name("flashrt"))
    subprocess.run([flashrt, "bundle", str(bundle)], check=True, capture_output=True)
    files = [p for p in bundle.rglob("*") if p.is_file()]
    assert any(p.name == "vllm_plugin.py" for p in files)
    compiled = {".so", ".pyd", ".dylib", ".a", ".o"}
    assert not [p for p in files if p.suffix in compiled or p.read_bytes()[:4] == b"\x7fELF"]


def _build_images():
    """``deploy/build_images.py`` (a script, run by the host's Python) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_images", ROOT / "deploy" / "build_images.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_s_install_command_pulls_the_images_make_images_pushes():
    """The README's ``helm install`` sets what ``make images --push PREFIX`` prints for it, and
    the chart pulls both images by the digests given: the operator's, and the runtime image the
    webhook injects (a key renamed in the chart, or the script's names changed, fails here)."""
    import re

    build_images = _build_images()
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("make images IMAGES_ARGS=") :].split("```")[0]
    prefix = re.search(r'--push (\S+)"', block).group(1)
    pushed = [
        {"target": target, "repository": build_images.repository(prefix, target), "digest": "sha256:..."}
        for target in build_images.CHECKS
    ]
    assert sorted(re.findall(r"--set \S+", block)) == sorted(build_images.chart_options(pushed))

    digest = "sha256:" + "cd" * 32
    values: dict = {}
    for option in build_images.chart_options([p | {"digest": digest} for p in pushed]):
        for assignment in option.removeprefix("--set ").split(","):
            keys, value = assignment.split("=", 1)
            *parents, last = keys.split(".")
            node = values
            for key in parents:
                node = node.setdefault(key, {})
            node[last] = value
    deployment = next(d for d in render(values) if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"{prefix}/flashrt-operator@{digest}"
    assert {"name": "FLASHRT_OPERATOR_RUNTIME_IMAGE", "value": f"{prefix}/flashrt-runtime@{digest}"} in container["env"]
