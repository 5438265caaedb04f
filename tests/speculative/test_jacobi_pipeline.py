"""Pipeline.generate runs SJD-PAC and ZipAR (in-memory models), with their knobs as keywords."""

import torch

from lisa_trt.models.target_config import vq_config
from lisa_trt.families.llamagen.vq import VQModel
from lisa_trt.runtime.pipeline import Pipeline
from lisa_trt.testing import make_target

GEN = {"sampling": {"cfg_scale": 2.0, "top_k": 0}, "class_names": [f"c{i}" for i in range(10)]}


def test_pipeline_runs_sjd_pac_and_zipar_with_their_knobs():
    torch.manual_seed(0)
    t = make_target(std=0.3)
    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32, codebook_size=256)
    pipe = Pipeline.from_models(t, None, None, VQModel(cfg).eval(), generation=GEN)
    pac = pipe.generate([1, 4], seed=2, verify="sjd-pac", sjd_pac_tree_width=2, decode=False)
    assert pac.tokens.shape == (2, 16) and all(s["verify"] == "sjd-pac" and s["mean_tvd"] == 0.0 for s in pac.stats)
    z1 = pipe.generate([1, 4], seed=2, verify="zipar", zipar_window=1, decode=False)
    z4 = pipe.generate([1, 4], seed=2, verify="zipar", zipar_window=4, decode=False)
    assert all(s["mean_tvd"] > 1e-4 for s in z1.stats) and all(s["mean_tvd"] < 1e-5 for s in z4.stats)
    img = pipe.generate([1], seed=2, verify="zipar", zipar_window=2)
    assert len(img.images) == 1
