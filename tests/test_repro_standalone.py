"""`python -m kit repro --standalone`: the file it writes runs with the kit not importable, prints
each batch's and layer's error against its limit and a verdict, and exits 1 when the engine is handed
a wrong batch (eager, or a graph replay handed its capture's metadata) or the engine has a known bug,
which it shrinks first (a recurrent run of SGLang's Mamba2: a graph's padded rows left NaN too, or a
reference without its skip term); over an fp8 KV cache it judges the engine under its backend's declared
numerics and fails a scale the engine misapplies, and an eager step that changes the q, k or v it was
handed; an MLA run over the engine's latent cache fails a latent stored without its rope part; a
speculative run (TARGET_VERIFY, chain or tree; DRAFT_EXTEND_V2), eager or replayed on its graphs, passes
with EAGLE's inputs built by the engine's own classes and fails a verify mask that lets drafts see past
their tree ancestors."""
import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backends.sglang.adapter import sglang_problem
from backends.vllm.adapter import vllm_problem
from kit.__main__ import main
from kit.cli import USAGE
from kit.report.known_failures import load_or_default
from kit.repro.check_files import WRONG_OUTPUT, blocked_env, shows

VLLM = pytest.mark.skipif(vllm_problem() is not None, reason=str(vllm_problem()))
SGLANG = pytest.mark.skipif(sglang_problem() is not None, reason=str(sglang_problem()))
ROOT = Path(__file__).resolve().parents[1]
VLLM_RUN = "vllm_triton_attn-decode-eager-gqa_fused_p16_fp32"
SGLANG_GRAPH_RUN = "sglang_triton-decode-graph-mqa_p1_shuf"
VLLM_GRAPH_RUN = "vllm_triton_attn-decode-graph-gqa_fused_p16_fp32"
SGLANG_FP8_RUN = "sglang_triton-extend-eager-gqa_fp8_e5m2_prefix_p16_fp16"
SGLANG_MLA_RUN = "sglang_triton-extend-eager-mla_r32_h16_ragged_p16_fp32"
SGLANG_TREE_RUN = "sglang_triton-target_verify-eager-mqa_tree6_p1_shuf"
# The verify's custom mask as the file builds it from each draft's visible keys, and one that shows a draft every key.
TREE_MASK = 'c == "1" for r in reqs for row in r["visible"]'
NO_TREE_MASK = 'True for r in reqs for row in r["visible"]'
# The cached tokens' latent rows stored without their rope part (zeros): a latent write that drops k_rope.
CACHED_ROWS = 'quantize(x[which][:r["n_old"]].to(dtype), scale, cache_dtype)'
ROPE_DROPPED = ('quantize(torch.cat([x[which][:r["n_old"], :, :L0["rank"]], '
                'torch.zeros_like(x[which][:r["n_old"], :, L0["rank"]:])], dim=-1).to(dtype), scale, cache_dtype)')


