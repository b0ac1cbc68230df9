"""Host mirrors as an engine that does not wait for the device leaves them (kit.harness.mirrors): a
backend that declares the mirrors it reads (host_mirrors) gets them as an upper bound in a run's first
batch and one step stale in its last, the others None; a failure names the mirror the backend trusts.
Planted: kv_indices sized from seq_lens_sum (sgl-project/sglang#26665), declared and undeclared."""
import pytest
import torch

from backends.torch_native import TorchNativeBackend
from cases import CATALOG
from kit.harness import mirrors
from kit.harness.graph import harness_for
from kit.harness.runner import run_case
from kit.modes import Exec, ForwardMode
from kit.report.record import CRASH, FAIL, GRAPH, KERNEL
from tests.helpers import run_setup
from tests.test_kit_graph_harness import RecordingBackend

DECODE = ForwardMode.DECODE
CASE = CATALOG.find_case(DECODE, "gqa_ragged_p16_fp32")


class SeenMirrors(TorchNativeBackend):
    """Records the host mirrors each eager batch's metadata is handed (it reads seq_lens_cpu)."""

    host_mirrors = ("seq_lens_cpu",)
    seen: list = []

    def init_forward_metadata(self, batch):
        SeenMirrors.seen.append((batch.seq_lens_cpu.tolist(), batch.seq_lens_sum))
        super().init_forward_metadata(batch)


def _expected(fixtures, shift_of):
    """Per batch: its seq_lens moved by `shift_of(i)` times each request's new tokens (0: exact)."""
    return [[max(0, r.seq_len + shift_of(i) * r.n_new) for r in fx.plan.requests] for i, fx in enumerate(fixtures)]


def test_an_eager_run_hands_the_declared_mirrors_as_an_upper_bound_then_exact_then_stale():
    SeenMirrors.seen = []
    r = run_case("tests.test_kit_mirrors:SeenMirrors", CASE, Exec.EAGER)
    assert r.outcome == "pass", r.message
    fixtures = run_setup(CASE).fixtures
    last = len(fixtures) - 1
    shift = lambda i: 1 if i == 0 else -1 if i == last else 0  # noqa: E731
    assert [lens for lens, _ in SeenMirrors.seen] == _expected(fixtures, shift)
    # seq_lens_sum, not declared: None where the mirrors are not exact, else the batch's sum
    exact = [fx.batch.seq_lens_sum for fx in fixtures[1:-1]]
    assert [total for _, total in SeenMirrors.seen] == [None] + exact + [None]


class ReplaySeesSum(RecordingBackend):
    """Records the host mirrors each replay hook is handed (it reads seq_lens_sum)."""

    host_mirrors = ("seq_lens_sum",)

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, forward_mode,
                                                spec_info, seq_lens_cpu):
        self.seen = (bs, seq_lens_sum, seq_lens_cpu)


def test_replays_hand_the_declared_mirrors_as_an_upper_bound_then_exact_then_stale():
    """The replay hooks get the regime of their replay: seq_lens_sum (declared) moved, seq_lens_cpu None."""
    setup = run_setup(CASE, Exec.GRAPH, "cpu", ReplaySeesSum)
    backend = setup.new_backend()
    harness = harness_for(backend, setup.fixtures)
    harness.capture()
    for i, fx in enumerate(setup.fixtures):
        harness.prepare(fx)
        fx.install()
        regime = mirrors.regime(i, len(setup.fixtures), setup.caps.host_mirrors)
        harness.replay(fx, regime)
        bs, total, lens = backend.seen
        shift = 0 if regime is None else regime.shift
        real = sum(max(0, r.seq_len + shift * r.n_new) for r in fx.plan.requests)
        padded = (bs - fx.batch.batch_size) * max(0, backend.FILL + shift)  # padded rows move by one
        assert total == real + padded, i
        assert (lens is None) == (regime is not None), i


@pytest.mark.parametrize("mutant, failure_class, says", [
    ("KvIndicesFromStaleSum", KERNEL, "wrong with seq_lens_sum handed one step stale"),
    ("SeqLensSumReadUndeclared", CRASH, "wrong with seq_lens_sum handed None (not in host_mirrors)"),
])
def test_a_buffer_sized_from_seq_lens_sum_is_caught_and_the_mirror_named(mutant, failure_class, says):
    """kv_indices sized from seq_lens_sum: stale (declared), the index builder writes past its end (the
    guard sees it); None (undeclared), sizing raises. Either way the message names seq_lens_sum."""
    r = run_case(f"tests.mutants.triton:{mutant}", CATALOG.find_case(DECODE, "mqa_p1_shuf"), Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, failure_class), r.message
    assert "on a fresh instance with exact host mirrors the batch is right" in r.message
    assert says in r.message and "alone: the backend trusts a host mirror" in r.message


def test_a_replay_wrong_where_eager_is_right_is_a_graph_bug_whatever_the_mirrors_are_blamed_for():
    """Splits baked at capture, and eager sizing from an undeclared mirror: the mirror finding stays in
    the message, and the class is the replay-versus-eager comparison's (exact mirrors: right -> graph)."""
    r = run_case("tests.mutants.triton:SplitsBakedAndMirrorUndeclared", CATALOG.find_case(DECODE, "mqa_p1_shuf"),
                 Exec.GRAPH)
    assert (r.outcome, r.failure_class) == (FAIL, GRAPH), r.message
    assert "wrong with seq_lens_cpu handed None (not in host_mirrors) alone" in r.message
    assert r.message.endswith("eager on the same batch is right -> graph"), r.message


def test_exact_mirrors_for_a_backend_that_declares_none():
    """No declaration: the engine makes the mirrors exact, in every batch."""
    assert mirrors.regime(0, 4, None) is None and mirrors.regime(3, 4, None) is None
    batch = run_setup(CASE).fixtures[0].batch
    assert mirrors.handed(batch, [1] * batch.batch_size, None, None) is batch
    assert torch.equal(batch.seq_lens_cpu, batch.seq_lens.cpu())
