"""Every name the operator puts on a cluster object, in one place (the injector's contract)."""

GROUP = "flashrt.io"
VERSION = "v1alpha1"
PROFILE_ANNOTATION = f"{GROUP}/profile"
STATUS_ANNOTATION = f"{GROUP}/status"  # "injected" or "skipped: <reason>"
RECORD_ANNOTATION = f"{GROUP}/injected"  # what inject changed, so that uninject undoes exactly that
CONTAINER_ANNOTATION = f"{GROUP}/container"
INJECT_LABEL = f"{GROUP}/inject"
INJECT_LABEL_VALUE = "enabled"
DEFAULT_PROFILE = "default"

INIT_CONTAINER = "flashrt-bundle"
BUNDLE_VOLUME = "flashrt-bundle"
BUNDLE_MOUNT = "/opt/flashrt"  # the runtime package and its dist-info; prepended to PYTHONPATH
BUNDLE_SIZE_LIMIT = "256Mi"  # the bundle is pure Python, about 1 MB; the limit guards the node
METRICS_VOLUME = "flashrt-metrics"
METRICS_MOUNT = "/var/run/flashrt/metrics"  # PROMETHEUS_MULTIPROC_DIR: every vLLM process's files
METRICS_SIZE_LIMIT = "64Mi"
# Kernel choices (FLASHRT_CACHE_DIR) and Triton's compiled kernels (TRITON_CACHE_DIR) on an
# emptyDir, which outlives container restarts: on the H200 the Qwen3.5-35B-shaped model attached
# in 23.0 s with no choices kept and 3.9 s with them (on the GPUs whose choices the package ships,
# kernels/choices/, a new pod starts from those). No sizeLimit: going over one evicts the pod,
# and these bytes sat in the container's writable layer before, counted the same way against the
# pod's ephemeral storage.
CACHE_VOLUME = "flashrt-cache"
CACHE_MOUNT = "/var/cache/flashrt"
TRITON_CACHE = f"{CACHE_MOUNT}/triton"

DEFAULT_RUNTIME_IMAGE = "ghcr.io/flashrt/flashrt-runtime:0.1.0"

# GPU Feature Discovery's label: Blackwell is 10 (data centre) and 12 (RTX), Jetson Thor 11,
# Hopper 9. Select on compute major, not on family: Thor has no family label.
COMPUTE_MAJOR_LABEL = "nvidia.com/gpu.compute.major"

# The engine environment design.md asks for, set only where the user has not set it.
ENGINE_ENV = {
    "VLLM_DISABLE_COMPILE_CACHE": "1",  # a cached compiled graph would bypass the seats
    "VLLM_WORKER_MULTIPROC_METHOD": "fork",
}
