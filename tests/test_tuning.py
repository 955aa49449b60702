"""Form adjudication: the pure decision and the per-device cache."""

import json
import os
import subprocess
import sys
import time

import pytest
from flashrt.kernels import tuning
from flashrt.kernels.tuning import Outcome, Tuner, adjudicate, bucket, candidate

A = candidate("gemv", {"BLOCK_N": 8})
B = candidate("mma", {"BLOCK_N": 64})
W4A4 = candidate("w4a4", {"BLOCK_N": 64}, precision=-1)


def gemv_faster(c):
    """A measurement in which the ``gemv`` form takes 3 us and ``mma`` 5, both at parity."""
    return Outcome(c, {"gemv": 3.0, "mma": 5.0}[c.form], 0.999)


def recorded(measured: list):
    """``gemv_faster``, appending each candidate it measures to ``measured``."""
    return lambda c: measured.append(c) or gemv_faster(c)


def test_fastest_qualified_candidate_wins_and_every_outcome_is_noted():
    verdict = adjudicate([Outcome(A, 10.0, 0.999), Outcome(B, 8.0, 0.999), Outcome(W4A4, refused="no build for sm_90")])
    assert verdict.winner == B
    assert any("refused: no build for sm_90" in n for n in verdict.notes)
    assert verdict.notes[-1].startswith("winner mma")


def test_a_candidate_under_the_parity_floor_never_wins():
    verdict = adjudicate([Outcome(A, 10.0, 0.999), Outcome(B, 1.0, 0.98)])
    assert verdict.winner == A
    assert any("parity 0.9800 under floor 0.99" in n for n in verdict.notes)


def test_a_candidate_whose_output_has_no_parity_never_wins():
    """A cosine of NaN (an output with NaN or inf in it, or never written) is not a parity: until
    session 57 it passed the floor, since no comparison with NaN is true, and the fastest such
    candidate, perhaps fast for having written nothing, would have been served."""
    verdict = adjudicate([Outcome(A, 10.0, 0.999), Outcome(B, 1.0, float("nan"))])
    assert verdict.winner == A
    assert any(n.startswith("mma[BLOCK_N=64]: refused: parity nan under floor") for n in verdict.notes), verdict.notes


def test_a_lost_cuda_context_ends_the_adjudication_where_a_build_failure_is_a_refusal(tmp_path, monkeypatch):
    """A candidate that does not build here is refused and the next one measured; one whose
    measuring lost the CUDA context (an illegal address, a launch failure) ends the adjudication
    with an error that says so and names it, instead of 63 more refusals and a host path that
    fail the same way (an H100, session 57)."""
    from flashrt.kernels import ops

    monkeypatch.setenv("FLASHRT_CACHE_DIR", str(tmp_path))
    errors = {
        "gemv": RuntimeError("out of resource: shared memory, Required: 301056, Hardware limit: 232448"),
        "mma": RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"),
    }
    measured = []

    def measure(c):
        measured.append(c.form)
        return ops._refused(c, errors[c.form]) if c.form in errors else Outcome(c, 1.0, 0.999)

    assert Tuner().choose("H100", "linear:M1", [A, W4A4], measure, may_measure=True) == W4A4
    assert measured == ["gemv", "w4a4"], "a build failure is refused and the next candidate measured"
    measured.clear()
    lost = r"CUDA context was lost while measuring mma\[BLOCK_N=64\] \(RuntimeError: Triton Error \[CUDA\]: an illegal"
    with pytest.raises(RuntimeError, match=lost):
        Tuner().choose("H100", "linear:M2", [B, W4A4, A], measure, may_measure=True)
    assert measured == ["mma"], "nothing is measured after the context is lost"


def test_inside_the_win_margin_the_higher_precision_form_wins():
    assert adjudicate([Outcome(A, 10.0, 0.999), Outcome(W4A4, 9.8, 0.995)]).winner == A
    assert adjudicate([Outcome(A, 10.0, 0.999), Outcome(W4A4, 9.0, 0.995)]).winner == W4A4


def test_nothing_qualified_gives_no_winner():
    assert adjudicate([Outcome(A, refused="x"), Outcome(B, 5.0, 0.5)]).winner is None


