"""Run the GASV v2 Triton kernel in Triton's interpreter on saved cases (used by test_gasv_triton).

Usage: TRITON_INTERPRET=1 python interp_worker.py CASES.pt OUT.pt  (the env var must be set
before triton is imported, hence a separate process).
"""

import sys
import types

import torch

from lisa_trt.engines.plugins.gasv_triton import gasv_triton, interpreting
from lisa_trt.speculative.gasv import GASVConfig


def tables_of(c):
    cfg = GASVConfig(**c["cfg"])
    return types.SimpleNamespace(w_tilde=c["w_tilde"], w_tilde_norm2=c["w_tilde_norm2"], cluster=c["cluster"],
                                 beta=c["beta"], lantern_neighbors=c["nb"], vocab_size=c["nb"].shape[0],
                                 config=cfg, theta_geo=cfg.theta_geo)


def main(cases_path: str, out_path: str) -> None:
    assert interpreting(), "TRITON_INTERPRET=1 must be set before triton is imported"
    cases = torch.load(cases_path, weights_only=True)
    results = {}
    for name, c in cases.items():
        bv = int(c["block_v"]) or None
        out = gasv_triton(c["logits"], c["tokens"], c["parents"], tables_of(c), block_v=bv)
        results[name] = dict(out._asdict())
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
