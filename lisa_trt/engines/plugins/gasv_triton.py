"""GASV as one Triton kernel: gate, p_raw, p_soft (and the cluster log-masses) for N nodes.

One program per verification node (grid (N,)), each streaming its candidate list in tiles:
the whole vocabulary (dense mode) or the row's top-K support ids (support mode, a GEMV over
the K gathered rows of W~ instead of all V). Passes over the candidates:

  1. row max l_i and argmax i (first index on ties, like torch.argmax);
  2. Z = sum exp(l - l_i), entropy, second-largest logit  -> r, kappa_eff, log lambda_eff;
  3. cluster sums sum_{u in c} exp(l_u - l_i) by a one-hot reduction (deterministic, no
     atomics) -> pi_c, written to the `pi` output (N, C);
  4. the gate per candidate (W~_i . W~_v over H in chunks, s_geo, g_geo, g_clu from pi) and
     p_raw, accumulating sum p_raw * g;
  5. p_soft = p_raw * g / sum.
All math is docs/spec/lisa.md steps 1-5, identical to `lisa_trt.speculative.gasv.gasv_gate` (the
reference this kernel is tested against). Outside the support the gate is 0.

On CUDA tensors the kernel is JIT-compiled; on CPU tensors it runs only in Triton's interpreter
(TRITON_INTERPRET=1 set before triton is first imported; the tests use a subprocess). `compile_ptx`
AOT-compiles it for a given SM without a GPU (used by the TensorRT plugin).
"""

from __future__ import annotations

import math
import re
from typing import Optional

import torch
import triton
import triton.language as tl

from ...errors import InputError
from ...speculative.gasv import GASVConfig, GASVOutput, _resolve_theta_geo, check_logits

KERNEL_NAME = "gasv_kernel"
# Triton >= 3.3 appends (global_scratch, profile_scratch) pointers to every kernel's parameter
# list. This kernel never reads them (scratch sizes 0), so the TensorRT plugin, whose launcher
# passes exactly inputs + int32 scalars + outputs, ships PTX with them stripped.
EXTRA_POINTER_PARAMS = 2
FP_FUSION = True  # explicit (Triton 3.9 warns when it is left to the default); FMA contraction
ONEHOT_ELEMS = 4096  # BLOCK_C * BLOCK_VC of the one-hot cluster reduction (register budget)