def test_token_counts_share_a_choice_with_the_next_power_of_two():
    assert [bucket(m) for m in (1, 2, 3, 5, 16, 17, 2048, 9000)] == [1, 2, 4, 8, 16, 32, 2048, 4096]


def test_choices_are_measured_once_and_cached_per_device(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHRT_CACHE_DIR", str(tmp_path))
    measured = []

    measure = recorded(measured)

    tuner = Tuner()
    assert tuner.choose("H200", "linear:M1", [A, B], measure, may_measure=True) == A
    assert tuner.choose("H200", "linear:M1", [A, B], measure, may_measure=True) == A
    assert len(measured) == 2, "a process never re-tunes a shape"
    saved = json.loads((tmp_path / "tuning-H200.json").read_text())
    assert saved["linear:M1"]["form"] == "gemv"
    fresh = Tuner()  # another process on the same node
    assert fresh.choose("H200", "linear:M1", [B, A], measure, may_measure=True) == A
    assert len(measured) == 2
    assert fresh.choose("B200", "linear:M1", [B, A], measure, may_measure=False) == B, "no timing inside capture"


def test_processes_sharing_a_cache_keep_each_others_choices(tmp_path, monkeypatch):
    """Two processes on one cache (pipeline ranks: only the last one has the LM head), each
    loading the file before the other wrote: each writes its own choice into the file as it
    is then, so neither drops the other's. Until session 58 each wrote the table it had loaded."""
    monkeypatch.setenv("FLASHRT_CACHE_DIR", str(tmp_path))

    measure = gemv_faster

    first, last = Tuner(), Tuner()
    first.choose("H200", "linear:M1:layers", [A, B], measure, may_measure=True)
    last.choose("H200", "linear:M1:layers", [A, B], measure, may_measure=True)  # loaded before first wrote
    last.choose("H200", "linear:M1:head", [B, A], measure, may_measure=True)
    first.choose("H200", "linear:M2:layers", [A, B], measure, may_measure=True)  # wrote after the head
    saved = json.loads((tmp_path / "tuning-H200.json").read_text())
    assert set(saved) == {"linear:M1:layers", "linear:M1:head", "linear:M2:layers"}
    measured = []
    fresh = Tuner()
    fresh.choose("H200", "linear:M1:head", [A, B], recorded(measured), may_measure=True)
    assert measured == [], "the next start finds the head's choice"


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"linear:M1": {"config": []}}', '{"linear:M1": 3}'])
def test_a_damaged_cache_is_measured_again_and_replaced(content, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHRT_CACHE_DIR", str(tmp_path))
    (tmp_path / "tuning-H200.json").write_text(content)
    measured = []

    measure = recorded(measured)

    assert Tuner().choose("H200", "linear:M1", [A, B], measure, may_measure=True) == A
    assert len(measured) == 2
    saved = json.loads((tmp_path / "tuning-H200.json").read_text())
    assert set(saved) == {"linear:M1"} and saved["linear:M1"]["form"] == "gemv"


def test_processes_writing_one_cache_at_once_lose_no_choice(tmp_path):
    """Tensor-parallel ranks adjudicate together and write together: under the file's lock each
    write reads what the others wrote before it. Each rank here loads the cache (its first
    choice), waits for all to have, then makes 40 more."""
    code = """
import pathlib, sys, time
from flashrt.kernels.tuning import Outcome, Tuner, candidate
rank, sync = int(sys.argv[1]), pathlib.Path(sys.argv[2])
a, b = candidate("gemv", {"BLOCK_N": 64}), candidate("mma", {"BLOCK_M": 16})
tuner = Tuner()
for shape in range(41):
    tuner.choose("H200", f"linear:rank{rank}:{shape}", [a, b], lambda c: Outcome(c, 1.0, 0.999), may_measure=True)
    if shape == 0:
        (sync / f"ready{rank}").touch()
        while not (sync / "go").exists():
            time.sleep(0.01)
"""
    cache, sync = tmp_path / "cache", tmp_path / "sync"
    sync.mkdir()
    env = os.environ | {"FLASHRT_CACHE_DIR": str(cache)}
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(rank), str(sync)], env=env) for rank in range(4)]
    deadline = time.monotonic() + 120
    while len(list(sync.glob("ready*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    (sync / "go").touch()
    assert [rank.wait(timeout=120) for rank in ranks] == [0] * 4
    saved = json.loads((cache / "tuning-H200.json").read_text())
    assert set(saved) == {f"linear:rank{rank}:{shape}" for rank in range(4) for shape in range(41)}


def _ship(folder, device_key: str, choices: dict) -> None:
    """A shipped table for ``device_key``: shape -> (winner, the candidates it was chosen among)."""
    folder.mkdir(exist_ok=True)
    table = {key: (c, tuning._offered(among)) for key, (c, among) in choices.items()}
    (folder / f"tuning-{device_key}.json").write_text(json.dumps(tuning._dump_choices(table)))


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """An empty node cache and a shipped folder of the test's own, in place of the package's."""
    monkeypatch.setenv("FLASHRT_CACHE_DIR", str(tmp_path / "node"))
    monkeypatch.delenv(tuning.SHIPPED_SWITCH, raising=False)
    monkeypatch.setattr(tuning, "SHIPPED", tmp_path / "shipped")
    return tmp_path / "shipped"


def test_a_shape_the_node_has_not_measured_is_served_the_choice_shipped_for_its_gpu(shipped, tmp_path):
    """A fresh pod on a GPU we benchmarked serves what was measured there (``mma``, where this
    test's measurement would pick ``gemv``), measures nothing and writes nothing; another GPU
    still measures."""
    _ship(shipped, "H200", {"linear:M1": (B, [A, B])})
    measured = []
    tuner = Tuner()
    assert tuner.choose("H200", "linear:M1", [A, B], recorded(measured), may_measure=True) == B
    assert measured == [] and not (tmp_path / "node").exists()
    assert tuner.choose("B200", "linear:M1", [A, B], recorded(measured), may_measure=True) == A
    assert measured == [A, B]
    assert tuner.sources == {"shipped": 1, "measured": 1}


def test_the_nodes_own_choice_wins_over_the_shipped_one(shipped, tmp_path):
    _ship(shipped, "H200", {"linear:M1": (B, [A, B]), "linear:M2": (B, [A, B])})
    _ship(tmp_path / "node", "H200", {"linear:M1": (A, [A, B])})
    measured, told = [], []
    tuner = Tuner()
    tuner.on_choice = told.append
    assert tuner.choose("H200", "linear:M1", [A, B], recorded(measured), may_measure=True) == A
    assert tuner.choose("H200", "linear:M2", [A, B], recorded(measured), may_measure=True) == B
    assert measured == []
    assert told == ["node", "shipped"] and tuner.sources == {"node": 1, "shipped": 1}


def test_a_shipped_choice_made_among_other_candidates_is_measured_again_on_the_node(shipped, tmp_path):
    """A build that offers other configs than the shipped choice was made among measures the
    shape, and keeps its choice in the node's file alone; the shipped file is left as it was."""
    _ship(shipped, "H200", {"linear:M1": (B, [B])})
    before = (shipped / "tuning-H200.json").read_text()
    measured = []
    tuner = Tuner()
    assert tuner.choose("H200", "linear:M1", [A, B], recorded(measured), may_measure=True) == A
    assert measured == [A, B]
    assert set(json.loads((tmp_path / "node" / "tuning-H200.json").read_text())) == {"linear:M1"}
    assert (shipped / "tuning-H200.json").read_text() == before
    assert tuner.choose("H200", "linear:M1", [A, B], recorded(measured), may_measure=True) == A
    assert tuner.sources == {"measured": 1, "node": 1}, "the choice it measured is the node's, not shipped"


def test_shipped_choices_can_be_turned_off_and_a_bad_switch_names_itself(shipped, monkeypatch):
    _ship(shipped, "H200", {"linear:M1": (B, [A, B])})
    monkeypatch.setenv(tuning.SHIPPED_SWITCH, "0")
    measured = []
    assert Tuner().choose("H200", "linear:M1", [A, B], recorded(measured), may_measure=True) == A
    assert measured == [A, B]
    monkeypatch.setenv(tuning.SHIPPED_SWITCH, "off")
    with pytest.raises(ValueError, match=r"FLASHRT_SHIPPED_CHOICES='off': use 1 .* or 0"):
        Tuner().choose("H200", "linear:M1", [A, B], gemv_faster, may_measure=True)


def test_the_package_ships_the_benchmark_gpus_choices_and_the_bundle_carries_them(tmp_path):
    """Each shipped file is a table of choices under a device key as ``ops._device_key`` spells
    one, for the H200 and the H100; ``flashrt bundle`` (what a pod gets) holds the same files."""
    files = sorted(tuning.SHIPPED.glob("tuning-*.json"))
    assert [f.name for f in files] == [
        "tuning-NVIDIA-H100-80GB-HBM3-sm90-triton3.6.0.json",
        "tuning-NVIDIA-H200-sm90-triton3.6.0.json",
    ]
    for f in files:
        table = tuning._load_choices(f)
        assert len(table) > 50 and all(c.form and offered for c, offered in table.values())
    bundle = tmp_path / "bundle"
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "flashrt"), "bundle", str(bundle)], check=True)
    carried = bundle / "flashrt" / "kernels" / "choices"
    assert {f.name: f.read_bytes() for f in carried.glob("*.json")} == {f.name: f.read_bytes() for f in files}


