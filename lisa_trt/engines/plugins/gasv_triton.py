"""GASV v2 as one Triton kernel: per tree node, p and delta_eff of its row and the gates of
its drafted token's candidates at its parent (spec/lisa.md steps 1-4).

One program per node n (grid (N,)):
  1. own row: max, partition function, entropy, runner-up -> r_u -> delta_eff[n]; p[n, :];
  2. parent row (par(n) >= 0): the same statistics -> kappa_eff, log lambda_eff; cluster sums
     by a one-hot reduction (deterministic, no atomics) -> pi_{c_d} - max_c pi_c;
  3. the first K_n codebook neighbours v of d = tokens[n] (the `nb` table): W~_d . W~_v over H
     in chunks, s(v|d), g_geo, g_clu, gate (0 off the support, on padding, for the root and for
     an off-support d).
tanh(x) is evaluated as 2 sigmoid(2x) - 1 (exactly 0 at x = 0, so the lossless limit stays
exact). The math is `lisa_trt.speculative.gasv.gasv_core`, the reference this kernel is tested
against (candidate ids are a table gather, done by the caller / the ONNX graph).

On CUDA tensors the kernel is JIT-compiled; on CPU tensors it runs only in Triton's interpreter
(TRITON_INTERPRET=1 set before triton is first imported; the tests use a subprocess). `compile_ptx`
AOT-compiles it for a given SM without a GPU (used by the TensorRT plugin).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

import torch
import triton
import triton.language as tl

from ...errors import InputError
from ...speculative.gasv import PARAMS, GASVConfig, GASVGates, candidates, check_logits

KERNEL_NAME = "gasv_kernel"
# Triton >= 3.3 appends (global_scratch, profile_scratch) pointers to every kernel's parameter
# list. This kernel never reads them (scratch sizes 0), so the TensorRT plugin, whose launcher
# passes exactly inputs + int32 scalars + outputs, ships PTX with them stripped.
EXTRA_POINTER_PARAMS = 2
FP_FUSION = True  # explicit (Triton 3.9 warns when it is left to the default); FMA contraction
ONEHOT_ELEMS = 4096  # BLOCK_C * BLOCK_VC of the one-hot cluster reduction (register budget)
PARAM_NAMES = PARAMS  # the kernel's `params` input = GASVConfig.params() (gasv.PARAMS order)
# gasv_kernel reads params by position: this is the order it was written for
assert PARAMS == ("kappa", "lam", "delta", "neighbours", "gamma_kappa", "gamma_lambda", "gamma_delta",
                  "theta_clu", "theta_geo", "eps"), "update gasv_kernel's params loads"


@triton.jit
def _row_stats(lrow, V, BLOCK_V: tl.constexpr):
    """(max, partition function Z, entropy, r_u) of one row of filtered logits."""
    NEG_INF = float("-inf")
    ar = tl.arange(0, BLOCK_V)
    m_vec = tl.full([BLOCK_V], NEG_INF, tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + ar
        lv = tl.load(lrow + offs, mask=offs < V, other=NEG_INF)
        m_vec = tl.maximum(m_vec, lv)
    m = tl.max(m_vec, axis=0)
    z_vec = tl.zeros([BLOCK_V], tl.float32)
    s1_vec = tl.zeros([BLOCK_V], tl.float32)
    n_max = tl.zeros([BLOCK_V], tl.int32)
    sec_vec = tl.full([BLOCK_V], NEG_INF, tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + ar
        lv = tl.load(lrow + offs, mask=offs < V, other=NEG_INF)
        valid = lv > NEG_INF
        d = tl.where(valid, lv - m, 0.0)
        e = tl.where(valid, tl.exp(d), 0.0)
        z_vec += e
        s1_vec += e * d
        is_max = lv == m
        n_max += is_max.to(tl.int32)
        sec_vec = tl.maximum(sec_vec, tl.where(is_max, NEG_INF, lv))
    z = tl.sum(z_vec, axis=0)
    ent = tl.log(z) - tl.sum(s1_vec, axis=0) / z
    sec = tl.where(tl.sum(n_max, axis=0) > 1, m, tl.max(sec_vec, axis=0))   # tied maxima: gap 0
    m_norm = 1.0 / (1.0 + tl.exp(sec - m))                   # sigmoid(l1 - l2); 1 if no runner-up
    r_u = ent / tl.log(V.to(tl.float32)) * (2.0 - 2.0 * m_norm)
    return m, z, r_u


@triton.jit
def _relu_tanh(x):
    return tl.maximum(2.0 * tl.sigmoid(2.0 * x) - 1.0, 0.0)


def gasv_kernel(logits_ptr, tok_ptr, par_ptr, nb_ptr, w_ptr, n2_ptr, cluster_ptr, beta_ptr, params_ptr,
                V, H, C, KW, stride_w,
                p_ptr, delta_ptr, gate_ptr,
                BLOCK_V: tl.constexpr, BLOCK_VC: tl.constexpr, BLOCK_H: tl.constexpr,
                BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program = one tree node.

    Parameter order is TensorRT's AOT plugin convention: inputs, int32 scalars, outputs.
    Inputs: logits (N, V) fp32; tokens, parents (N,) int32 (parent row, -1: root); nb (V, KW)
    int32 neighbour table (nearest first); W~ (V, H) fp32 with row stride stride_w; n2 (V,);
    cluster (V,) int32; beta (C,); params = GASVConfig.params() (gasv.PARAMS order).
    Outputs: p (N, V), delta_eff (N,), gate (N, KW) fp32.
    """
    n = tl.program_id(0).to(tl.int64)
    NEG_INF = float("-inf")
    ar = tl.arange(0, BLOCK_V)
    kappa = tl.load(params_ptr + 0)
    lam = tl.load(params_ptr + 1)
    delta = tl.load(params_ptr + 2)
    kn = tl.load(params_ptr + 3)
    gamma_kappa = tl.load(params_ptr + 4)
    gamma_lambda = tl.load(params_ptr + 5)
    gamma_delta = tl.load(params_ptr + 6)
    theta_clu = tl.load(params_ptr + 7)
    theta_geo = tl.load(params_ptr + 8)
    eps = tl.load(params_ptr + 9)

    # 1. own row: p and delta_eff
    lrow = logits_ptr + n * V
    m, z, r_u = _row_stats(lrow, V, BLOCK_V)
    tl.store(delta_ptr + n, tl.minimum(delta * (1.0 + gamma_delta * r_u), 1.0))
    for start in range(0, V, BLOCK_V):
        offs = start + ar
        inb = offs < V
        lv = tl.load(lrow + offs, mask=inb, other=NEG_INF)
        valid = lv > NEG_INF
        tl.store(p_ptr + n * V + offs, tl.where(valid, tl.exp(tl.where(valid, lv - m, 0.0)) / z, 0.0), mask=inb)

    # 2. parent row statistics
    par = tl.load(par_ptr + n)
    has_par = par >= 0
    prow = logits_ptr + tl.maximum(par, 0).to(tl.int64) * V
    pm, pz, pr = _row_stats(prow, V, BLOCK_V)
    kappa_eff = kappa * (1.0 + gamma_kappa * pr)
    log_lam_eff = (1.0 + gamma_lambda * pr) * tl.log(lam)
    d = tl.load(tok_ptr + n)
    c_d = tl.load(cluster_ptr + d)
    crange = tl.arange(0, BLOCK_C)
    arc = tl.arange(0, BLOCK_VC)
    csum = tl.zeros([BLOCK_C], tl.float32)
    for start in range(0, V, BLOCK_VC):
        offs = start + arc
        inb = offs < V
        lv = tl.load(prow + offs, mask=inb, other=NEG_INF)
        valid = lv > NEG_INF
        e = tl.where(valid, tl.exp(tl.where(valid, lv - pm, 0.0)), 0.0)
        cl = tl.load(cluster_ptr + offs, mask=inb, other=0)
        hit = cl[None, :] == crange[:, None]                 # (BLOCK_C, BLOCK_VC)
        csum += tl.sum(tl.where(hit, e[None, :], 0.0), axis=1)
    pi = tl.where(crange < C, tl.log(csum), NEG_INF)         # pi_c - max l (the shift cancels)
    pi_gap = tl.sum(tl.where(crange == c_d, pi, 0.0), axis=0) - tl.max(pi, axis=0)
    g_clu_d = _relu_tanh(theta_clu / 2.0 * (pi_gap - log_lam_eff))

    # 3. candidate gates
    l_d = tl.load(prow + d)
    kr = tl.arange(0, BLOCK_K)
    kin = kr < KW
    cand = tl.load(nb_ptr + d.to(tl.int64) * KW + kr, mask=kin, other=-1)
    cand = tl.where(kr.to(tl.float32) < kn, cand, -1)
    cv = tl.maximum(cand, 0)
    l_v = tl.load(prow + cv, mask=kin, other=NEG_INF)
    row_ok = has_par.to(tl.int32) * (l_d > NEG_INF).to(tl.int32) + tl.zeros([BLOCK_K], tl.int32)
    valid = (cand >= 0) & (l_v > NEG_INF) & (row_ok > 0)
    hr = tl.arange(0, BLOCK_H)
    dot = tl.zeros([BLOCK_K], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hoffs = h0 + hr
        hm = hoffs < H
        w_d = tl.load(w_ptr + d.to(tl.int64) * stride_w + hoffs, mask=hm, other=0.0)
        w_v = tl.load(w_ptr + cv.to(tl.int64)[:, None] * stride_w + hoffs[None, :],
                      mask=valid[:, None] & hm[None, :], other=0.0)
        dot += tl.sum(w_v * w_d[None, :], axis=1)
    n2_d = tl.load(n2_ptr + d)
    n2_v = tl.load(n2_ptr + cv, mask=valid, other=0.0)
    d2 = tl.maximum(n2_d + n2_v - 2.0 * dot, 0.0)
    diff = tl.abs(tl.where(valid, l_d - l_v, 0.0))
    s = diff / (tl.sqrt(d2) + eps)
    beta_d = tl.load(beta_ptr + c_d)
    g_geo = _relu_tanh(theta_geo / 2.0 * (kappa_eff * beta_d - s))
    cl_v = tl.load(cluster_ptr + cv, mask=valid, other=-1)
    g_clu = tl.where(cl_v == c_d, g_clu_d, 0.0)
    gate = tl.where(valid, tl.maximum(g_geo, g_clu), 0.0)
    tl.store(gate_ptr + n * KW + kr, gate, mask=kin)


# triton.jit follows TRITON_INTERPRET (read when triton is imported): the interpreted kernel
# in interpreter mode, the JIT kernel otherwise.
_KERNEL = triton.jit(gasv_kernel)


def interpreting() -> bool:
    """True when triton was imported with TRITON_INTERPRET=1 (kernels run on CPU via numpy)."""
    return bool(triton.knobs.runtime.interpret)


def block_sizes(V: int, H: int, C: int, KW: int = 64, block_v: Optional[int] = None) -> dict:
    """Compile-time tile sizes for a problem shape (all powers of two)."""
    block_c = triton.next_power_of_2(max(C, 1))
    return dict(BLOCK_V=block_v or min(256, triton.next_power_of_2(V)),
                BLOCK_VC=max(16, min(128, ONEHOT_ELEMS // block_c)),
                BLOCK_H=min(32, triton.next_power_of_2(H)), BLOCK_C=block_c,
                BLOCK_K=triton.next_power_of_2(max(KW, 1)))


def launch_kernel(logits, tokens, parents, nb, w, n2, cluster, beta, params, p, delta_eff, gate, *,
                  block_v: Optional[int] = None, num_warps: int = 4) -> None:
    """Launch `gasv_kernel` on prepared tensors (grid (N,)); also the TensorRT JIT plugin body.

    Args: as `gasv_kernel`; logits and outputs contiguous fp32, ints int32.
    """
    N, V = logits.shape
    H, C, KW = w.shape[1], beta.shape[0], nb.shape[1]
    if N:
        _KERNEL[(N,)](logits, tokens, parents, nb, w, n2, cluster, beta, params, V, H, C, KW, w.stride(0),
                      p, delta_eff, gate, **block_sizes(V, H, C, KW, block_v), num_warps=num_warps,
                      enable_fp_fusion=FP_FUSION)


def gasv_triton(logits: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, tables,
                cfg: Optional[GASVConfig] = None, *, check_inputs: bool = True,
                block_v: Optional[int] = None, num_warps: int = 4) -> GASVGates:
    """GASV v2 for N tree nodes with the Triton kernel; same contract as `gasv.gasv_gates`
    (scope "neighbours").

    Args:
        logits: (N, V) fp32 filtered logits (-inf outside the support), CPU or CUDA.
        tokens, parents: (N,) node tokens and parent rows (-1: root).
        tables: bound GASVTables (w_tilde, w_tilde_norm2, cluster, beta, lantern_neighbors).
        cfg: knobs; default tables.config.
        check_inputs: refuse NaN / +inf / empty rows like the reference (one host sync).
        block_v: vocabulary tile (power of two); num_warps: CUDA launch width.
    Returns:
        GASVGates(p (N, V), delta_eff (N,), cand (N, K_n), gate (N, K_n)).
    """
    if check_inputs:
        check_logits(logits)
    logits = logits.float().contiguous()
    cfg = cfg if cfg is not None else getattr(tables, "config", GASVConfig())
    if cfg.theta_geo is None:
        cfg = dataclasses.replace(cfg, theta_geo=getattr(tables, "theta_geo", None))
    if cfg.scope != "neighbours":
        raise InputError(f"the GASV kernel gates codebook neighbours (scope 'neighbours'), got {cfg.scope!r}; "
                         "use lisa_trt.speculative.gasv.gasv_gates for the ablation scopes")
    if getattr(tables, "w_tilde", None) is None:
        raise InputError("GASV tables are not bound to the target head (w_tilde missing); "
                         "call `tables = tables.bind(target.output.weight)`")
    N, V = logits.shape
    dev = logits.device
    if dev.type != "cuda" and not interpreting():
        raise InputError("the GASV Triton kernel runs on CUDA tensors, or on CPU only in Triton's "
                         "interpreter: set TRITON_INTERPRET=1 before triton is imported, or use "
                         "lisa_trt.speculative.gasv.gasv_gates (the PyTorch reference)")
    cand = candidates(tokens.to(dev), tables, cfg)                       # (N, K_n), checks K_n
    nb = tables.lantern_neighbors[:, : cfg.neighbours].to(dev, torch.int32).contiguous()
    w = tables.w_tilde.to(dev, torch.float32).contiguous()
    p = torch.empty(N, V, dtype=torch.float32, device=dev)
    delta_eff = torch.empty(N, dtype=torch.float32, device=dev)
    gate = torch.empty(N, nb.shape[1], dtype=torch.float32, device=dev)
    launch_kernel(logits, tokens.to(dev, torch.int32).contiguous(), parents.to(dev, torch.int32).contiguous(),
                  nb, w, tables.w_tilde_norm2.to(dev, torch.float32).contiguous(),
                  tables.cluster.to(dev, torch.int32).contiguous(), tables.beta.to(dev, torch.float32).contiguous(),
                  cfg.params(dev), p, delta_eff, gate, block_v=block_v, num_warps=num_warps)
    return GASVGates(p, delta_eff, cand, gate)


def signature() -> dict:
    """Triton signature of `gasv_kernel` for AOT compilation."""
    sig = {"logits_ptr": "*fp32", "tok_ptr": "*i32", "par_ptr": "*i32", "nb_ptr": "*i32", "w_ptr": "*fp32",
           "n2_ptr": "*fp32", "cluster_ptr": "*i32", "beta_ptr": "*fp32", "params_ptr": "*fp32"}
    sig.update({k: "i32" for k in ("V", "H", "C", "KW", "stride_w")})
    sig.update({k: "*fp32" for k in ("p_ptr", "delta_ptr", "gate_ptr")})
    sig.update({k: "constexpr" for k in ("BLOCK_V", "BLOCK_VC", "BLOCK_H", "BLOCK_C", "BLOCK_K")})
    return sig


def compile_ptx(V: int, H: int, C: int, KW: int = 64, *, sm: int = 90, num_warps: int = 4,
                block_v: Optional[int] = None, ptx_version: Optional[int] = None):
    """AOT-compile the kernel for `sm` (89: RTX 4090, 90: H100/H200) without a GPU.

    V, H, C, KW only choose the tile sizes (the kernel takes them at run time). ptx_version
    (e.g. 84 = PTX ISA 8.4, CUDA 12.4 drivers) lowers the `.version` Triton would emit.
    Returns:
        the triton CompiledKernel (.asm["ptx"], .metadata.name / num_warps / shared). Triton
        >= 3.3 appends EXTRA_POINTER_PARAMS scratch pointers; `strip_scratch_params` removes them.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if interpreting():
        raise InputError("compile_ptx needs triton imported without TRITON_INTERPRET=1 "
                         "(the interpreter replaces the compiler); run it in another process")
    src = ASTSource(fn=_KERNEL, signature=signature(), constexprs=block_sizes(V, H, C, KW, block_v))
    options = {"num_warps": num_warps, "enable_fp_fusion": FP_FUSION}
    if ptx_version is not None:
        options["ptx_version"] = int(ptx_version)
    return triton.compile(src, target=GPUTarget("cuda", sm, 32), options=options)


def n_launch_params() -> int:
    """Parameters a launcher passes: the non-constexpr entries of `signature`."""
    return sum(t != "constexpr" for t in signature().values())


def strip_scratch_params(ptx: str, name: str, keep: int) -> str:
    """Drop the trailing scratch pointer parameters from the `.entry name(...)` of a PTX module.

    Safe only when the kernel never reads them (scratch sizes 0); checked here.
    Args:
        ptx: PTX text from `compile_ptx`.
        name: kernel entry name.
        keep: number of leading parameters to keep (`n_launch_params`).
    Raises:
        InputError when the PTX does not have the expected shape or reads a dropped parameter.
    """
    m = re.search(rf"\.entry {re.escape(name)}\((.*?)\)", ptx, re.S)
    if m is None:
        raise InputError(f"no .entry {name}( ... ) in the PTX")
    params = [p.strip() for p in m.group(1).split(",") if p.strip()]
    if len(params) < keep:
        raise InputError(f"PTX entry {name} has {len(params)} parameters, expected >= {keep}")
    for j in range(keep, len(params)):
        if f"[{name}_param_{j}]" in ptx:
            raise InputError(f"kernel {name} reads parameter {j} (Triton scratch): cannot strip it")
    body = ",\n\t".join(params[:keep])
    return ptx[: m.start(1)] + "\n\t" + body + "\n" + ptx[m.end(1):]
