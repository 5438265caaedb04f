"""Run the GASV Triton kernel in Triton's interpreter on saved cases (used by test_gasv_triton).

Usage: TRITON_INTERPRET=1 python interp_worker.py CASES.pt OUT.pt  (the env var must be set
before triton is imported, hence a separate process).
"""

import sys
import types

import torch

from lisa_trt.engines.plugins.gasv_triton import gasv_triton, interpreting
from lisa_trt.speculative.gasv import GASVConfig


def main(cases_path: str, out_path: str) -> None:
    assert interpreting(), "TRITON_INTERPRET=1 must be set before triton is imported"
    cases = torch.load(cases_path, weights_only=True)
    results = {}
    for name, c in cases.items():
        cfg = GASVConfig(**c["cfg"])
        tables = types.SimpleNamespace(w_tilde=c["w_tilde"], w_tilde_norm2=c["w_tilde_norm2"],
                                       cluster=c["cluster"], beta=c["beta"], config=cfg,
                                       theta_geo=cfg.theta_geo)
        k = int(c["support_k"]) or None
        bv = int(c["block_v"]) or None
        out, pi = gasv_triton(c["logits"], tables, support_k=k, block_v=bv, return_pi=True)
        results[name] = {"gate": out.gate, "p_raw": out.p_raw, "p_soft": out.p_soft, "pi": pi}
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