def test_a_cached_choice_is_remade_when_the_candidates_change(tmp_path, monkeypatch):
    """A newer flashrt offering other forms or configs must not inherit the old winner."""
    monkeypatch.setenv("FLASHRT_CACHE_DIR", str(tmp_path))
    times = {"gemv": 3.0, "mma": 5.0, "mma_gluon": 2.0}
    measured = []

    def measure(c):
        measured.append(c)
        return Outcome(c, times[c.form], 0.999)

    assert Tuner().choose("H200", "linear:M1", [A, B], measure, may_measure=True) == A
    newer = candidate("mma_gluon", {"WARPS": 1})
    assert Tuner().choose("H200", "linear:M1", [A, B, newer], measure, may_measure=True) == newer
    assert len(measured) == 5
    assert Tuner().choose("H200", "linear:M1", [newer, A, B], measure, may_measure=True) == newer
    assert len(measured) == 5, "the same offer, in any order, reuses the choice"


def test_a_decision_is_recalled_without_its_candidates_and_a_capture_stand_in_never_is(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHRT_CACHE_DIR", str(tmp_path))
    A, B = candidate("gemv", {"BLOCK_N": 64}), candidate("mma", {"BLOCK_M": 16})

    measure = gemv_faster

    tuner = Tuner()
    assert tuner.recall("H200", ("linear:M1", "auto")) is None
    assert tuner.choose("H200", "linear:M1", [B, A], measure, may_measure=False, memo=("linear:M1", "auto")) == B
    assert tuner.recall("H200", ("linear:M1", "auto")) is None, "a stand-in during capture is not a decision"
    assert tuner.choose("H200", "linear:M1", [B, A], measure, may_measure=True, memo=("linear:M1", "auto")) == A
    assert tuner.recall("H200", ("linear:M1", "auto")) == A
    assert tuner.recall("H200", ("linear:M1", "bf16")) is None, "another offer is another decision"
    assert tuner.recall("B200", ("linear:M1", "auto")) is None
    fresh = Tuner()  # the next process: the file's choice, once confirmed against the offer, is recalled
    assert fresh.choose("H200", "linear:M1", [A, B], measure, may_measure=False, memo=("linear:M1", "auto")) == A
    assert fresh.recall("H200", ("linear:M1", "auto")) == A


def test_every_candidate_is_compiled_ahead_once_before_the_first_is_measured(tmp_path, monkeypatch):
    """Measuring compiles every candidate first, together (``compile_ahead``); a cached choice
    and a capture's stand-in launch nothing ahead."""
    import flashrt.kernels.tuning as tuning

    monkeypatch.setenv("FLASHRT_CACHE_DIR", str(tmp_path))
    events = []

    def compile_ahead(launches):
        for launch in launches:
            launch()
        events.append("compiled")
        return 0

    def measure(c):
        events.append(("measured", c.form))
        return Outcome(c, {"gemv": 3.0, "mma": 5.0}[c.form], 0.999)

    monkeypatch.setattr(tuning, "compile_ahead", compile_ahead)
    launch = lambda c: events.append(("launched", c.form))  # noqa: E731
    assert Tuner().choose("H200", "linear:M1", [A, B], measure, may_measure=False, launch=launch) == A
    assert events == [], "nothing is compiled ahead for a stand-in"
    assert Tuner().choose("H200", "linear:M1", [B, A], measure, may_measure=True, launch=launch) == A
    assert events == [("launched", "mma"), ("launched", "gemv"), "compiled", ("measured", "mma"), ("measured", "gemv")]
    events.clear()
    assert Tuner().choose("H200", "linear:M1", [B, A], measure, may_measure=True, launch=launch) == A
    assert events == [], "a cached choice compiles nothing"


def test_compile_ahead_runs_its_launches_as_warmups_launching_nothing(monkeypatch):
    """Every Triton kernel a recorded launch reaches is run as Triton's warmup (``warmup=True``),
    compiled or not: a launch whose first kernel is not yet compiled must not run a later,
    compiled one on the first one's unwritten outputs (session 57: an H100's expert bank at one
    token read an unwritten grouping and faulted). A kernel launched from another thread
    meanwhile launches as it would have, and ``JITFunction.run`` is Triton's own again after."""
    import threading

    import flashrt.kernels.tuning as tuning
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    def body(x_ptr, N: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, N), tl.zeros([N], tl.float32))

    kernel = JITFunction(body)  # compiled, as on a GPU, whatever TRITON_INTERPRET says

    calls = []

    def run(self, *args, grid, warmup, **kwargs):  # stands in for Triton's: no GPU here
        calls.append((threading.current_thread().name, warmup))

    monkeypatch.setattr(JITFunction, "run", run)

    def other_thread():
        worker = threading.Thread(target=lambda: kernel[(1,)](None, N=16), name="other")
        worker.start()
        worker.join()

    tuning.compile_ahead([lambda: kernel[(1,)](None, N=16), other_thread, lambda: kernel.warmup(None, N=16, grid=(1,))])
    recorder = threading.current_thread().name
    assert calls == [(recorder, True), ("other", False), (recorder, True)]
    assert JITFunction.run is run
    kernel[(1,)](None, N=16)
    assert calls[-1] == (recorder, False), "after it, a launch launches"


