"""The ``vllm.general_plugins`` entry point: seats installed in every vLLM process that loads a model.

vLLM calls ``register()`` in every process it starts (API server, engine core, workers, after
spawn too), and honours its ``VLLM_PLUGINS`` allowlist before calling it. Nothing happens unless
``FLASHRT_ENABLE=1``: installing the package never changes an engine by itself.

What ``register`` does, in the process it runs in:

* The compile cache must not serve an artifact traced before the seats went in, so
  ``VLLM_DISABLE_COMPILE_CACHE=1`` is set when the user has not set it.
* torch.compile launches its Triton kernels with PDL (``TORCHINDUCTOR_ENABLE_PDL=1``) when the
  user has not set it: the seated projections start copying their weights while the kernel
  before them finishes only after a kernel launched so (``inductor_pdl_on``).
* On the CPU backend, vLLM repacks an unquantized linear's weight after loading and empties
  ``layer.weight``; the repacking function is wrapped so that the bf16 weight is kept until the
  seats have quantized it (then dropped).
* flashrt's log goes out through vLLM's handlers at vLLM's level, so the seat table that
  ``attach`` logs (each refusal with its reason) is in the engine's log with vLLM's own lines:
  vLLM configures its ``vllm`` logger, not the root, and without this an INFO line of ours was
  dropped and a warning printed in Python's last-resort format.
* Each model runner's ``load_model`` (CPU runner, GPU V1 and V2 runners, whichever this vLLM
  has) is wrapped: before it, the compile it sets up gets ``fusion``'s post-grad pass
  (``fuse_in_compile``); after the weights load and before the first compiled trace (warm-up and
  capture come later), ``attach_vllm`` seats the model. Tensor-parallel ranks each load their
  shard and seat it; interception is at ``quant_method`` so ``RowParallelLinear`` still
  all-reduces in its own forward.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys

log = logging.getLogger("flashrt")
RUNNERS = (
    ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"),
)
_STASH = "_flashrt_weight"


def enabled(environ=os.environ) -> bool:
    from flashrt.runtime.profile import _bool

    return _bool("FLASHRT_ENABLE", environ.get("FLASHRT_ENABLE", "0"))


def clean_stale_metrics(directory: str | None = None) -> list[str]:
    """Remove the metric files of processes that are gone (a restarted container keeps its
    emptyDir): otherwise their last gauge values would be summed with the live ones."""
    directory = directory or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory or not os.path.isdir(directory):
        return []
    removed = []
    for name in os.listdir(directory):
        pid = name.removesuffix(".db").rsplit("_", 1)[-1]
        if not (name.endswith(".db") and pid.isdigit()) or _alive(int(pid)):
            continue
        try:
            os.remove(os.path.join(directory, name))
            removed.append(name)
        except OSError:
            pass  # another process of this pod removed it first
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def register() -> None:
    if not enabled():
        return
    os.environ.setdefault("VLLM_DISABLE_COMPILE_CACHE", "1")
    clean_stale_metrics()
    log_as_vllm_does()
    inductor_pdl_on()
    _wrap_once("vllm.model_executor.layers.utils", None, "dispatch_cpu_unquantized_gemm", _keeping_dense_weight)
    _wrap_once(
        "vllm.model_executor.layers.fused_moe.experts.cpu_moe", "CPUUnquantizedExperts",
        "process_weights_after_loading", _keeping_expert_weights,
    )  # fmt: skip
    for module_name, class_name in RUNNERS:
        _wrap_once(module_name, class_name, "load_model", _seating)


def inductor_pdl_on(environ=os.environ) -> bool:
    """torch.compile's Triton kernels launched with PDL (programmatic dependent launch), unless
    the user set ``TORCHINDUCTOR_ENABLE_PDL`` (``0`` keeps it off); whether it was turned on here.

    Each compiled kernel then waits for the kernel before it on the GPU and lets the next one
    launch early, and the seated forms, which follow torch.compile's setting
    (``decode.launch_pdl``), copy their first weight steps before their own wait: in the
    benchmark's captured step Llama-3-8B's seated step ran 2.07 ms against 2.25 at batch 1, and
    bf16's 4.44 against 4.54 (H200, 0d80628). Inductor emits it only for CUDA devices of compute
    capability 9 and up, so elsewhere (the CPU backend, Ampere) nothing changes. The variable is
    set for the processes vLLM spawns from this one, whose inductor reads it on import; an
    inductor already imported here is switched directly. The arithmetic is the same: a kernel
    still reads what the kernels before it wrote only after its wait."""
    if "TORCHINDUCTOR_ENABLE_PDL" in environ:
        return False
    environ["TORCHINDUCTOR_ENABLE_PDL"] = "1"
    config = sys.modules.get("torch._inductor.config")
    if config is not None and hasattr(config.triton, "enable_pdl"):
        config.triton.enable_pdl = True
    return True


def log_as_vllm_does() -> None:
    """flashrt's logger takes the handlers and level of vLLM's, once; nothing where vLLM's has
    no handlers (its logging configuration turned off) or ours has some (the user's)."""
    ours, vllms = logging.getLogger("flashrt"), logging.getLogger("vllm")
    if ours.handlers or not vllms.handlers:
        return
    for handler in vllms.handlers:
        ours.addHandler(handler)
    ours.setLevel(vllms.level)
    ours.propagate = False


def _wrap_once(module_name: str, owner_name: str | None, attr: str, make) -> None:
    """Replace ``module[.owner].attr`` by ``make(original)``, once per process; a piece this
    vLLM or platform does not have is skipped."""
    try:
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        original = getattr(owner, attr)
    except Exception:
        return
    if getattr(original, "_flashrt", False):
        return
    wrapped = functools.wraps(original)(make(original))
    wrapped._flashrt = True
    setattr(owner, attr, wrapped)


def _keeping_dense_weight(original):
    """vLLM's CPU backend repacks an unquantized linear's weight and empties ``layer.weight``:
    keep the loaded weight until the seat has quantized it."""

    def dispatch(layer, remove_weight: bool):
        weight = getattr(layer, "weight", None)
        if remove_weight and weight is not None and weight.dim() == 2 and not weight.is_meta:
            setattr(layer, _STASH, weight.detach().clone())
        return original(layer, remove_weight)

    return dispatch


def _keeping_expert_weights(original):
    """vLLM's CPU experts prepack ``w13_weight``/``w2_weight`` in place: keep the loaded bank."""

    def process(self, layer):
        for name in ("w13_weight", "w2_weight"):
            weight = getattr(layer, name, None)
            if weight is not None and weight.dim() == 3 and not weight.is_meta:
                setattr(layer, f"{_STASH}_{name}", weight.detach().clone())
        return original(self, layer)

    return process


def _serve_own_port() -> None:
    """Without PROMETHEUS_MULTIPROC_DIR vLLM's /metrics cannot see the workers' seats: serve
    them on FLASHRT_METRICS_PORT. With tensor parallelism the first rank to bind wins; the
    multiprocess directory is the way to see every rank on one endpoint."""
    port = os.environ.get("FLASHRT_METRICS_PORT")
    if not port or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    from flashrt.runtime.metrics import serve

    try:
        serve(int(port))
    except OSError as exc:
        log.info("flashrt: metrics port %s already served in this pod (%s)", port, exc)


def eager_decode_warning(device_type: str, cudagraph_mode) -> str | None:
    """What to tell a user whose GPU engine decodes without CUDA graphs (``enforce_eager``, or
    ``cudagraph_mode`` none), or None. A seated call run eagerly costs more host time than bf16's:
    on the H200's host a 4096 x 4096 projection at one token took 74.3 us against 19.2 (ed4426a,
    ``python -m flashrt.bench host``), so an eager decode step, host-bound already, can get
    slower with seats: transformers' eager ``generate()`` at batch 1 ran the seated arm at
    0.49-0.86x bf16 where the captured step ran it at 1.9-2.3x (``bench/results/h200-e2e.json``)."""
    if device_type != "cuda" or getattr(cudagraph_mode, "name", cudagraph_mode) != "NONE":
        return None
    return (
        "flashrt: this engine decodes without CUDA graphs (enforce_eager, or cudagraph_mode none). "
        "A seated call costs more host time than a bf16 one, so eager decode can be slower with seats "
        "than without: drop enforce_eager so that vLLM replays decode steps from CUDA graphs, or remove "
        "the flashrt.io/inject label (FLASHRT_ENABLE) from this workload."
    )


def fuse_in_compile(compilation) -> bool:
    """``fusion.fuse_epilogues`` in the compile vLLM is about to set up: the post-grad hook of
    ``compilation_config.inductor_compile_config``, which vLLM's own backend adds to its pass
    manager (CUDA) and plain inductor runs (the CPU backend). Set before the model is built,
    since both read the hook when the compiled wrapper is made. A pass the user put there stays
    theirs (logged: then nothing is fused); whether the pass was set here."""
    config = getattr(compilation, "inductor_compile_config", None)
    if config is None:
        return False
    if config.get(FUSION_HOOK) is not None:
        log.warning("flashrt: %s holds the user's pass; the activations and norms stay unfused", FUSION_HOOK)
        return False
    try:
        from vllm.compilation.passes.inductor_pass import CallableInductorPass
    except ImportError:  # vLLM before 0.32
        from vllm.compilation.inductor_pass import CallableInductorPass
    from flashrt.runtime import fusion

    config[FUSION_HOOK] = CallableInductorPass(fusion.fuse_epilogues, fusion.EpiloguePass().uuid())
    return True


FUSION_HOOK = "post_grad_custom_post_pass"


def _seating(load_model):
    def wrapped(self, *args, **kwargs):
        fuse_in_compile(getattr(self, "compilation_config", None))
        result = load_model(self, *args, **kwargs)
        from flashrt.runtime.profile import from_env
        from flashrt.runtime.vllm_seats import attach_vllm

        # Errors in the profile stop here with the variable named; strict is attach's to enforce.
        self._flashrt_handle = attach_vllm(self.model, from_env())
        compilation = getattr(self, "compilation_config", None)
        device = getattr(self, "device", None)
        warning = eager_decode_warning(getattr(device, "type", ""), getattr(compilation, "cudagraph_mode", None))
        if warning and any(seat.state == "seated" for seat in self._flashrt_handle.seats):
            log.warning(warning)
        _serve_own_port()
        return result

    return wrapped