def _kit_blocked(tmp_path):
    """A PYTHONPATH under which `import kit` (and `import backends`) raises: the file must not need them."""
    env = blocked_env(tmp_path / "blocked")
    probe = subprocess.run([sys.executable, "-c", "import kit"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "the standalone file imported kit" in probe.stderr
    return env


def _run_standalone(tmp_path, run_id, plant=None, shrink=False):
    path = tmp_path / "repro.py"
    assert main(["repro", "--standalone", run_id, "--out", str(path)] + ([] if shrink else ["--no-shrink"])) == 0
    if plant:
        text = path.read_text()
        assert plant[0] in text
        path.write_text(text.replace(*plant))
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=_kit_blocked(tmp_path), capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("run_id", [pytest.param(VLLM_RUN, marks=VLLM),
                                    pytest.param("sglang_triton-decode-eager-mqa_p1_shuf", marks=SGLANG),
                                    pytest.param(SGLANG_GRAPH_RUN, marks=SGLANG),
                                    pytest.param(VLLM_GRAPH_RUN, marks=VLLM)])
def test_standalone_file_passes_without_the_kit(tmp_path, run_id):
    done = _run_standalone(tmp_path, run_id)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    # Every batch of the run (eager: the kit's sequence on one instance; graph: its replays), both layers.
    assert len(lines) == 1 + 2 * 4 and lines[-1] == "PASS"
    assert [line.split(") ")[1].split(":")[0] for line in lines[:-1]] == ["layer 0", "layer 1"] * 4
    assert all(line.startswith(f"batch {i // 2 + 1}/4 (") and "<= limit" in line and line.endswith("PASS")
               for i, line in enumerate(lines[:-1]))


SGLANG_DRAFT_RUN = "sglang_triton_draft-draft_decode-eager-gqa_chain3_p16_fp32"


@SGLANG
@pytest.mark.parametrize("run_id", [SGLANG_DRAFT_RUN, SGLANG_DRAFT_RUN.replace("-eager-", "-graph-")])
def test_a_draft_decode_file_judges_every_step_and_passes_without_the_kit(tmp_path, run_id):
    # TritonMultiStepDraftBackend: a chain of 3 drafts, so 2 steps, each reading the lane's column the one
    # before it wrote (a wrong mask, position or slot moves a step off its reference); its graph records
    # both steps in one graph, replayed on each batch.
    done = _run_standalone(tmp_path, run_id)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1 + 4 * 2 * 2 and lines[-1] == "PASS"
    assert [line.split(" (")[1].split(":")[0].split(", ", 1)[1] for line in lines[:-1]] == [
        f"step {s}/2) layer {i}" for s in (1, 2) for i in (0, 1)] * 4
    assert all("<= limit" in line and line.endswith("PASS") for line in lines[:-1])


@SGLANG
def test_a_draft_decode_file_fails_a_step_that_writes_another_column(tmp_path):
    # Every step writing its lane's first column: step 2 reads a column no step wrote (NaN in the file's pool).
    _failed(_run_standalone(tmp_path, SGLANG_DRAFT_RUN, ("columns[:, :, i]", "columns[:, :, 0]")))


@SGLANG
@pytest.mark.parametrize("run_id", [
    SGLANG_TREE_RUN,  # a tree: each draft sees its prefix and its ancestors only
    "sglang_triton-target_verify-eager-mha_bs1_chain4_window_p64_inter",  # a window over the drafts' positions
    "sglang_triton-draft_extend_v2-eager-mqa_draft3_p1_shuf",  # the drafts extended, their prefix seq_lens - drafts
    # Replayed on batch-size graphs: padded rows' mask blocks all True, their drafts extended too.
    "sglang_triton-target_verify-graph-mqa_tree6_p1_shuf",
    "sglang_triton-draft_extend_v2-graph-mqa_draft3_p1_shuf",
])
def test_a_speculative_file_passes_without_the_kit(tmp_path, run_id):
    done = _run_standalone(tmp_path, run_id)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "PASS" and len(lines) > 1 and all(line.endswith("PASS") for line in lines)



def _failed(done, inputs_only=False):
    """The file's verdict FAIL: a wrong output, or (`inputs_only`) only the q, k or v it handed changed."""
    assert done.returncode == 1, done.stderr[-2000:]
    assert bool(WRONG_OUTPUT.search(done.stdout)) != inputs_only, done.stdout[-2000:]
    assert ("changed in place" in done.stdout) or not inputs_only, done.stdout[-2000:]
    assert done.stdout.splitlines()[-1] == "FAIL"


@SGLANG
def test_an_mla_file_passes_without_the_kit_and_fails_a_latent_cached_without_its_rope_part(tmp_path):
    # SGLang's Triton EXTEND over DeepSeek's latent (rank 32 + rope 16, 16 heads, one latent row a token).
    done = _run_standalone(tmp_path, SGLANG_MLA_RUN)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1 + 2 * 4 and lines[-1] == "PASS" and all(line.endswith("PASS") for line in lines)
    _failed(_run_standalone(tmp_path, SGLANG_MLA_RUN, (CACHED_ROWS, ROPE_DROPPED)))


@SGLANG
def test_an_fp8_file_passes_under_the_declared_numerics_without_the_kit(tmp_path):
    # SGLang's Triton extend over an fp8 e5m2 cache: q and p cast to fp8, the step's new tokens attended as handed.
    done = _run_standalone(tmp_path, SGLANG_FP8_RUN)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1 + 2 * 4 and lines[-1] == "PASS"
    assert all(line.endswith("under q cast to fp8, new tokens as handed, p cast to fp8: PASS") for line in lines[:-1])


@SGLANG
@pytest.mark.parametrize("plant", [
    # V's scale applied twice where the kernel reads the cache back (its descale, triton_backend.py:1837).
    pytest.param(('attn.k_scale_float, attn.v_scale_float = spec["k_scale"], spec["v_scale"]',
                  'attn.k_scale_float, attn.v_scale_float = spec["k_scale"], spec["v_scale"] ** 2'),
                 id="v-scale-twice"),
    # Triton's interpreter casting to fp8 as it does unpatched (ties up, a carry lost): the kernels' q and p casts.
    pytest.param(("    interp.InterpreterBuilder.create_fp_to_fp = _fp8_rounded_to_nearest(",
                  "    _unused = _fp8_rounded_to_nearest("), id="interpreter-fp8-cast"),
])
def test_an_fp8_file_fails_a_scale_misapplied_and_the_interpreters_own_cast(tmp_path, plant):
    _failed(_run_standalone(tmp_path, SGLANG_FP8_RUN, plant))


@SGLANG
def test_a_verify_file_fails_drafts_that_see_past_their_ancestors(tmp_path):
    _failed(_run_standalone(tmp_path, SGLANG_TREE_RUN, (TREE_MASK, NO_TREE_MASK)))


MAMBA2_RUN = "sglang_mamba2-decode-eager-mamba2_decode_bf16_long"  # two saved states, one 300 tokens long


@SGLANG
@pytest.mark.parametrize("run_id", [MAMBA2_RUN, "sglang_mamba2-target_verify-eager-mamba2_verify_saved_bf16"])
def test_a_recurrent_file_passes_without_the_kit(tmp_path, run_id):
    # SGLang's Mamba2, eager: every layer's rows against the inline reference of the recurrence.
    done = _run_standalone(tmp_path, run_id)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()[-3:]
    assert [line.split(":")[0] for line in lines] == ["layer 0", "layer 1", "PASS"]
    assert all(line.endswith("PASS") and "<= limit" in line for line in lines[:2])


@SGLANG
def test_a_recurrent_file_fails_a_reference_without_mambas_skip(tmp_path):
    # A reference without y += D x: the file judges the engine against its reference, so a wrong one fails.
    _failed(_run_standalone(tmp_path, MAMBA2_RUN, ("+ layer.D.to(dtype)[:, None] * x[t]", "")))


@VLLM
def test_standalone_file_fails_a_batch_one_key_short(tmp_path):
    # vLLM handed seq_lens one short attends one key fewer per request than the reference sees.
    _failed(_run_standalone(tmp_path, VLLM_RUN, ("[query_start.to(DEVICE), seq_lens.to(DEVICE)]",
                                                 "[query_start.to(DEVICE), (seq_lens - 1).to(DEVICE)]")))


@pytest.mark.parametrize("run_id, replay_hook", [
    # SGLang: without the out_graph hook before a replay, the graph reads its capture's metadata (padded rows).
    pytest.param(SGLANG_GRAPH_RUN, "    backend.init_forward_metadata_out_graph(forward_batch(fields))\n", marks=SGLANG),
    pytest.param("sglang_triton-target_verify-graph-mqa_tree6_p1_shuf",
                 "    backend.init_forward_metadata_out_graph(forward_batch(fields))\n", marks=SGLANG),
    # A multi-step draft's graph (every step recorded in one): its steps' kv_indices left as captured.
    pytest.param("sglang_triton_draft-draft_decode-graph-gqa_chain3_p16_fp32",
                 "    backend.init_forward_metadata_out_graph(forward_batch(fields))\n", marks=SGLANG),
    # vLLM: without the persistent inputs refilled and the build, a replay reads the capture's dummy batch.
    pytest.param(VLLM_GRAPH_RUN, "    prepare_replay(reqs, pbs)\n", marks=VLLM)])
def test_a_graph_file_fails_a_replay_left_with_its_captures_batch(tmp_path, run_id, replay_hook):
    _failed(_run_standalone(tmp_path, run_id, (replay_hook, "")))


@SGLANG
@pytest.mark.timeout(3600)  # the shrink's kit runs and the file, each in Triton's interpreter without CUDA
def test_standalone_file_shrinks_and_reproduces_a_known_failure(tmp_path, capsys):
    # KNOWN_FAILURES.md KF-1 (sglang#32087): SGLang's Triton decode with window W attends W keys, not W + 1.
    done = _run_standalone(tmp_path, "sglang_triton-decode-eager-mha_bs1_window_p64_inter", shrink=True)
    said = capsys.readouterr().out
    assert "Shrunk from mha_bs1_window_p64_inter (1 requests, 70 cached" in said, said
    shrunk = said.split(" to ")[1].split(";")[0]
    assert int(shrunk.split(", ")[1].split(" cached")[0]) < 70 and "window" in shrunk, said
    assert "Shrunk from mha_bs1_window_p64_inter" in (tmp_path / "repro.py").read_text()
    _failed(done)


@SGLANG
def test_an_sglang_mla_file_hands_a_split_backend_q_and_k_in_latent_and_rope_parts(tmp_path):
    """DeepSeek's model calls FlashInfer MLA (and SGLang's other split backends) with q_rope= and k_rope=; the
    Triton MLA file above runs the whole rows (SPLIT_CALL False) and passes."""
    out = tmp_path / "r.py"
    assert main(["repro", "--standalone", "sglang_flashinfer_mla-extend-eager-mla_h16_ragged_p16_fp16", "--no-shrink",
                 "--out", str(out)]) == 0
    text = out.read_text()
    compile(text, str(out), "exec")
    assert "\nSPLIT_CALL = True  #" in text and "q_rope=q[..., rank:], k_rope=k[..., rank:]" in text


@VLLM
@SGLANG
@pytest.mark.parametrize("run_id, problem", [
    ("vllm_triton_attn-extend-graph-gqa_fused_p16_fp32", "decode graphs only"),
    ("sglang_triton-extend-graph-mqa_p1_shuf", "batch-size graphs only"),
    ("vllm_triton_attn-decode-eager-no_such_case", "no decode case named"),
    ("torch_native-decode-eager-gqa_fused_p16_fp32", "no standalone renderer"),
    ("sglang_triton-draft_decode-eager-gqa_chain3_p16_fp32", "runs the draft's steps in TritonMultiStepDraftBackend"),
    ("vllm_triton_mla-decode-eager-mla_deepseek_h128_bs1_p64_fp16", "vLLM's dense attention only"),
    ("sglang_gdn-decode-graph-gdn_decode_bf16_long", "SGLang's Mamba2 of the recurrent backends only"),
    ("sglang_mamba2-extend-eager-mamba2_extend_chunks_bf16", "decode and verify steps only"),
    ("sglang_mamba2-decode-graph-mamba2_decode_fp32", "SGLang decodes a request after its prefill"),
])
def test_what_no_file_reproduces_is_a_usage_error(tmp_path, capsys, run_id, problem):
    assert main(["repro", "--standalone", run_id, "--out", str(tmp_path / "r.py")]) == USAGE
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "r.py").exists()


# The file's reference windows a draft by its position (prefix + tree depth); SGLang's extend kernel by its index.
BY_POSITION = 'qp, kp = torch.tensor(r["q_pos"])[:, None], torch.tensor(r["key_pos"])[None, :]'
BY_INDEX = ('qp, kp = torch.arange(r["n_old"], r["n_old"] + r["n_new"])[:, None], '
            'torch.arange(r["n_old"] + r["n_new"])[None, :]')


@SGLANG
def test_kf3s_file_fails_by_windowing_drafts_by_index_alone(tmp_path):
    """KF-3's checked-in file passes once its reference windows each draft by its index in the verify block:
    its FAIL is that bug's, not a batch the file builds wrong."""
    text = (ROOT / "repro" / "KF-3.py").read_text()
    assert BY_POSITION in text
    path = tmp_path / "by_index.py"
    path.write_text(text.replace(BY_POSITION, BY_INDEX))
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=_kit_blocked(tmp_path), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "PASS"


ENGINE_PROBLEMS = {"vllm": vllm_problem, "sglang": sglang_problem}
REPRO_FILE = re.compile(r"repro/KF-\d+\.py")


def _cpu_repro_entries():
    """The KNOWN_FAILURES.md entries that link a standalone file and whose device a CPU is."""
    return [e for e in load_or_default() if fnmatch.fnmatchcase("CPU (x86_64)", e.device)
            and any(REPRO_FILE.fullmatch(link) for link in e.links)]


@pytest.mark.parametrize("entry", _cpu_repro_entries(), ids=lambda e: e.id)
def test_a_cpu_entrys_standalone_file_fails_without_the_kit(tmp_path, entry):
    """The checked-in file shows the entry's bug with the kit not importable: a crash holding the entry's
    text, or an output past its limit."""
    # An entry's backend may be a pattern (`sglang_*`): its engine is its first word.
    problem = ENGINE_PROBLEMS[entry.backend.split("_")[0]]()
    if problem is not None:
        pytest.skip(problem)
    path = ROOT / next(link for link in entry.links if REPRO_FILE.fullmatch(link))
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=_kit_blocked(tmp_path), capture_output=True,
                          text=True, timeout=900)
    assert shows(entry, done.returncode, done.stdout, done.stderr), done.stdout[-2000:] + done.stderr[-2000:]


def test_a_file_with_a_placeholder_left_is_the_renderers_bug_not_a_file():
    from kit.repro.standalone import filled

    assert filled("BACKEND = 'triton'\nx = a @ b\n@torch.no_grad()\n", "b").startswith("BACKEND")
    with pytest.raises(RuntimeError, match="left @SPLIT_CALL@ unfilled"):
        filled("BACKEND = 'triton'\nSPLIT_CALL = @SPLIT_CALL@\n", "sglang_mamba2")