def test_a_projection_timed_after_a_lead_is_timed_so_and_cached_apart(monkeypatch):
    """``ops.SERVED_AFTER_US``: a linear's candidates are timed after a lead of that length (what
    ``_time_us`` is asked for) and the choice is keyed apart from one timed alone, so neither
    cache hands its choice to the other."""
    import torch
    from flashrt.kernels import nvfp4, ops

    asked = []
    monkeypatch.setattr(ops, "_device_key", lambda index: "a-device")
    monkeypatch.setattr(ops.TUNER, "recall", lambda device_key, memo: None)
    monkeypatch.setattr(ops.TUNER, "choose", lambda device_key, key, cands, measure, *a, **k: asked.append(
        (key, measure(cands[0]))) or cands[0])  # fmt: skip
    monkeypatch.setattr(ops, "_time_us", lambda run, after_us=0.0: after_us + 1.0)
    q = nvfp4.quantize(torch.randn(64, 256))
    x = torch.randn(1, 256)
    for after in (0.0, 2.5):
        monkeypatch.setattr(ops, "SERVED_AFTER_US", after)
        ops.choose_linear(x, q.packed, q.scales, q.global_scale, None)
    (alone, timed_alone), (after, timed_after) = asked
    assert ":after" not in alone and after == alone + ":after2.5us"
    assert (timed_alone.time_us, timed_after.time_us) == (1.0, 3.5), "the lead's length reaches the timing"
    assert timed_after.parity > 0.99, "the candidate ran and was checked as before"
