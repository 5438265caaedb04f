"""The GASV v2 Triton kernel equals the PyTorch reference `gasv_gates` (Triton interpreter on
CPU) on random logits with -inf support holes, and compiles to sm_89 / sm_90 PTX without a GPU."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lisa_trt.calibration.profile import lantern_neighbors
from lisa_trt.speculative.gasv import gasv_gates

triton = pytest.importorskip("triton")
from lisa_trt.engines.plugins import gasv_triton as gt  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from interp_worker import tables_of  # noqa: E402

NEG_INF = float("-inf")
ROOT = Path(__file__).resolve().parents[2]


def _case(V, H, C, N, *, seed, scale=3.0, top_k=0, block_v=0, K=16, cfg=None):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, H, generator=g)
    wt = W / W.std(0, correction=0)
    logits = torch.randn(N, V, generator=g) * scale
    if top_k:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    tokens = torch.where(torch.rand(N, generator=g) < 0.5, logits.argsort(-1, descending=True)[:, 1],
                         torch.randint(0, V, (N,), generator=g))   # half near the top, half anywhere
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, N)])
    tokens = torch.where(parents >= 0, logits[parents.clamp(min=0)].argsort(-1, descending=True)[:, 1], tokens) \
        if seed % 2 else tokens
    cfg = cfg or dict(theta_geo=2.5, neighbours=min(K, 12), kappa=1.5, lam=0.3)
    return dict(logits=logits, tokens=tokens, parents=parents, w_tilde=wt, w_tilde_norm2=(wt * wt).sum(1),
                cluster=torch.randint(0, C, (V,), generator=g, dtype=torch.int32),
                beta=0.5 + 2 * torch.rand(C, generator=g), cfg=cfg,
                nb=lantern_neighbors(torch.randn(V, 4, generator=g), K), block_v=torch.tensor(block_v))


def _cases():
    cases = {
        "small_multitile": _case(97, 24, 7, 6, seed=0, block_v=16,
                                 cfg=dict(theta_geo=2.5, neighbours=12, kappa=0.3, lam=0.9)),
        "masked_rows": _case(200, 40, 13, 5, seed=1, top_k=9),
        "holes_other_knobs": _case(150, 16, 5, 5, seed=3, scale=1.0, top_k=60, cfg=dict(
            theta_geo=7.0, kappa=1.1, lam=0.6, delta=0.3, neighbours=16, gamma_kappa=0.5, gamma_lambda=2.0,
            gamma_delta=1.5, theta_clu=4.0)),
        "lossless_knobs": _case(120, 16, 6, 5, seed=4, cfg=dict(theta_geo=3.0, kappa=0.0, lam=1.0, neighbours=8)),
        "vocab16k": _case(16384, 64, 256, 3, seed=5, top_k=2000, K=64, cfg=dict(theta_geo=2.0, neighbours=64)),
    }
    ties = _case(64, 8, 4, 3, seed=7)
    ties["logits"][0, [5, 9, 40]] = 10.0           # tied maxima: margin 0
    ties["logits"][1] = NEG_INF
    ties["logits"][1, 17] = 0.3                    # a single-token support
    cases["ties_and_single_token"] = ties
    return cases


@pytest.fixture(scope="module")
def interp_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gasv_triton")
    cases = _cases()
    torch.save(cases, tmp / "cases.pt")
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("interp_worker.py")),
                           str(tmp / "cases.pt"), str(tmp / "out.pt")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return cases, torch.load(tmp / "out.pt", weights_only=True)


@pytest.mark.parametrize("name", list(_cases()))
def test_kernel_equals_reference_in_interpreter(interp_results, name):
    cases, results = interp_results
    c, got = cases[name], results[name]
    ref = gasv_gates(c["logits"], c["tokens"], c["parents"], tables_of(c))
    assert torch.equal(got["cand"], ref.cand)
    for k in ("p", "delta_eff", "gate"):
        torch.testing.assert_close(got[k], getattr(ref, k), atol=2e-5, rtol=1e-4, msg=f"{name}: {k}")
    if name == "lossless_knobs":
        assert (got["gate"] == 0).all()            # exact zeros, not just small


def test_reference_gates_are_not_trivial_on_the_cases():
    """The comparison has teeth: many gates are neither 0 nor 1 on these inputs."""
    c = _cases()["small_multitile"]
    gate = gasv_gates(c["logits"], c["tokens"], c["parents"], tables_of(c)).gate[1:]
    assert 0.05 < (gate > 0).float().mean() < 0.95 and ((gate > 0) & (gate < 1)).any()


@pytest.mark.skipif(gt.interpreting(), reason="this process runs Triton's interpreter")
def test_cpu_tensors_without_interpreter_are_refused():
    from lisa_trt.errors import InputError
    c = _case(32, 8, 3, 2, seed=0)
    with pytest.raises(InputError, match="TRITON_INTERPRET"):
        gt.gasv_triton(c["logits"], c["tokens"], c["parents"], tables_of(c))


@pytest.mark.skipif(gt.interpreting(), reason="PTX compilation needs the real Triton compiler")
@pytest.mark.parametrize("sm,target", [(89, "sm_89"), (90, "sm_90a")])
def test_compiles_to_ptx(sm, target):
    k = gt.compile_ptx(V=16384, H=1280, C=256, KW=64, sm=sm)
    ptx = k.asm["ptx"]
    assert re.search(rf"^\.target {target}\b", ptx, re.M), ptx[:400]
    assert k.metadata.name == gt.KERNEL_NAME
    assert f".entry {gt.KERNEL_NAME}(" in ptx
    n_declared = gt.n_launch_params()
    assert n_declared == 17
    n_params = len(re.findall(rf"\.param [^\n]*{gt.KERNEL_NAME}_param_\d+", ptx))
    assert n_params == n_declared + gt.EXTRA_POINTER_PARAMS, (n_params, n_declared)
    assert k.metadata.num_warps == 4
    stripped = gt.strip_scratch_params(ptx, gt.KERNEL_NAME, n_declared)
    assert len(re.findall(rf"\.param [^\n]*{gt.KERNEL_NAME}_param_\d+", stripped)) == n_declared


@pytest.mark.skipif(gt.interpreting(), reason="PTX compilation needs the real Triton compiler")
@pytest.mark.parametrize("sm,arch", [(89, "sm_89"), (90, "sm_90a")])
def test_default_tiles_do_not_spill_registers(sm, arch, tmp_path):
    from triton.backends.nvidia.compiler import get_ptxas
    ptxas = get_ptxas(sm).path
    if not os.path.exists(ptxas):
        pytest.skip(f"triton's bundled ptxas is missing ({ptxas})")
    k = gt.compile_ptx(V=16384, H=1280, C=256, KW=64, sm=sm)
    ptx = gt.strip_scratch_params(k.asm["ptx"], gt.KERNEL_NAME, gt.n_launch_params())
    (tmp_path / "k.ptx").write_text(ptx)
    proc = subprocess.run([ptxas, "-v", f"--gpu-name={arch}", str(tmp_path / "k.ptx"), "-o", os.devnull],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "0 bytes spill stores" in proc.stderr, proc.stderr


def test_strip_refuses_a_kernel_that_reads_the_parameter():
    ptx = ".visible .entry k(\n.param .u64 k_param_0,\n.param .u64 k_param_1\n)\n{ ld.param.b64 %rd1, [k_param_1]; }"
    from lisa_trt.errors import InputError
    with pytest.raises(InputError, match="reads parameter 1"):
        gt.strip_scratch_params(ptx, "k", 1)
    assert "k_param_1" not in gt.strip_scratch_params(ptx.replace("[k_param_1]", "[k_param_0]"), "k", 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or gt.interpreting(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(_cases()))
def test_kernel_equals_reference_on_cuda(name):
    c = _cases()[name]
    cu = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in c.items()}
    got = gt.gasv_triton(cu["logits"], cu["tokens"], cu["parents"], tables_of(cu))
    ref = gasv_gates(c["logits"], c["tokens"], c["parents"], tables_of(c))
    assert torch.equal(got.cand.cpu(), ref.cand)
    for k in ("p", "delta_eff", "gate"):
        torch.testing.assert_close(getattr(got, k).cpu(), getattr(ref, k), atol=2e-5, rtol=1e-4)
