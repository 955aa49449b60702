"""Form adjudication: which kernel form and config serves a shape on this device, by measurement.

design.md's rules: candidates are qualified by device-neutral facts (the form builds here, the
config fits the shape), qualified ones are timed on the real shape, a candidate enters only at
or above the parity floor, and within a 3% win margin the higher-precision form wins, so noise
never flips a choice. ``adjudicate`` is the pure decision; ``Tuner`` measures and caches.

Choices are cached per device and shape bucket in memory (a process never re-tunes a shape)
and in a JSON file under ``FLASHRT_CACHE_DIR`` (default ``~/.cache/flashrt``), so the
tensor-parallel ranks and restarts of one node reuse them. Inside CUDA-graph capture nothing
is timed: an uncached shape takes the first qualified candidate.

The package ships the choices measured on the GPUs we benchmark (``SHIPPED``), as vLLM ships
its fused-MoE configs per device: a shape this node has not measured is served the shipped
choice for the same device name, compute capability and Triton version, if it was made among
the candidates this build offers. The node's own choices win over shipped ones.

Before a shape's candidates are timed, their kernels are compiled together on a thread pool
(``compile_ahead``): timing one candidate after another compiled each on first use, one at a time.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import functools
import json
import os
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

PARITY_FLOOR = 0.99
WIN_MARGIN = 0.03
# Measured choices committed from the benchmark GPUs (an H200 and an H100, with the Triton each
# ran), one file a device key as under FLASHRT_CACHE_DIR. A fresh pod measures every shape it
# meets at attach: on an H100, Qwen3-30B-A3B attached in 52 s at 2 layers with none kept
# (7d18d9f) and in 4.3 s at full depth with its choices (1901c0d); on the H200 the
# Qwen3.5-35B-shaped model in 23.0 s against 3.9 s. Served from here with an empty node cache
# (H100, d68f191): Llama-3-8B attached in 9.3 s against 16.8 measuring and 8.5 from the node.
SHIPPED = Path(__file__).resolve().parent / "choices"
SHIPPED_SWITCH = "FLASHRT_SHIPPED_CHOICES"
# Where a choice came from: measured in this process, this node's cache, the shipped table.
SOURCES = ("measured", "node", "shipped")


@dataclass(frozen=True)
class Candidate:
    form: str
    config: tuple[tuple[str, int], ...]
    precision: int = 0  # higher wins ties inside the margin (W4A16 > W4A4)

    @property
    def params(self) -> dict:
        return dict(self.config)

    @property
    def name(self) -> str:
        return self.form + "[" + ",".join(f"{k}={v}" for k, v in self.config) + "]"


def candidate(form: str, config: dict, precision: int = 0) -> Candidate:
    return Candidate(form, tuple(sorted(config.items())), precision)


@dataclass(frozen=True)
class Outcome:
    candidate: Candidate
    time_us: float | None = None  # None: not timed
    parity: float | None = None
    refused: str | None = None  # the reason, in words


@dataclass(frozen=True)
class Verdict:
    winner: Candidate | None
    notes: tuple[str, ...] = field(default=())


def adjudicate(outcomes: list[Outcome], parity_floor: float = PARITY_FLOOR, margin: float = WIN_MARGIN) -> Verdict:
    """Pick the winner among measured outcomes; every outcome leaves a note."""
    notes = []
    entrants = []
    for o in outcomes:
        if o.refused:
            notes.append(f"{o.candidate.name}: refused: {o.refused}")
        elif o.time_us is None:
            notes.append(f"{o.candidate.name}: not timed")
        elif o.parity is not None and not o.parity >= parity_floor:  # NaN too: a NaN output is no parity
            notes.append(f"{o.candidate.name}: refused: parity {o.parity:.4f} under floor {parity_floor}")
        else:
            entrants.append(o)
            notes.append(
                f"{o.candidate.name}: {o.time_us:.2f} us" + (f", parity {o.parity:.5f}" if o.parity is not None else "")
            )
    if not entrants:
        return Verdict(None, tuple(notes))
    fastest = min(o.time_us for o in entrants)
    close = [o for o in entrants if o.time_us <= fastest * (1 + margin)]
    best_precision = max(o.candidate.precision for o in close)
    winner = min((o for o in close if o.candidate.precision == best_precision), key=lambda o: o.time_us)
    notes.append(f"winner {winner.candidate.name} at {winner.time_us:.2f} us")
    return Verdict(winner.candidate, tuple(notes))


def compile_ahead(launches: Iterable[Callable[[], object]], workers: int | None = None) -> int:
    """Compile every Triton kernel the ``launches`` would compile, on ``workers`` threads (default:
    one for each core this process may run on, ``os.sched_getaffinity``: a pod's cpuset can hold
    fewer than the node's ``os.cpu_count()``), and return how many were compiled.

    Each launch runs once in this thread as Triton's warmup (``JITFunction.run`` with
    ``warmup=True``), with its compiles recorded instead of done: no kernel is launched, compiled
    or not, and outputs are left as they were. Until session 57 a kernel already compiled ran:
    a launch of several kernels whose first was not yet compiled then ran a later one on the
    first one's unwritten outputs. On an H100 with no choice cached for Qwen3-30B's expert bank
    at one token, the adjudication after one at 16 tokens faulted on an illegal address, which
    ends the process's CUDA context (every candidate and the host path after it failed, the
    engine with them; ``bench/results/h100-e2e-qwen3-30b-a3b-ef16f11.log``). By the code and
    that log: the grouping launch at 8 pairs (not a multiple of 16, so its own specialization)
    had never been compiled, while the grouped gate_ups, whose arguments do not change with the
    token count, had been at 16 tokens, and one read the unwritten grouping.

    Then the recorded specializations are compiled in parallel (``JITFunction.preload`` under
    ``AsyncCompileMode``) into the kernels' caches, so the launches that follow find them built.
    ptxas runs as a child process and Triton's passes let go of the GIL, so threads overlap part
    of each compile (the Python front end holds it). On the H200's 16 cores, adjudicating afresh
    with empty caches (``bench/probe_compile_ahead.py``, ``h200-probe-compile-ahead-17801e0.json``):
    Llama's qkv at one token, 46 candidates, in 13.9 s against 27.3 one after another;
    Qwen3-30B's expert-sized gate_up at 16 tokens, 24, in 7.7 against 16.9; its expert bank at
    8 tokens, 64, in 28.3 against 41.7 (more of it timing).
    A launch that raises, or a kernel that fails to compile, is left to the caller's own launch,
    which raises the same error where it can say which candidate it was. Without Triton's hooks
    (another Triton, no Triton) nothing is compiled ahead."""
    try:
        from concurrent.futures import ThreadPoolExecutor

        from triton import knobs
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return 0
    from triton.runtime.jit import JITFunction

    recording = threading.get_ident()
    jobs: dict[tuple[int, str], tuple[object, str]] = {}
    chained = knobs.runtime.jit_cache_hook
    run = JITFunction.run

    def warmup_only(self, *args, grid, warmup, **kwargs):
        return run(self, *args, grid=grid, warmup=warmup or threading.get_ident() == recording, **kwargs)

    def record(*, key, fn, compile, **kwargs) -> bool | None:
        if threading.get_ident() != recording:  # another thread's launch compiles as it would have
            return chained(key=key, fn=fn, compile=compile, **kwargs) if chained else None
        jobs.setdefault((id(fn.jit_function), str(key)), (fn.jit_function, compile["specialization_data"]))
        return True  # skip: run() returns before compiling or launching

    knobs.runtime.jit_cache_hook, JITFunction.run = record, warmup_only
    try:
        for launch in launches:
            with contextlib.suppress(Exception):
                launch()
    finally:
        knobs.runtime.jit_cache_hook, JITFunction.run = chained, run
    if not jobs:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    pool = ThreadPoolExecutor(min(len(jobs), workers or cores))
    with pool, AsyncCompileMode(pool, ignore_errors=True):
        for fn, specialization in jobs.values():
            with contextlib.suppress(Exception):
                fn.preload(specialization)
    return len(jobs)


def bucket(m: int) -> int:
    """Token counts share a choice with the next power of two (1, 2, 4, ... 2048, then 4096+)."""
    b = 1
    while b < m and b < 4096:
        b *= 2
    return b


def _cache_dir() -> Path:
    return Path(os.environ.get("FLASHRT_CACHE_DIR", Path.home() / ".cache" / "flashrt"))


def shipped_on() -> bool:
    """Whether shipped choices are served (``FLASHRT_SHIPPED_CHOICES``); anything but 0 or 1 is an error."""
    raw = os.environ.get(SHIPPED_SWITCH, "1").strip()
    if raw not in ("0", "1"):
        raise ValueError(
            f"{SHIPPED_SWITCH}={raw!r}: use 1 to serve the kernel choices shipped for this GPU (the default) "
            "or 0 to measure every shape on this node"
        )
    return raw == "1"


def _load_choices(path: Path) -> dict[str, tuple[Candidate, str]]:
    """A tuning file's choices, shape -> (winner, offered); none where it is missing or damaged:
    a damaged cache is re-measured, never trusted."""
    try:
        return {
            key: (
                Candidate(c["form"], tuple((k, v) for k, v in c["config"]), c.get("precision", 0)),
                c.get("offered", ""),
            )
            for key, c in json.loads(path.read_text()).items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _dump_choices(table: dict[str, tuple[Candidate, str]]) -> dict:
    """Choices, shape -> (winner, offered), as a tuning file holds them (``_load_choices`` reads it)."""
    return {
        key: {"form": c.form, "config": list(c.config), "precision": c.precision, "offered": offered}
        for key, (c, offered) in table.items()
    }


def _offered(candidates: list[Candidate]) -> str:
    """A fingerprint of the candidate set a choice was made among."""
    import hashlib

    return hashlib.sha256("|".join(sorted(c.name for c in candidates)).encode()).hexdigest()[:16]


class Tuner:
    """Measures candidates once per (device, op, shape bucket) and remembers the winner."""

    def __init__(self) -> None:
        self._choices: dict[str, dict[str, tuple[Candidate, str]]] = {}  # shape -> (winner, offered)
        self._decided: dict[tuple[str, Hashable], Candidate] = {}  # (device, memo) -> winner
        self._notes: dict[str, tuple[str, ...]] = {}
        self._shipped: dict[str, set[str]] = {}  # device -> shapes whose choice is the shipped one
        self.sources: collections.Counter[str] = collections.Counter()  # choices made, by source
        self.on_choice: Callable[[str], None] | None = None  # told each choice's source (the metrics)
        self._lock = threading.Lock()

    def _device_table(self, device_key: str) -> dict[str, tuple[Candidate, str]]:
        """This node's choices over the shipped ones for the device (``SHIPPED``)."""
        if device_key not in self._choices:
            name = f"tuning-{device_key}.json"
            shipped = _load_choices(SHIPPED / name) if shipped_on() else {}
            node = _load_choices(_cache_dir() / name)
            self._choices[device_key] = shipped | node
            self._shipped[device_key] = set(shipped) - set(node)
        return self._choices[device_key]

    def _chose(self, source: str) -> None:
        self.sources[source] += 1
        if self.on_choice is not None:
            self.on_choice(source)

    def _persist(self, device_key: str, shape_key: str) -> None:
        """``shape_key``'s choice written into the file as it is now, under a lock. Every process
        sharing ``FLASHRT_CACHE_DIR`` writes there (tensor- and pipeline-parallel ranks, a
        restarted engine), each with the table it loaded at its start: writing that whole table
        dropped the choices others made since (a pipeline's last rank alone adjudicates the LM
        head: whichever rank wrote last decided whether the next start measured it again)."""
        path = _cache_dir() / f"tuning-{device_key}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                table = _load_choices(path)
                table[shape_key] = self._choices[device_key][shape_key]
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(_dump_choices(table), indent=1, sort_keys=True))
                tmp.replace(path)
        except OSError:
            pass  # a read-only home only costs a re-measure in the next process

    def recall(self, device_key: str, memo: Hashable) -> Candidate | None:
        """The choice made for ``memo`` in this process, without building the candidates. An op
        calls this first: listing and fingerprinting every form's configs cost 0.12 ms of host
        time a call on the 2-core development machine, paid by every eager call (transformers'
        ``generate()``, vLLM's prefill outside CUDA graphs) if choices were looked up through them."""
        return self._decided.get((device_key, memo))

    def choose(
        self,
        device_key: str,
        shape_key: str,
        candidates: list[Candidate],
        measure: Callable[[Candidate], Outcome],
        may_measure: bool,
        memo: Hashable | None = None,
        launch: Callable[[Candidate], object] | None = None,
    ) -> Candidate:
        """The winner for ``shape_key`` among ``candidates``: the cached one if it was chosen
        among the same offer, else measured (or the first candidate where measuring is not
        allowed, during a CUDA-graph capture; that stand-in is never remembered). A decision is
        remembered under ``memo`` (which must determine the offer) for ``recall``. ``launch``
        runs a candidate once: given, every candidate's kernels are compiled together
        (``compile_ahead``) before the first is measured."""
        with self._lock:
            table = self._device_table(device_key)
            offered = _offered(candidates)
            cached, cached_among = table.get(shape_key, (None, ""))
            # A choice made among other candidates (an older flashrt, other configs) is re-made:
            # the cache must not pin a form this build no longer offers or has since improved.
            if cached is not None and cached_among == offered:
                if memo is not None:
                    self._decided[device_key, memo] = cached
                self._chose("shipped" if shape_key in self._shipped[device_key] else "node")
                return cached
            if not may_measure:
                return candidates[0]
            if launch is not None:
                compile_ahead(functools.partial(launch, c) for c in candidates)
            verdict = adjudicate([measure(c) for c in candidates])
            self._notes[shape_key] = verdict.notes
            if verdict.winner is None:
                raise RuntimeError(f"no kernel candidate qualified for {shape_key}: " + "; ".join(verdict.notes))
            table[shape_key] = (verdict.winner, offered)
            self._shipped[device_key].discard(shape_key)
            self._persist(device_key, shape_key)
            self._chose("measured")
            if memo is not None:
                self._decided[device_key, memo] = verdict.winner
            return verdict.winner

    def notes(self, shape_key: str) -> tuple[str, ...]:
        return self._notes.get(shape_key, ())

    def all_notes(self) -> dict[str, tuple[str, ...]]:
        """Every adjudication this process measured: shape key -> one note per candidate."""
        return dict(self._notes)


TUNER = Tuner()