def gasv_kernel(logits_ptr, ids_ptr, w_ptr, n2_ptr, cluster_ptr, beta_ptr, params_ptr,
                V, H, C, L, stride_w,
                gate_ptr, praw_ptr, psoft_ptr, pi_ptr,
                HAS_IDS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_VC: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr):
    """One program = one node.

    Parameter order is TensorRT's AOT plugin convention: inputs, int32 scalars, outputs.
    Inputs: logits (N, V) fp32 contiguous; ids (N, L) int32 top-K support (support mode; None
    -> dense, L = V); W~ (V, H) fp32 with row stride stride_w; n2 (V,); cluster (V,) int32;
    beta (C,); params (8,) fp32 = PARAM_NAMES. Outputs: gate, p_raw, p_soft (N, V) fp32 and
    pi (N, C) fp32.
    """
    row = tl.program_id(0).to(tl.int64)
    lrow = logits_ptr + row * V
    NEG_INF = float("-inf")
    ar = tl.arange(0, BLOCK_V)
    inv_log_v = tl.load(params_ptr + 0)
    kappa = tl.load(params_ptr + 1)
    log_lam = tl.load(params_ptr + 2)
    gamma_kappa = tl.load(params_ptr + 3)
    gamma_lambda = tl.load(params_ptr + 4)
    theta_geo = tl.load(params_ptr + 5)
    theta_clu = tl.load(params_ptr + 6)
    eps = tl.load(params_ptr + 7)

    if HAS_IDS:  # 0. outputs are dense: zero the row (only support entries are written later)
        for start in range(0, V, BLOCK_V):
            offs = start + ar
            inb = offs < V
            zero = tl.zeros([BLOCK_V], tl.float32)
            tl.store(gate_ptr + row * V + offs, zero, mask=inb)
            tl.store(praw_ptr + row * V + offs, zero, mask=inb)
            tl.store(psoft_ptr + row * V + offs, zero, mask=inb)
        tl.debug_barrier()

    # 1. max and first argmax
    m_vec = tl.full([BLOCK_V], NEG_INF, tl.float32)
    i_vec = tl.full([BLOCK_V], 2147483647, tl.int32)
    for start in range(0, L, BLOCK_V):
        offs = start + ar
        inb = offs < L
        if HAS_IDS:
            ids = tl.load(ids_ptr + row * L + offs, mask=inb, other=0)
        else:
            ids = offs
        lv = tl.load(lrow + ids, mask=inb, other=NEG_INF)
        better = (lv > m_vec) | ((lv == m_vec) & (ids < i_vec) & inb)
        m_vec = tl.where(better, lv, m_vec)
        i_vec = tl.where(better, ids, i_vec)
    m = tl.max(m_vec, axis=0)
    i = tl.min(tl.where(m_vec == m, i_vec, 2147483647), axis=0)

    # 2. partition function, entropy, runner-up logit
    z_vec = tl.zeros([BLOCK_V], tl.float32)
    s1_vec = tl.zeros([BLOCK_V], tl.float32)
    sec_vec = tl.full([BLOCK_V], NEG_INF, tl.float32)
    for start in range(0, L, BLOCK_V):
        offs = start + ar
        inb = offs < L
        if HAS_IDS:
            ids = tl.load(ids_ptr + row * L + offs, mask=inb, other=0)
        else:
            ids = offs
        lv = tl.load(lrow + ids, mask=inb, other=NEG_INF)
        valid = lv > NEG_INF
        d = tl.where(valid, lv - m, 0.0)
        e = tl.where(valid, tl.exp(d), 0.0)
        z_vec += e
        s1_vec += e * d
        sec_vec = tl.maximum(sec_vec, tl.where(ids != i, lv, NEG_INF))
    z = tl.sum(z_vec, axis=0)
    ent = tl.log(z) - tl.sum(s1_vec, axis=0) / z
    sec = tl.max(sec_vec, axis=0)
    m_norm = 1.0 / (1.0 + tl.exp(sec - m))                   # sigmoid(l1 - l2); 1 if no runner-up
    r = ent * inv_log_v * (2.0 - 2.0 * m_norm)
    kappa_eff = kappa * (1.0 + gamma_kappa * r)
    log_lam_eff = log_lam - gamma_lambda * r

    # 3. cluster log-masses pi_c (one-hot reduction over (BLOCK_C, BLOCK_VC) tiles)
    crange = tl.arange(0, BLOCK_C)
    arc = tl.arange(0, BLOCK_VC)
    csum = tl.zeros([BLOCK_C], tl.float32)
    for start in range(0, L, BLOCK_VC):
        offs = start + arc
        inb = offs < L
        if HAS_IDS:
            ids = tl.load(ids_ptr + row * L + offs, mask=inb, other=0)
        else:
            ids = offs
        lv = tl.load(lrow + ids, mask=inb, other=NEG_INF)
        valid = lv > NEG_INF
        e = tl.where(valid, tl.exp(tl.where(valid, lv - m, 0.0)), 0.0)
        cl = tl.load(cluster_ptr + ids, mask=inb, other=0)
        hit = cl[None, :] == crange[:, None]                 # (BLOCK_C, BLOCK_VC)
        csum += tl.sum(tl.where(hit, e[None, :], 0.0), axis=1)
    pi = tl.log(csum) + m                                     # -inf for empty clusters
    tl.store(pi_ptr + row * C + crange, pi, mask=crange < C)
    c_i = tl.load(cluster_ptr + i)
    pi_i = tl.sum(tl.where(crange == c_i, pi, 0.0), axis=0)
    beta_i = tl.load(beta_ptr + c_i)
    n2_i = tl.load(n2_ptr + i)
    tl.debug_barrier()                                        # pi visible to every thread

    # 4. gate and p_raw per candidate
    hr = tl.arange(0, BLOCK_H)
    wz_vec = tl.zeros([BLOCK_V], tl.float32)
    for start in range(0, L, BLOCK_V):
        offs = start + ar
        inb = offs < L
        if HAS_IDS:
            ids = tl.load(ids_ptr + row * L + offs, mask=inb, other=0)
        else:
            ids = offs
        lv = tl.load(lrow + ids, mask=inb, other=NEG_INF)
        valid = lv > NEG_INF
        dot = tl.zeros([BLOCK_V], tl.float32)
        for h0 in range(0, H, BLOCK_H):
            hoffs = h0 + hr
            hm = hoffs < H
            w_i = tl.load(w_ptr + i.to(tl.int64) * stride_w + hoffs, mask=hm, other=0.0)
            w_v = tl.load(w_ptr + ids.to(tl.int64)[:, None] * stride_w + hoffs[None, :],
                          mask=valid[:, None] & hm[None, :], other=0.0)
            dot += tl.sum(w_v * w_i[None, :], axis=1)
        n2_v = tl.load(n2_ptr + ids, mask=valid, other=0.0)
        d2 = tl.maximum(n2_i + n2_v - 2.0 * dot, 0.0)
        s_geo = tl.where(valid, m - lv, 0.0) / (tl.sqrt(d2) + eps)
        g_geo = tl.sigmoid(theta_geo * (kappa_eff * beta_i - s_geo))
        cl = tl.load(cluster_ptr + ids, mask=inb, other=0)
        pi_v = tl.load(pi_ptr + row * C + cl, mask=valid, other=0.0)
        g_clu = tl.sigmoid(theta_clu * (pi_v - pi_i - log_lam_eff))
        g = tl.where(valid, tl.maximum(g_geo, g_clu), 0.0)
        p = tl.where(valid, tl.exp(tl.where(valid, lv - m, 0.0)) / z, 0.0)
        wz_vec += p * g
        tl.store(gate_ptr + row * V + ids, g, mask=inb)
        tl.store(praw_ptr + row * V + ids, p, mask=inb)
    wz = tl.sum(wz_vec, axis=0)
    tl.debug_barrier()

    # 5. p_soft
    for start in range(0, L, BLOCK_V):
        offs = start + ar
        inb = offs < L
        if HAS_IDS:
            ids = tl.load(ids_ptr + row * L + offs, mask=inb, other=0)
        else:
            ids = offs
        g = tl.load(gate_ptr + row * V + ids, mask=inb, other=0.0)
        p = tl.load(praw_ptr + row * V + ids, mask=inb, other=0.0)
        tl.store(psoft_ptr + row * V + ids, p * g / wz, mask=inb)


