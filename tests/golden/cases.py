"""Golden-token cases: tokens the decode paths produced before the family-seam refactor (issue 24).

`python tests/golden/cases.py --record` rewrote tests/golden/tokens.json on the pre-refactor main
(commit c9f708b); test_golden_tokens.py replays every case through today's entry points and
requires identical tokens. The cases name what they run, not how: each case is a callable of
the setup below, so the refactor changes the call sites here, never the recorded tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from lisa_trt.speculative.methods import get_method, resolve_method

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "models"))


def llamagen_setup():
    import lisa_trt
    from lisa_trt.artifacts import load_drafter_by_name, load_tables_by_name

    target = lisa_trt.load_target("demo")
    return dict(target=target, drafter=load_drafter_by_name("demo-lisa", target),
                tables=load_tables_by_name("demo", target))


def chameleon_setup(tmp: Path):
    import lisa_trt
    from chameleon_fixtures import save_model_dir
    from lisa_trt.calibration.tables import load_tables_for
    from lisa_trt.families.chameleon import CHAMELEON
    from lisa_trt.families.chameleon.drafter import ChameleonDrafter
    from lisa_trt.families.chameleon.lumina import LuminaTokenizer

    d = save_model_dir(tmp, seed=5, vq=False, num_key_value_heads=2)
    target = lisa_trt.load_target(d)
    tok = LuminaTokenizer(d)
    torch.manual_seed(0)
    drafter = ChameleonDrafter.from_chameleon(target)
    # The image-code tables the decode cases verify with: written on c9f708b / a01c9bd by
    # calibrate_chameleon(target, tok, randn(N_CODES, 8, seed 0), ["tok60".."tok65"], 64, 64,
    # cfg_scale=2.0, top_k=16, samples_per_pos=4, n_clusters=4, lantern_k=8, batch_size=3,
    # min_cluster_samples=8), frozen so that these cases pin the decode paths alone (the
    # calibration driver is pinned by tests/calibration/test_table_cases.py).
    tables = load_tables_for(HERE / "chameleon_tables.safetensors", target, CHAMELEON.sub_vocab(target))
    return dict(target=target, tok=tok, drafter=drafter, tables=tables)


# -- LlamaGen cases ---------------------------------------------------------------------------

def lg_ar(s, greedy, seed):
    import lisa_trt

    cond = torch.tensor([1, 7, 3])
    return lisa_trt.generate(s["target"], cond, cfg_scale=4.0, top_k=100, greedy=greedy, seed=seed)


def lg_spec(s, method, seed):
    from lisa_trt.config import SamplingConfig
    from lisa_trt.speculative.decode import SpeculativeDecoder, SpecConfig

    dec = SpeculativeDecoder(s["target"], s["drafter"], s["tables"])
    tokens, _ = dec.generate(torch.tensor([1, 7, 3]), sampling=SamplingConfig(cfg_scale=4.0, top_k=100),
                             method=resolve_method(method), spec=SpecConfig.make(method, top_k=4, depth=3, total_tokens=12), seed=seed)
    return tokens


# -- Chameleon cases --------------------------------------------------------------------------

CAPS = ["a red fox", "tok70 tok71 tok72"]


def ch_raw(s, greedy, image_only):
    import lisa_trt

    ids = torch.tensor([[1, 60, 61, 62, 63], [1, 70, 71, 72, 73]])
    return lisa_trt.generate(s["target"], ids, max_new_tokens=12, greedy=greedy, image_tokens_only=image_only,
                             seed=3)


def _request(s, cfg_scale):
    """The family prompter's Request for CAPS (a 64 x 96 image; CFG rows when guided)."""
    from lisa_trt.models.family import family_of
    from lisa_trt.speculative.sampling import cfg_active

    return family_of(s["target"].config).prompter(s["target"]).encode(CAPS, cfg=cfg_active(cfg_scale), width=64,
                                                                       height=96)


def ch_ar(s, cfg_scale, greedy, seed):
    from lisa_trt.config import SamplingConfig
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method

    req = _request(s, cfg_scale)
    return run_method(get_method("vanilla"), s["target"], None, None, req.cond, layout=req.layout, seed=seed, spec=SpecConfig(),
                      sampling=SamplingConfig(cfg_scale=cfg_scale, top_k=16, greedy=greedy))[0]


def ch_spec(s, method, cfg_scale, greedy, seed):
    from lisa_trt.config import SamplingConfig
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method

    req = _request(s, cfg_scale)
    spec = SpecConfig.make(method, top_k=3, depth=3, total_tokens=8, lantern_k=8)
    return run_method(resolve_method(method), s["target"], s["drafter"], s["tables"], req.cond, layout=req.layout, seed=seed,
                      spec=spec, sampling=SamplingConfig(cfg_scale=cfg_scale, top_k=16, greedy=greedy))[0]


LLAMAGEN = {
    "ar_greedy": lambda s: lg_ar(s, True, None),
    "ar_sample": lambda s: lg_ar(s, False, 0),
    **{f"spec_{m}": (lambda m: lambda s: lg_spec(s, m, 0))(m) for m in ("greedy", "exact", "lantern", "gasv")},
}
CHAMELEON = {
    "raw_greedy": lambda s: ch_raw(s, True, False),
    "raw_greedy_image": lambda s: ch_raw(s, True, True),
    "raw_sample_image": lambda s: ch_raw(s, False, True),
    "ar_greedy_cfg1": lambda s: ch_ar(s, 1.0, True, None),
    "ar_greedy_cfg3": lambda s: ch_ar(s, 3.0, True, None),
    "ar_sample_cfg2": lambda s: ch_ar(s, 2.0, False, 0),
    "spec_greedy_cfg3": lambda s: ch_spec(s, "greedy", 3.0, False, 0),
    "spec_exact_cfg2": lambda s: ch_spec(s, "exact", 2.0, False, 0),
    "spec_lantern_cfg2": lambda s: ch_spec(s, "lantern", 2.0, False, 0),
    "spec_gasv_cfg2": lambda s: ch_spec(s, "gasv", 2.0, False, 0),
    "spec_gasv_greedy_cfg2": lambda s: ch_spec(s, "gasv", 2.0, True, 0),
}


def run_all(tmp: Path) -> dict:
    out = {}
    torch.manual_seed(0)
    s = llamagen_setup()
    out["llamagen"] = {k: f(s).tolist() for k, f in LLAMAGEN.items()}
    torch.manual_seed(0)
    s = chameleon_setup(tmp)
    out["chameleon"] = {k: f(s).tolist() for k, f in CHAMELEON.items()}
    return out


if __name__ == "__main__" and "--record" in sys.argv:
    import tempfile

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as t:
        res = run_all(Path(t))
    (HERE / "tokens.json").write_text(json.dumps(res))
    print({f: {k: len(v) for k, v in d.items()} for f, d in res.items()})
