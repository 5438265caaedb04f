"""Shared fixtures: a tiny in-memory pipeline (torch backend; no export, no server)."""

import pytest
import torch

from lisa_trt.calibration.profile import calibrate
from lisa_trt.config import SamplingConfig
from lisa_trt.models.target_config import vq_config
from lisa_trt.models.drafter import Drafter
from lisa_trt.families.llamagen.vq import VQModel
from lisa_trt.runtime.pipeline import Pipeline
from lisa_trt.testing import make_target

GEN = {"sampling": {"cfg_scale": 2.0, "top_k": 0}, "class_names": [f"c{i}" for i in range(10)],
       "tree": {"default": {"top_k": 3, "depth": 2, "total_tokens": 8}}}


@pytest.fixture(scope="session")
def pipe():
    torch.manual_seed(0)
    t = make_target(std=0.3)
    d = Drafter.from_target(t).eval()
    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32, codebook_size=256)
    vq = VQModel(cfg).eval()
    tables = calibrate(t, vq.codebook().detach(), num_rollouts=4, sampling=SamplingConfig(cfg_scale=2.0),
                       progress=False)
    return Pipeline.from_models(t, d, tables, vq, class_names=GEN["class_names"], generation=GEN)


