"""Injection on realistic pods: full pod in, full pod out, validated by Kubernetes' own schema."""

import copy
import json

import jsonpatch
import kubernetes_validate
import pytest
from flashrt.operator.constants import (
    BUNDLE_MOUNT,
    CACHE_MOUNT,
    CACHE_VOLUME,
    COMPUTE_MAJOR_LABEL,
    INIT_CONTAINER,
    METRICS_MOUNT,
    RECORD_ANNOTATION,
    STATUS_ANNOTATION,
    TRITON_CACHE,
)
from flashrt.operator.inject import Settings, inject, uninject
from flashrt.operator.profile import Profile, from_object
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

K8S = "1.30"


def vllm_production_stack_pod():
    """The pod template vLLM's production-stack chart renders for one model, as a pod."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "vllm-llama3-deployment-vllm-7d9f",
            "labels": {"model": "llama3", "helm-release-name": "vllm", "flashrt.io/inject": "enabled"},
            "annotations": {"flashrt.io/profile": "default"},
        },
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "command": [
                        "vllm",
                        "serve",
                        "meta-llama/Llama-3.1-8B-Instruct",
                        "--host",
                        "0.0.0.0",
                        "--port",
                        "8000",
                    ],
                    "env": [
                        {"name": "HF_HOME", "value": "/data"},
                        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
                        {"name": "LMCACHE_LOG_LEVEL", "value": "DEBUG"},
                    ],
                    "ports": [{"name": "container-port", "containerPort": 8000}],
                    "resources": {
                        "requests": {"cpu": "10", "memory": "64Gi", "nvidia.com/gpu": "1"},
                        "limits": {"nvidia.com/gpu": "1"},
                    },
                    "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5},
                    "livenessProbe": {"httpGet": {"path": "/health", "port": 8000}, "initialDelaySeconds": 240},
                    "volumeMounts": [
                        {"name": "vllm-storage", "mountPath": "/data"},
                        {"name": "shm", "mountPath": "/dev/shm"},
                    ],
                }
            ],
            "volumes": [
                {"name": "vllm-storage", "persistentVolumeClaim": {"claimName": "vllm-llama3-storage-claim"}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "20Gi"}},
            ],
            "runtimeClassName": "nvidia",
        },
    }


def kserve_predictor_pod():
    """A KServe Hugging Face predictor on the vLLM backend, with Knative's queue-proxy beside it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "qwen-predictor-00001-deployment-5c",
            "labels": {"serving.kserve.io/inferenceservice": "qwen"},
        },
        "spec": {
            "containers": [
                {
                    "name": "kserve-container",
                    "image": "kserve/huggingfaceserver:v0.15.0-gpu",
                    "args": ["--model_name=qwen", "--model_id=Qwen/Qwen3-30B-A3B", "--backend=vllm"],
                    "env": [{"name": "PORT", "value": "8080"}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False},
                },
                {
                    "name": "queue-proxy",
                    "image": "gcr.io/knative-releases/queue:v1.15",
                    "ports": [{"containerPort": 8012}],
                },
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "node.kubernetes.io/instance-type",
                                        "operator": "In",
                                        "values": ["p5.48xlarge"],
                                    }
                                ]
                            },
                            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]},
                        ]
                    }
                }
            },
        },
    }


def multi_container_pod():
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "mixtral", "annotations": {"team": "ml"}},
        "spec": {
            "initContainers": [
                {"name": "download-model", "image": "amazon/aws-cli:2", "args": ["s3", "sync", "s3://m", "/models"]}
            ],
            "containers": [
                {"name": "logger", "image": "fluent/fluent-bit:3.0"},
                {
                    "name": "server",
                    "image": "registry.local/serving:1.4",
                    "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                    "env": [
                        {"name": "PYTHONPATH", "value": "/app/lib"},
                        {"name": "VLLM_WORKER_MULTIPROC_METHOD", "value": "spawn"},
                    ],
                },
            ],
        },
    }


def _with_env(env):
    pod = vllm_production_stack_pod()
    pod["spec"]["containers"][0]["env"] = env
    return pod


def _annotated(pod, **annotations):
    pod["metadata"].setdefault("annotations", {}).update(annotations)
    return pod


PROFILE = Profile()


def _env(pod, container="vllm"):
    c = next(c for c in pod["spec"]["containers"] if c["name"] == container)
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def _check(pod_in, result):
    """Every produced pod validates; the patch turns the input into it."""
    kubernetes_validate.validate(result.pod, K8S, strict=True)
    assert jsonpatch.apply_patch(pod_in, result.patch) == result.pod


