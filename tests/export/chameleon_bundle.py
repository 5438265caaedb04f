"""A tiny Chameleon-family deployment for export / engine tests: HF checkpoint directory (with
tokenizer and VQGAN), a briefly trained drafter, image-code tables; all deterministic.

    art = make_chameleon_artifacts(root)      # {"model_dir", "drafter", "tables", "size", ...}
    export_cli(art["model_dir"], out, **export_kwargs(art))

`golden_runs(engine_dir)` decodes the golden captions with every verification rule through the
generic Pipeline (one batch, one generator, as the former runtime/chameleon.run_engine did);
tests/export/data/chameleon_run_golden.json holds what the fp32 export gave before the Chameleon
export was folded into the generic exporter (token identity).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from chameleon_fixtures import N_CODES, save_model_dir  # noqa: E402,F401 (N_CODES re-exported)

SIZE = 64  # 4 x 4 latent codes + 4 row ends per image
GOLDEN_CAPTIONS = ["a red fox", "tok70 tok71 tok72 tok73 tok74"]  # different lengths: left padding
GOLDEN_RUNS = (("vanilla", False), ("vanilla", True), ("greedy", True), ("exact", False), ("lantern", False),
               ("gasv", False))
GOLDEN = Path(__file__).resolve().parent / "data" / "chameleon_run_golden.json"


def make_chameleon_artifacts(root) -> dict:
    """Checkpoint dir + drafter + tables under `root`: the tiny model and VQGAN are rebuilt from
    seeds; the drafter and the image-code tables are the files data/chameleon_{drafter,tables}
    .safetensors, trained and calibrated on c9f708b (before the family seam) together with the
    golden runs, so the golden checks the export and run path alone."""
    import shutil

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    d = save_model_dir(root / "model", seed=5, num_key_value_heads=2, swin_norm=True)
    data = GOLDEN.parent
    shutil.copy(data / "chameleon_drafter.safetensors", root / "drafter.safetensors")
    shutil.copy(data / "chameleon_tables.safetensors", root / "tables.safetensors")
    return {"model_dir": d, "drafter": root / "drafter.safetensors", "tables": root / "tables.safetensors",
            "size": SIZE}


def export_kwargs(art: dict, **over) -> dict:
    kw = dict(image_size=art["size"], drafter=art["drafter"], tables=art["tables"], max_prompt=32, max_tree=16,
              generation={"cfg_scale": 2.0, "top_k": 16})
    kw.update(over)
    return kw


def export_cli(model_dir, out_dir, *, image_size, drafter=None, tables=None, max_prompt=None, max_tree=None,
               generation=None, validate=True, fp16=False, quantize="none"):
    """`lisa-trt export --model DIR` (the generic export command) with these settings; the Manifest."""
    from click.testing import CliRunner

    from lisa_trt.cli import main
    from lisa_trt.export.manifest import read_manifest

    args = ["export", "--model", model_dir, "--out", out_dir, "--image-size", image_size, "--quantize", quantize]
    args += ["--drafter", drafter] if drafter else []
    args += ["--tables", tables] if tables else []
    args += ["--max-prompt", max_prompt] if max_prompt else []
    args += ["--max-tree", max_tree] if max_tree else []
    args += ["--fp16"] if fp16 else []
    args += [] if validate else ["--no-validate"]
    for k, v in (generation or {}).items():
        args += ["--" + k.replace("_", "-"), v]
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output + repr(r.exception)
    return read_manifest(out_dir)


def golden_runs(engine_dir, out_root=None) -> dict:
    """{"<verify>-<greedy|sample>": {"codes": nested list, "mal": .., "target_forwards": ..}}: the
    golden captions decoded as one batch from one generator (Pipeline batch=True, row_seeds=False)."""
    from lisa_trt.runtime.pipeline import Pipeline

    res = {}
    with Pipeline.from_dir(engine_dir, backend="ort", threads=1) as pipe:
        for verify, greedy in GOLDEN_RUNS:
            key = f"{verify}-{'greedy' if greedy else 'sample'}"
            r = pipe.generate(GOLDEN_CAPTIONS, verify=verify, greedy=greedy, seed=3, batch=True, row_seeds=False,
                              decode=False, tree_top_k=3, tree_depth=3, tree_tokens=8)
            st = r.stats[0]
            res[key] = {"codes": r.codes.tolist(), "mal": st.get("mal") if verify != "vanilla" else None,
                        "target_forwards": st.get("target_forwards") if verify != "vanilla" else None}
    return res


if __name__ == "__main__":  # re-record the golden runs (only on a commit whose tokens are the reference)
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        art = make_chameleon_artifacts(Path(tmp) / "art")
        export_cli(art["model_dir"], Path(tmp) / "eng", **export_kwargs(art))
        runs = golden_runs(Path(tmp) / "eng", Path(tmp) / "runs")
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(runs, indent=1) + "\n")
    print(f"wrote {GOLDEN}: {sorted(runs)}")
