"""The Jacobi-family loops give the tokens they gave before SJD-PAC was folded into the one
Jacobi loop (speculative/sjd.py): recorded on the pre-fold tree in jacobi_golden.json by
`python tests/speculative/test_jacobi_golden.py --record`, replayed here (same seeds, batch 2
with CFG, a top-k and a full-vocabulary law, a t2i target). Re-recorded once when the window
became fixed (issue 49): the last steps of an image now verify the whole window instead of what
is left of the image, which changes the number of random draws there, so the tokens from index
N - window on changed (the law did not: tests/speculative/test_mcsjd.py, test_sjd_pac.py); every
token before them was checked identical to the earlier recording."""

import json
import sys
from pathlib import Path

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.speculative.methods import SpecConfig
from lisa_trt.speculative.run import run_method
from lisa_trt.testing import make_cond, make_target
from lisa_trt.speculative.methods import resolve_method

GOLDEN = Path(__file__).with_name("jacobi_golden.json")
CASES = {
    "sjd": ("sjd", {}), "mcsjd": ("mcsjd", {}), "gsd": ("gsd", {"gsd_group": 3}),
    "sjd-pac": ("sjd-pac", {}), "sjd-pac-k1": ("sjd-pac", {"sjd_pac_tree_width": 1}),
    "sjd-pac-k2d4": ("sjd-pac", {"sjd_pac_tree_width": 2, "sjd_pac_tree_depth": 4}),
}
SETTINGS = {"cfg2-topk20-w4": (SamplingConfig(cfg_scale=2.0, top_k=20), 4),
            "cfg1-full-w6": (SamplingConfig(cfg_scale=1.0), 6)}


def _decode(case, setting, model_type):
    method, knobs = CASES[case]
    sampling, window = SETTINGS[setting]
    torch.manual_seed(0)
    m = make_target(model_type, std=0.5)
    cond = make_cond(m, batch=2)
    toks, _ = run_method(resolve_method(method), m, None, None, cond, sampling=sampling, spec=SpecConfig.make("gasv", **knobs),
                         seed=7, sjd_window=window)
    return toks.tolist()


def _keys():
    return [(c, s, t) for c in CASES for s in SETTINGS for t in ("c2i", "t2i")]


@pytest.mark.parametrize("case,setting,model_type", _keys())
def test_jacobi_tokens_unchanged(case, setting, model_type):
    want = json.loads(GOLDEN.read_text())[f"{case}/{setting}/{model_type}"]
    assert _decode(case, setting, model_type) == want


if __name__ == "__main__" and "--record" in sys.argv:
    GOLDEN.write_text(json.dumps({f"{c}/{s}/{t}": _decode(c, s, t) for c, s, t in _keys()}) + "\n")