# triton.jit follows TRITON_INTERPRET (read when triton is imported): the interpreted kernel
# in interpreter mode, the JIT kernel otherwise.
_KERNEL = triton.jit(gasv_kernel)


def interpreting() -> bool:
    """True when triton was imported with TRITON_INTERPRET=1 (kernels run on CPU via numpy)."""
    return bool(triton.knobs.runtime.interpret)


def block_sizes(V: int, H: int, C: int, block_v: Optional[int] = None) -> dict:
    """Compile-time tile sizes for a problem shape (all powers of two)."""
    # 64 x 32 GEMV tiles with 4 warps: 128 registers and no spills on sm_89/sm_90 (ptxas -v,
    # V=16384, H=1280, C=256); 128 x 64 tiles spill. Speed is untuned (no GPU measured yet).
    block_c = triton.next_power_of_2(max(C, 1))
    return dict(BLOCK_V=block_v or min(64, triton.next_power_of_2(V)),
                BLOCK_VC=max(16, min(128, ONEHOT_ELEMS // block_c)),
                BLOCK_H=min(32, triton.next_power_of_2(H)), BLOCK_C=block_c)


PARAM_NAMES = ("inv_log_v", "kappa", "log_lambda", "gamma_kappa", "gamma_lambda", "theta_geo",
               "theta_clu", "eps")


def kernel_params(V: int, cfg: GASVConfig, theta_geo: float, device="cpu") -> torch.Tensor:
    """The kernel's `params` input: (8,) fp32 in PARAM_NAMES order (a graph constant in TensorRT)."""
    inv_log_v = 1.0 / math.log(V) if V > 1 else 0.0
    vals = [inv_log_v, cfg.kappa, math.log(cfg.lam), cfg.gamma_kappa, cfg.gamma_lambda,
            float(theta_geo), cfg.theta_clu, cfg.eps]
    return torch.tensor(vals, dtype=torch.float32, device=device)


def launch_kernel(logits, ids, w, n2, cluster, beta, params, gate, p_raw, p_soft, pi, *,
                  block_v: Optional[int] = None, num_warps: int = 4) -> None:
    """Launch `gasv_kernel` on prepared tensors (grid (N,)); also the TensorRT JIT plugin body.

    Args: as `gasv_kernel` (ids None -> dense); logits and outputs contiguous (N, V) fp32.
    """
    N, V = logits.shape
    H, C = w.shape[1], beta.shape[0]
    L = V if ids is None else ids.shape[1]
    if N:
        _KERNEL[(N,)](logits, ids, w, n2, cluster, beta, params, V, H, C, L, w.stride(0),
                      gate, p_raw, p_soft, pi, HAS_IDS=ids is not None,
                      **block_sizes(V, H, C, block_v), num_warps=num_warps,
                      enable_fp_fusion=FP_FUSION)


def gasv_triton(logits: torch.Tensor, tables, cfg: Optional[GASVConfig] = None, *,
                support_k: Optional[int] = None, force_gate_one: bool = False,
                check_inputs: bool = True, block_v: Optional[int] = None,
                num_warps: int = 4, return_pi: bool = False):
    """GASV for N nodes with the Triton kernel; same contract as `gasv_gate`.

    Args:
        logits: (N, V) fp32 filtered logits (-inf outside the support), CPU or CUDA.
        tables: bound GASVTables (w_tilde, w_tilde_norm2, cluster, beta, theta_geo).
        cfg: GASV constants; default tables.config.
        support_k: None -> dense; K -> the kernel runs over the top-K ids of each row.
        force_gate_one: gate = 1 on the support, p_soft = p_raw (no kernel launch).
        check_inputs: refuse NaN / +inf / empty rows like the reference (one host sync).
        block_v: vocabulary tile (power of two); default min(64, V).
        num_warps: CUDA launch width.
        return_pi: also return the cluster log-masses (N, C).
    Returns:
        GASVOutput(gate, p_raw, p_soft) (each (N, V) fp32), plus pi (N, C) if return_pi.
    """
    if check_inputs or force_gate_one:
        check_logits(logits)
    logits = logits.float().contiguous()
    if force_gate_one:
        p_raw = torch.softmax(logits, dim=-1)
        return GASVOutput((~torch.isneginf(logits)).float(), p_raw, p_raw.clone())
    cfg = cfg if cfg is not None else getattr(tables, "config", GASVConfig())
    theta_geo = _resolve_theta_geo(tables, cfg)
    if getattr(tables, "w_tilde", None) is None:
        raise InputError("GASV tables are not bound to the target head (w_tilde missing); "
                         "call `tables = tables.bind(target.output.weight)`")
    N, V = logits.shape
    dev = logits.device
    if dev.type != "cuda" and not interpreting():
        raise InputError("the GASV Triton kernel runs on CUDA tensors, or on CPU only in Triton's "
                         "interpreter: set TRITON_INTERPRET=1 before triton is imported, or use "
                         "lisa_trt.speculative.gasv.gasv_gate (the PyTorch reference)")
    w = tables.w_tilde.to(dev, torch.float32).contiguous()
    C = tables.beta.shape[0]
    n2 = tables.w_tilde_norm2.to(dev, torch.float32).contiguous()
    cluster = tables.cluster.to(dev, torch.int32).contiguous()
    beta = tables.beta.to(dev, torch.float32).contiguous()
    ids = None                                                           # dense
    if support_k is not None and support_k < V:
        ids = torch.topk(logits, support_k, dim=-1).indices.to(torch.int32).contiguous()  # (N, K)
    gate, p_raw, p_soft = (torch.empty(N, V, dtype=torch.float32, device=dev) for _ in range(3))
    pi = torch.empty(N, C, dtype=torch.float32, device=dev)
    launch_kernel(logits, ids, w, n2, cluster, beta, kernel_params(V, cfg, theta_geo, dev),
                  gate, p_raw, p_soft, pi, block_v=block_v, num_warps=num_warps)
    out = GASVOutput(gate, p_raw, p_soft)
    return (out, pi) if return_pi else out


def signature(has_ids: bool = False) -> dict:
    """Triton signature of `gasv_kernel` for AOT compilation (dense: ids_ptr is constexpr None)."""
    sig = {"logits_ptr": "*fp32", "ids_ptr": "*i32" if has_ids else "constexpr", "w_ptr": "*fp32",
           "n2_ptr": "*fp32", "cluster_ptr": "*i32", "beta_ptr": "*fp32", "params_ptr": "*fp32"}
    sig.update({k: "i32" for k in ("V", "H", "C", "L", "stride_w")})
    sig.update({k: "*fp32" for k in ("gate_ptr", "praw_ptr", "psoft_ptr", "pi_ptr")})
    sig.update({k: "constexpr" for k in ("HAS_IDS", "BLOCK_V", "BLOCK_VC", "BLOCK_H", "BLOCK_C")})
    return sig


def compile_ptx(V: int, H: int, C: int, *, sm: int = 90, has_ids: bool = False,
                num_warps: int = 4, block_v: Optional[int] = None,
                ptx_version: Optional[int] = None):
    """AOT-compile the kernel for `sm` (89: RTX 4090, 90: H100/H200) without a GPU.

    V, H, C only choose the tile sizes (the kernel takes them at run time). ptx_version
    (e.g. 84 = PTX ISA 8.4, CUDA 12.4 drivers) lowers the `.version` Triton would emit
    (8.8 for sm_89, 9.x for sm_90a with triton 3.9's bundled ptxas), which the loading driver
    must support.
    Returns:
        the triton CompiledKernel: .asm["ptx"], .metadata.name, .metadata.num_warps,
        .metadata.shared. Triton >= 3.3 appends EXTRA_POINTER_PARAMS scratch pointers after the
        declared parameters; `strip_scratch_params` removes them for launchers that do not pass
        them (TensorRT's AOT plugins).
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if interpreting():
        raise InputError("compile_ptx needs triton imported without TRITON_INTERPRET=1 "
                         "(the interpreter replaces the compiler); run it in another process")
    constexprs = dict(HAS_IDS=has_ids, **block_sizes(V, H, C, block_v))
    if not has_ids:
        constexprs["ids_ptr"] = None
    src = ASTSource(fn=_KERNEL, signature=signature(has_ids), constexprs=constexprs)
    options = {"num_warps": num_warps, "enable_fp_fusion": FP_FUSION}
    if ptx_version is not None:
        options["ptx_version"] = int(ptx_version)
    return triton.compile(src, target=GPUTarget("cuda", sm, 32), options=options)


def n_launch_params(has_ids: bool) -> int:
    """Parameters a launcher passes: the non-constexpr entries of `signature`."""
    return sum(t != "constexpr" for t in signature(has_ids).values())


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