@pytest.mark.parametrize(
    ("make", "container"),
    [(vllm_production_stack_pod, "vllm"), (kserve_predictor_pod, "kserve-container"), (multi_container_pod, "server")],
    ids=["vLLM production-stack pod", "KServe predictor pod", "multi-container pod with init containers"],
)
def test_injects_the_vllm_container_and_round_trips(make, container):
    pod = make()
    kubernetes_validate.validate(pod, K8S, strict=True)
    result = inject(pod, PROFILE)
    assert result.injected and result.container == container
    _check(pod, result)
    out = result.pod
    env = _env(out, container)
    assert env["FLASHRT_ENABLE"] == "1" and env["PROMETHEUS_MULTIPROC_DIR"] == METRICS_MOUNT
    assert env["PYTHONPATH"].split(":")[0] == BUNDLE_MOUNT
    assert out["spec"]["initContainers"][-1]["name"] == INIT_CONTAINER
    assert out["metadata"]["annotations"][STATUS_ANNOTATION] == "injected"
    others = [c for c in out["spec"]["containers"] if c["name"] != container]
    assert others == [c for c in pod["spec"]["containers"] if c["name"] != container], "other containers untouched"
    assert uninject(out) == pod, "uninject removes exactly what inject added"
    assert inject(out, PROFILE).status == "unchanged" and inject(out, PROFILE).patch == []


def test_an_existing_literal_pythonpath_is_wrapped_and_user_settings_win():
    pod = multi_container_pod()
    env = _env(inject(pod, PROFILE).pod, "server")
    assert env["PYTHONPATH"] == f"{BUNDLE_MOUNT}:/app/lib"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn", "the user's choice is kept"
    assert env["VLLM_DISABLE_COMPILE_CACHE"] == "1"


