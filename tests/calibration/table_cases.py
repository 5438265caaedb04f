"""Calibration-table cases recorded before the one-driver refactor (issue 24).

`python tests/calibration/table_cases.py --record` wrote tests/calibration/tables_before.json on
main a01c9bd with the calibration entry points of that commit (LlamaGen: calibration/profile.py
`calibrate`; Chameleon: calibration/chameleon_tables.py `calibrate_chameleon`, as called by
tests/speculative/test_chameleon_spec.py `code_tables` and tests/golden/cases.py). Each case is
the call that makes the tables today; test_table_cases.py replays it and compares every tensor
(sha256 of its bytes, dtype and shape) and the metadata with the record.

The cases name what they calibrate, not how: the refactor changed the call sites here
(`calibrate_chameleon` -> the one driver, `chameleon_tables` below), never the record.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "models"))
RECORD = HERE / "tables_before.json"
TENSORS = ("invstd", "w_tilde_norm2", "cluster", "centroids", "beta", "lantern_neighbors")
# The GASV knobs the record was made with: calibration's default then, GASVConfig's (the spec's);
# since issue 52 calibration stores the quality-neutral knobs by default, so the cases name these.
RECORDED_KNOBS = {"kappa": 1.0, "lam": 0.6, "delta": 1.0}


def recorded_gasv(**over):
    from lisa_trt.speculative.gasv import GASVConfig

    return GASVConfig(**{**RECORDED_KNOBS, **over})


def digest(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    return f"{t.dtype}:{tuple(t.shape)}:" + hashlib.sha256(t.numpy().tobytes()).hexdigest()[:32]


def summary(tables) -> dict:
    """Every stored tensor's digest, the metadata (GASV constants, settings), and W~'s digest."""
    meta = json.loads(json.dumps(tables.metadata()))
    out = {"tensors": {n: digest(getattr(tables, n)) for n in TENSORS}, "metadata": meta}
    if tables.w_tilde is not None:
        out["w_tilde"] = digest(tables.w_tilde)
    return out


# -- cases ----------------------------------------------------------------------------------

def chameleon_target(tmp: Path):
    import lisa_trt
    from chameleon_fixtures import save_model_dir
    from lumina_calls import LuminaTokenizer

    d = save_model_dir(tmp, seed=5, vq=False, num_key_value_heads=2)
    return lisa_trt.load_target(d), LuminaTokenizer(d)


def chameleon_codebook():
    from chameleon_fixtures import N_CODES

    return torch.randn(N_CODES, 8, generator=torch.Generator().manual_seed(0))


def chameleon_tables(target, tok, captions, width, height, *, cfg_scale=3.0, temperature=1.0, top_k=2000,
                     **kw):
    """What `calibrate_chameleon(target, tok, codebook, captions, width, height, ...)` was: the one
    driver over Lumina-mGPT's span request (image codes = the layout's sub-vocabulary)."""
    from lisa_trt.calibration.profile import calibrate
    from lisa_trt.config import SamplingConfig
    from lumina_calls import span_request

    prompts, layout, _ = span_request(target, tok, captions, width, height, cfg_scale > 1)
    kw.setdefault("gasv", recorded_gasv())
    return calibrate(target, chameleon_codebook(), conds=prompts, layout=layout, progress=False,
                     sampling=SamplingConfig(cfg_scale=cfg_scale, temperature=temperature, top_k=top_k), **kw)


def chameleon_fixture(tmp: Path):
    """tests/speculative/test_chameleon_spec.py `code_tables` == tests/golden/cases.py chameleon_setup."""
    target, tok = chameleon_target(tmp)
    return chameleon_tables(target, tok, [f"tok{60 + i}" for i in range(6)], 64, 64, cfg_scale=2.0, top_k=16,
                            samples_per_pos=4, n_clusters=4, lantern_k=8, batch_size=3, min_cluster_samples=8)


def chameleon_one_batch(tmp: Path):
    """One rollout batch, CFG 3, the GASV knobs given (kappa / lambda / delta), 64x96 spans."""
    from lisa_trt.speculative.gasv import GASVConfig

    target, tok = chameleon_target(tmp)
    return chameleon_tables(target, tok, ["a red fox", "tok70 tok71", "tok80"], 64, 96, cfg_scale=3.0, top_k=8,
                            samples_per_pos=3, n_clusters=5, lantern_k=12, batch_size=4, min_cluster_samples=4,
                            seed=3, gasv=GASVConfig(kappa=1.5, lam=0.5, delta=0.4))


def chameleon_model_dir(tmp: Path) -> Path:
    """A tiny checkpoint directory with tokenizer and VQGAN (tests/export/chameleon_bundle.py's)."""
    from chameleon_fixtures import save_model_dir

    return save_model_dir(tmp / "model", seed=5, num_key_value_heads=2)


def chameleon_cli(tmp: Path):
    """`lisa-trt calibrate --model DIR` (the generic entry; tests/models/lumina_calls.calibrate_cli)
    with the family's built-in captions (different lengths, one batch)."""
    from lumina_calls import calibrate_cli

    return calibrate_cli(chameleon_model_dir(tmp), tmp / "t.safetensors", image_size=64, rollouts=4,
                         samples_per_pos=2, clusters=4, lantern_k=8, top_k=16, cfg_scale=2.0, seed=0,
                         **RECORDED_KNOBS)


def chameleon_cli_two_batches(tmp: Path):
    """calibrate_cli over 10 captions of different lengths: two rollout batches (8 + 2)."""
    from lumina_calls import calibrate_cli

    return calibrate_cli(chameleon_model_dir(tmp), tmp / "t.safetensors", image_size=32, rollouts=10,
                         samples_per_pos=3, clusters=3, lantern_k=6, top_k=12, cfg_scale=3.0, seed=1,
                         **{**RECORDED_KNOBS, "kappa": 1.2, "lam": 0.5})


def llamagen_tiny(tmp: Path):
    """tests/calibration/test_profile.py's tiny c2i target (6 rollouts in batches of 4)."""
    import torch.nn.functional as F

    from lisa_trt import testing
    from lisa_trt.calibration.profile import calibrate
    from lisa_trt.config import SamplingConfig

    model = testing.make_target(seed=0)
    codebook = F.normalize(torch.randn(256, 8, generator=torch.Generator().manual_seed(1)), dim=1)
    return calibrate(model, codebook, num_rollouts=6, batch_size=4, lantern_k=20, progress=False, seed=0,
                     gasv=recorded_gasv(),
                     sampling=SamplingConfig(cfg_scale=2.0, top_k=40))


def llamagen_t2i(tmp: Path):
    """A tiny t2i target with caption-feature conditions (two valid lengths), top-p and w~ clusters."""
    from lisa_trt import testing
    from lisa_trt.calibration.profile import calibrate
    from lisa_trt.config import SamplingConfig

    model = testing.make_target("t2i", seed=2)
    conds = testing.make_cond(model, batch=5, seed=4)
    codebook = torch.randn(256, 8, generator=torch.Generator().manual_seed(3))
    return calibrate(model, codebook, conds=conds, batch_size=2, lantern_k=24, progress=False, seed=1,
                     gasv=recorded_gasv(),
                     cluster_space="w_tilde", n_clusters=12, min_cluster_samples=16,
                     sampling=SamplingConfig(cfg_scale=1.5, top_k=64, top_p=0.9, temperature=0.9))


def llamagen_demo(tmp: Path):
    """`lisa-trt calibrate --model demo` with the bundled tables' flags, at 4 rollouts."""
    return _demo_cli(tmp, 4)


def llamagen_demo_bundled(tmp: Path):
    """scripts/demo/lisa_assets.sh: the command that made lisa_trt/assets/demo/tables.safetensors."""
    return _demo_cli(tmp, 64)


def _demo_cli(tmp: Path, rollouts: int):
    from click.testing import CliRunner

    from lisa_trt.calibration.tables import load_tables
    from lisa_trt.cli import main

    out = tmp / f"demo{rollouts}.safetensors"
    r = CliRunner().invoke(main, ["calibrate", "--model", "demo", "--out", str(out), "--rollouts", str(rollouts),
                                  "--seed", "0", "--kappa", "2", "--lambda", "0.4", "--delta", "0.3"])
    assert r.exit_code == 0, r.output
    return load_tables(out)


CASES = {"chameleon_fixture": chameleon_fixture, "chameleon_one_batch": chameleon_one_batch,
         "chameleon_cli": chameleon_cli, "chameleon_cli_two_batches": chameleon_cli_two_batches,
         "llamagen_tiny": llamagen_tiny, "llamagen_t2i": llamagen_t2i, "llamagen_demo": llamagen_demo,
         "llamagen_demo_bundled": llamagen_demo_bundled}


def run(name: str, tmp: Path) -> dict:
    torch.manual_seed(0)
    return summary(CASES[name](tmp))


def check(name: str, tmp: Path) -> list:
    """Names of the tensors (and 'gasv') that differ from the record (the demo case: also from the
    shipped file)."""
    got, rec = run(name, tmp), json.loads(RECORD.read_text())[name]
    bad = [k for k in TENSORS if got["tensors"][k] != rec["tensors"][k]]
    bad += ["gasv"] if got["metadata"]["gasv"] != rec["metadata"]["gasv"] else []
    if name == "llamagen_demo_bundled":
        from lisa_trt.calibration.tables import load_tables
        from lisa_trt.models.artifact_sets import artifact_set

        shipped = summary(load_tables(artifact_set("demo").tables["demo"]))
        bad += [f"shipped {k}" for k in TENSORS if shipped["tensors"][k] != got["tensors"][k]]
    return bad


if __name__ == "__main__" and "--check" in sys.argv:
    import tempfile

    torch.set_num_threads(1)
    for name in [a for a in sys.argv[1:] if a in CASES]:
        with tempfile.TemporaryDirectory() as t:
            print(name, "differs:", check(name, Path(t)) or "nothing")

if __name__ == "__main__" and "--record" in sys.argv:
    import tempfile

    torch.set_num_threads(1)
    names = [a for a in sys.argv[1:] if a in CASES] or list(CASES)
    rec = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    for name in names:
        with tempfile.TemporaryDirectory() as t:
            rec[name] = run(name, Path(t))
        print(name, rec[name]["tensors"]["beta"])
    RECORD.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
