"""The GASV Triton kernel equals the PyTorch reference (Triton interpreter on CPU) and
compiles to sm_89 / sm_90 PTX without a GPU."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lisa_trt.speculative.gasv import GASVConfig, cluster_logsumexp, gasv_gate

triton = pytest.importorskip("triton")
from lisa_trt.engines.plugins import gasv_triton as gt  # noqa: E402

NEG_INF = float("-inf")
ROOT = Path(__file__).resolve().parents[2]


def _case(V, H, C, N, *, seed, scale=3.0, top_k=0, support_k=0, block_v=0, cfg=None):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, H, generator=g)
    wt = W / W.std(0, correction=0)
    logits = torch.randn(N, V, generator=g) * scale
    if top_k:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    cfg = cfg or dict(theta_geo=2.5)
    return dict(logits=logits, w_tilde=wt, w_tilde_norm2=(wt * wt).sum(1),
                cluster=torch.randint(0, C, (V,), generator=g, dtype=torch.int32),
                beta=0.5 + 2 * torch.rand(C, generator=g), cfg=cfg,
                support_k=torch.tensor(support_k), block_v=torch.tensor(block_v))


def _cases():
    cases = {
        "dense_small_multitile": _case(97, 24, 7, 5, seed=0, block_v=16),
        "masked_rows": _case(200, 40, 13, 4, seed=1, top_k=9),
        "support_covering": _case(1000, 40, 63, 6, seed=2, top_k=50, support_k=64),
        "support_truncating": _case(500, 72, 20, 3, seed=3, support_k=31),
        "other_constants": _case(150, 16, 5, 4, seed=4, scale=1.0, cfg=dict(
            theta_geo=7.0, kappa=1.1, lam=0.6, gamma_kappa=0.5, gamma_lambda=2.0, theta_clu=4.0)),
        "vocab16k_support2000": _case(16384, 64, 256, 2, seed=5, top_k=2000, support_k=2000),
        "vocab16k_dense": _case(16384, 32, 256, 1, seed=6, scale=1.0),
    }
    ties = _case(64, 8, 4, 3, seed=7)
    ties["logits"][0, [5, 9, 40]] = 10.0           # tied maxima: argmax is the first (5)
    ties["logits"][1] = NEG_INF
    ties["logits"][1, 17] = 0.3                    # a single-token support
    ties["logits"][2, [3, 4]] = ties["logits"][2].max() + 1  # tie -> margin 0
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
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return cases, torch.load(tmp / "out.pt", weights_only=True)


class _Tables:
    def __init__(self, c):
        self.w_tilde, self.w_tilde_norm2 = c["w_tilde"], c["w_tilde_norm2"]
        self.cluster, self.beta = c["cluster"], c["beta"]
        self.config = GASVConfig(**c["cfg"])
        self.theta_geo = self.config.theta_geo


@pytest.mark.parametrize("name", list(_cases()))
def test_kernel_equals_reference_in_interpreter(interp_results, name):
    cases, results = interp_results
    c, got = cases[name], results[name]
    k = int(c["support_k"]) or None
    ref = gasv_gate(c["logits"], _Tables(c), support_k=k)
    for field in ("gate", "p_raw", "p_soft"):
        torch.testing.assert_close(got[field], getattr(ref, field), atol=1e-5, rtol=1e-4,
                                   msg=lambda m: f"{name}.{field}: {m}")
    torch.testing.assert_close(got["p_soft"].sum(-1), torch.ones(len(c["logits"])))
    masked = c["logits"]
    if k is not None:
        masked = torch.full_like(masked, NEG_INF).scatter(1, torch.topk(masked, k).indices,
                                                          torch.topk(masked, k).values)
    pi = cluster_logsumexp(masked, c["cluster"], c["beta"].shape[0])
    finite = torch.isfinite(pi)
    assert torch.equal(torch.isfinite(got["pi"]), finite)
    torch.testing.assert_close(got["pi"][finite], pi[finite], atol=1e-5, rtol=1e-5)


def test_reference_gate_is_not_trivial_on_the_cases():
    """The comparison has teeth: gates are far from all-0/all-1 on these inputs."""
    c = _cases()["dense_small_multitile"]
    gate = gasv_gate(c["logits"], _Tables(c)).gate
    assert 0.05 < gate.mean() < 0.95


@pytest.mark.skipif(gt.interpreting(), reason="this process runs Triton's interpreter")
def test_cpu_tensors_without_interpreter_are_refused():
    from lisa_trt.errors import InputError
    c = _case(32, 8, 3, 2, seed=0)
    with pytest.raises(InputError, match="TRITON_INTERPRET"):
        gt.gasv_triton(c["logits"], _Tables(c))


@pytest.mark.skipif(gt.interpreting(), reason="PTX compilation needs the real Triton compiler")
@pytest.mark.parametrize("sm,target", [(89, "sm_89"), (90, "sm_90a")])
@pytest.mark.parametrize("has_ids", [False, True])
def test_compiles_to_ptx(sm, target, has_ids):
    k = gt.compile_ptx(V=16384, H=1280, C=256, sm=sm, has_ids=has_ids)
    ptx = k.asm["ptx"]
    assert re.search(rf"^\.target {target}\b", ptx, re.M), ptx[:400]
    assert k.metadata.name == gt.KERNEL_NAME
    assert f".entry {gt.KERNEL_NAME}(" in ptx
    n_declared = gt.n_launch_params(has_ids)
    assert n_declared == (16 if has_ids else 15)    # dense: ids_ptr is a constexpr None
    n_params = len(re.findall(rf"\.param [^\n]*{gt.KERNEL_NAME}_param_\d+", ptx))
    assert n_params == n_declared + gt.EXTRA_POINTER_PARAMS, (n_params, n_declared)
    assert k.metadata.num_warps == 4
    stripped = gt.strip_scratch_params(ptx, gt.KERNEL_NAME, n_declared)
    assert len(re.findall(rf"\.param [^\n]*{gt.KERNEL_NAME}_param_\d+", stripped)) == n_declared
    assert stripped.replace(" ", "").count("\n") <= ptx.count("\n")


@pytest.mark.skipif(gt.interpreting(), reason="PTX compilation needs the real Triton compiler")
@pytest.mark.parametrize("sm,arch", [(89, "sm_89"), (90, "sm_90a")])
def test_default_tiles_do_not_spill_registers(sm, arch, tmp_path):
    from triton.backends.nvidia.compiler import get_ptxas
    ptxas = get_ptxas(sm).path
    if not os.path.exists(ptxas):
        pytest.skip(f"triton's bundled ptxas is missing ({ptxas})")
    k = gt.compile_ptx(V=16384, H=1280, C=256, sm=sm, has_ids=True)
    # the PTX the TensorRT plugin ships: scratch parameters stripped; it must still assemble
    ptx = gt.strip_scratch_params(k.asm["ptx"], gt.KERNEL_NAME, gt.n_launch_params(True))
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
@pytest.mark.parametrize("name", ["dense_small_multitile", "support_covering", "vocab16k_support2000",
                                  "vocab16k_dense", "ties_and_single_token"])
def test_kernel_equals_reference_on_cuda(name):
    c = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in _cases()[name].items()}
    k = int(c["support_k"]) or None
    got = gt.gasv_triton(c["logits"], _Tables(c), support_k=k)
    ref = gasv_gate(c["logits"].cpu(), _Tables(_cases()[name]), support_k=k)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.cpu(), b, atol=1e-5, rtol=1e-4)