def test_kernel_choices_and_triton_cache_live_on_an_emptydir_that_outlives_container_restarts():
    pod = vllm_production_stack_pod()
    out = inject(pod, PROFILE).pod
    env = _env(out)
    assert env["FLASHRT_CACHE_DIR"] == CACHE_MOUNT and env["TRITON_CACHE_DIR"] == TRITON_CACHE
    mounts = {m["name"]: m for m in out["spec"]["containers"][0]["volumeMounts"]}
    assert mounts[CACHE_VOLUME] == {"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT}
    volumes = {v["name"]: v for v in out["spec"]["volumes"]}
    assert volumes[CACHE_VOLUME] == {"name": CACHE_VOLUME, "emptyDir": {}}, "a sizeLimit would evict the pod"
    assert uninject(out) == pod


@pytest.mark.parametrize(
    ("env", "mounts"),
    [
        ([{"name": "TRITON_CACHE_DIR", "value": "/models/triton"}], []),
        ([{"name": "TRITON_HOME", "value": "/models"}], []),
        ([], [{"name": "vllm-storage", "mountPath": "/root/.triton"}]),
        ([], [{"name": "vllm-storage", "mountPath": "/home/vllm/.triton/cache"}]),
    ],
    ids=["TRITON_CACHE_DIR", "TRITON_HOME", "a volume at ~/.triton", "a volume at ~/.triton/cache"],
)
def test_a_triton_cache_the_user_keeps_stays_where_it_is(env, mounts):
    pod = vllm_production_stack_pod()
    container = pod["spec"]["containers"][0]
    container["env"] += env
    container["volumeMounts"] += mounts
    result = inject(pod, PROFILE)
    _check(pod, result)
    out = result.pod
    assert _env(out).get("TRITON_CACHE_DIR") == next((e["value"] for e in env if e["name"] == "TRITON_CACHE_DIR"), None)
    assert _env(out)["FLASHRT_CACHE_DIR"] == CACHE_MOUNT
    assert uninject(out) == pod


def test_a_setting_overrides_the_field_that_sets_the_same_variable_once():
    spec = {"moeBandT": 32, "settings": {"FLASHRT_MOE_BAND_T": "8", "FLASHRT_MAX_FAULTS": "5"}}
    out = inject(vllm_production_stack_pod(), from_object({"metadata": {"name": "p"}, "spec": spec})).pod
    names = [e["name"] for e in out["spec"]["containers"][0]["env"]]
    assert names.count("FLASHRT_MOE_BAND_T") == 1 and _env(out)["FLASHRT_MOE_BAND_T"] == "8"
    assert _env(out)["FLASHRT_MAX_FAULTS"] == "5"


def test_a_cache_dir_from_the_container_or_the_profile_wins_and_is_set_once():
    pod = _with_env([{"name": "FLASHRT_CACHE_DIR", "value": "/data/flashrt"}])
    assert _env(inject(pod, PROFILE).pod)["FLASHRT_CACHE_DIR"] == "/data/flashrt"
    profile = from_object({"metadata": {"name": "p"}, "spec": {"settings": {"FLASHRT_CACHE_DIR": "/data/choices"}}})
    out = inject(vllm_production_stack_pod(), profile).pod
    names = [e["name"] for e in out["spec"]["containers"][0]["env"]]
    assert names.count("FLASHRT_CACHE_DIR") == 1 and _env(out)["FLASHRT_CACHE_DIR"] == "/data/choices"


def test_required_placement_joins_every_existing_node_selector_term():
    out = inject(kserve_predictor_pod(), PROFILE).pod
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert len(terms) == 2
    for term in terms:
        assert term["matchExpressions"][-1] == {
            "key": COMPUTE_MAJOR_LABEL,
            "operator": "In",
            "values": ["10", "11", "12"],
        }


@pytest.mark.parametrize("placement", ["Preferred", "None"])
def test_other_placements(placement):
    pod = vllm_production_stack_pod()
    out = inject(pod, Profile(placement=placement, compute_majors=(9, 10))).pod
    if placement == "None":
        assert "affinity" not in out["spec"]
    else:
        preferred = out["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert preferred[0]["preference"]["matchExpressions"][0]["values"] == ["9", "10"]
    assert uninject(out) == pod


SKIPS = [
    (
        "no vLLM container",
        lambda: {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}]},
        },
        "no vLLM container",
    ),
    (
        "PYTHONPATH from valueFrom",
        lambda: _with_env([{"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "p"}}}]),
        "PYTHONPATH comes from valueFrom",
    ),
    (
        "plugins allowlist without flashrt",
        lambda: _with_env([{"name": "VLLM_PLUGINS", "value": "lora_resolver"}]),
        "VLLM_PLUGINS='lora_resolver' does not allow the flashrt plugin",
    ),
    (
        "named container missing",
        lambda: _annotated(vllm_production_stack_pod(), **{"flashrt.io/container": "main"}),
        "names container 'main'",
    ),
]


@pytest.mark.parametrize(("make", "reason"), [(m, r) for _, m, r in SKIPS], ids=[s[0] for s in SKIPS])
def test_skips_admit_the_pod_unchanged_but_for_the_status(make, reason):
    pod = make()
    result = inject(pod, PROFILE)
    assert result.status.startswith("skipped: ") and reason in result.reason
    _check(pod, result)
    changed = copy.deepcopy(result.pod)
    del changed["metadata"]["annotations"][STATUS_ANNOTATION]
    if not changed["metadata"]["annotations"]:
        del changed["metadata"]["annotations"]
    assert changed == pod
    assert result.patch == [{"op": "add", "path": result.patch[0]["path"], "value": result.patch[0]["value"]}]


def test_profile_settings_reach_the_container_and_the_record_says_what_was_added():
    profile = from_object(
        {
            "metadata": {"name": "moe"},
            "spec": {"seats": {"head": False}, "moeBandT": 32, "settings": {"FLASHRT_MAX_FAULTS": "5"}},
        }
    )
    out = inject(vllm_production_stack_pod(), profile).pod
    env = _env(out)
    assert (
        env["FLASHRT_KINDS"] == "dense,experts"
        and env["FLASHRT_MOE_BAND_T"] == "32"
        and env["FLASHRT_MAX_FAULTS"] == "5"
    )
    record = json.loads(out["metadata"]["annotations"][RECORD_ANNOTATION])
    assert "FLASHRT_MAX_FAULTS" in record["env"] and "HF_HOME" not in record["env"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"placement": "Always"}, "spec.placement: got 'Always', need one of"),
        ({"parityFloor": 2}, r"spec.parityFloor: got 2, need a number in \(0, 1\]"),
        ({"computeMajors": [10, "eleven"]}, "spec.computeMajors: 'eleven' is not a GPU compute major"),
        ({"seats": {"attention": True}}, r"spec.seats: unknown kinds \['attention'\]"),
        ({"settings": {"FLASHRT_MAX_FAULTS": 5}}, "spec.settings.FLASHRT_MAX_FAULTS: got 5, need a string"),
        ({"settings": {"VLLM_FOO": "1"}}, r"spec.settings.VLLM_FOO: only FLASHRT_\* variables"),
        ({"moeBandT": True}, "spec.moeBandT: got True"),
        ({"typo": 1}, r"spec: unknown fields \['typo'\]"),
    ],
)
def test_invalid_profiles_name_the_field_and_the_fix(spec, message):
    with pytest.raises(ValueError, match=message):
        from_object({"metadata": {"name": "bad"}, "spec": spec})


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12).filter(
    lambda s: s[0].isalpha() and s[-1] != "-"
)
env_names = st.sampled_from(
    ["PYTHONPATH", "HF_HOME", "VLLM_WORKER_MULTIPROC_METHOD", "FLASHRT_KINDS", "OMP_NUM_THREADS"]
)
env_entry = st.builds(lambda n, v: {"name": n, "value": v}, env_names, st.text(alphabet="abc/:0123", max_size=10))
container = st.fixed_dictionaries(
    {"name": names, "image": st.sampled_from(["vllm/vllm-openai:v0.11.0", "nginx:1", "registry/x:1"])},
    optional={
        "env": st.lists(env_entry, max_size=4, unique_by=lambda e: e["name"]),
        "args": st.lists(st.sampled_from(["serve", "--backend=vllm", "--port=8000"]), max_size=3),
    },
)
pods = st.builds(
    lambda cs, profile_name, placement: (
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "annotations": {"flashrt.io/profile": profile_name}},
            "spec": {"containers": cs},
        },
        Profile(placement=placement),
    ),
    st.lists(container, min_size=1, max_size=3, unique_by=lambda c: c["name"]),
    names,
    st.sampled_from(["Required", "Preferred", "None"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods)
def test_fuzzed_pods_never_raise_patches_apply_and_results_validate(case):
    pod, profile = case
    result = inject(pod, profile, Settings())
    _check(pod, result)
    if result.injected:
        assert uninject(result.pod) == pod


DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: vllm-qwen
spec:
  replicas: 2
  selector:
    matchLabels: {app: vllm-qwen}
  template:
    metadata:
      labels: {app: vllm-qwen, flashrt.io/inject: enabled}
    spec:
      containers:
      - name: vllm
        image: vllm/vllm-openai:v0.11.0
        args: ["--model", "Qwen/Qwen3-30B-A3B", "--tensor-parallel-size", "2"]
        resources: {limits: {nvidia.com/gpu: "2"}}
---
apiVersion: v1
kind: Service
metadata: {name: vllm-qwen}
spec:
  selector: {app: vllm-qwen}
  ports: [{port: 8000}]
---
apiVersion: v1
kind: List
items:
- apiVersion: apps/v1
  kind: StatefulSet
  metadata: {name: vllm-sts}
  spec:
    serviceName: vllm-sts
    selector: {matchLabels: {app: s}}
    template:
      metadata: {labels: {app: s}}
      spec:
        containers: [{name: web, image: nginx:1.27}]
"""


def test_cli_injects_multi_document_yaml_and_uninject_is_the_inverse(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    exe = str(Path(sys.executable).with_name("flashrt"))
    src = tmp_path / "app.yaml"
    src.write_text(DEPLOYMENT)
    profile = tmp_path / "profile.yaml"
    profile.write_text(
        "apiVersion: flashrt.io/v1alpha1\nkind: SeatProfile\nmetadata: {name: hopper}\nspec: {computeMajors: [9]}\n"
    )
    done = subprocess.run(
        [exe, "inject", "-f", str(src), "--profile", str(profile)], capture_output=True, text=True, check=True
    )
    docs = list(yaml.safe_load_all(done.stdout))
    for doc in docs:  # the schemas have no List: its items are validated one by one
        for item in doc["items"] if doc["kind"] == "List" else [doc]:
            kubernetes_validate.validate(item, K8S, strict=True)
    template = docs[0]["spec"]["template"]
    assert template["metadata"]["annotations"][STATUS_ANNOTATION] == "injected"
    expr = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert expr["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["9"]
    assert docs[1] == list(yaml.safe_load_all(DEPLOYMENT))[1], "objects without pods pass unchanged"
    assert "StatefulSet/vllm-sts spec.template: skipped: no vLLM container" in done.stderr
    back = subprocess.run([exe, "uninject", "-f", "-"], input=done.stdout, capture_output=True, text=True, check=True)
    original = list(yaml.safe_load_all(DEPLOYMENT))
    restored = list(yaml.safe_load_all(back.stdout))
    assert restored[0] == original[0] and restored[1] == original[1]
    assert restored[2] == original[2]


def test_cli_rejects_a_bad_profile_with_the_field():
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    exe = str(Path(sys.executable).with_name("flashrt"))
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write("metadata: {name: bad}\nspec: {placement: Sometimes}\n")
        f.flush()
        done = subprocess.run([exe, "inject", "-f", "-", "--profile", f.name], input="", capture_output=True, text=True)
    assert done.returncode == 2 and "spec.placement: got 'Sometimes'" in done.stderr


def test_a_profile_missing_in_the_pod_namespace_comes_from_the_operator_namespace():
    from flashrt.operator.webhook import decide

    profiles = {("flashrt-system", "default"): {"metadata": {"name": "default"}, "spec": {"moeBandT": 8}}}
    pod = vllm_production_stack_pod()
    found = decide(pod, "team-a", lambda ns, n: profiles.get((ns, n)), Settings(), "flashrt-system")
    assert found.reason is None and _env(found.pod)["FLASHRT_MOE_BAND_T"] == "8"
    missing = decide(pod, "team-a", lambda ns, n: profiles.get((ns, n)), Settings())
    assert "SeatProfile team-a/default not found" in missing.reason


def test_workloads_are_named_from_the_pods_owner_and_counted_for_the_profile_they_resolve_to():
    from flashrt.operator import workloads

    def meta(name, ns, owner=None, labels=None, status="injected", profile=None):
        m = {"name": name, "namespace": ns, "labels": labels or {}, "annotations": {STATUS_ANNOTATION: status}}
        if owner:
            m["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
        if profile:
            m["annotations"]["flashrt.io/profile"] = profile
        return m

    pods = [
        meta("web-7f9c-1", "team-a", ("ReplicaSet", "web-7f9c"), {"pod-template-hash": "7f9c"}),
        meta("web-7f9c-2", "team-a", ("ReplicaSet", "web-7f9c"), {"pod-template-hash": "7f9c"}, "skipped: x"),
        meta("moe-0", "team-a", ("StatefulSet", "moe")),
        meta("big-0", "team-b", ("StatefulSet", "big-0"), {workloads.LWS_LABEL: "big"}),
        meta("solo", "team-b"),
        meta("rs-1", "team-b", ("ReplicaSet", "rs")),
        meta("local-0", "team-c", ("StatefulSet", "local")),
    ]
    index: dict = {}
    for m in pods:
        key, entry = workloads.pod_entry(m["namespace"], m)
        index.setdefault(key, []).append(entry)
    assert [workloads.workload_of(m) for m in pods] == [
        ("Deployment", "web"), ("Deployment", "web"), ("StatefulSet", "moe"), ("LeaderWorkerSet", "big"),
        ("Pod", "solo"), ("ReplicaSet", "rs"), ("StatefulSet", "local"),
    ]  # fmt: skip
    local_profiles = {("team-c", "default"), ("flashrt-system", "default")}

    def has(ns, name):
        return (ns, name) in local_profiles

    shared = workloads.profile_workloads(("flashrt-system", "default"), index, has, "flashrt-system")
    assert [(w["namespace"], w["kind"], w["name"], w["pods"], w["injectedPods"]) for w in shared] == [
        ("team-a", "Deployment", "web", 2, 1), ("team-a", "StatefulSet", "moe", 1, 1),
        ("team-b", "LeaderWorkerSet", "big", 1, 1), ("team-b", "Pod", "solo", 1, 1),
        ("team-b", "ReplicaSet", "rs", 1, 1),
    ]  # fmt: skip
    assert [w["name"] for w in workloads.profile_workloads(("team-c", "default"), index, has, "flashrt-system")] == [
        "local"
    ], "a namespace's own profile serves its pods; the shared one does not count them"


def test_a_restart_changes_one_pod_template_annotation_per_template():
    from flashrt.operator.workloads import RESTART_ANNOTATION, restart_patch

    deployment = restart_patch("Deployment", "t")
    assert deployment == {"spec": {"template": {"metadata": {"annotations": {RESTART_ANNOTATION: "t"}}}}}
    lws = restart_patch("LeaderWorkerSet", "t")["spec"]["leaderWorkerTemplate"]
    assert lws["leaderTemplate"] == lws["workerTemplate"] == {"metadata": {"annotations": {RESTART_ANNOTATION: "t"}}}
