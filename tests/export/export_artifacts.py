"""Tiny artifacts (target, drafter, GASV tables, VQ) shared by tests/export and tests/engines."""

import torch

from lisa_trt.calibration.profile import lantern_neighbors
from lisa_trt.calibration.tables import GASVTables, head_rows, whiten, whitening
from lisa_trt.models.target_config import vq_config
from lisa_trt.models.checkpoints import target_hash
from lisa_trt.models.drafter import Drafter
from lisa_trt.families.llamagen.vq import VQModel
from lisa_trt.speculative.gasv import GASVConfig
from lisa_trt.testing import make_target


def make_tables(target, C=8, seed=0, sub_vocab=None) -> GASVTables:
    """Random tables over the target's head rows (`sub_vocab`: the code rows of a sub-vocabulary), bound."""
    g = torch.Generator().manual_seed(seed)
    W = head_rows(target, sub_vocab)
    V = W.shape[0]
    invstd = whitening(W)
    wt = whiten(W, invstd)
    return GASVTables(invstd=invstd, w_tilde_norm2=(wt * wt).sum(1),
                      cluster=torch.randint(0, C, (V,), generator=g, dtype=torch.int32),
                      centroids=torch.randn(C, 4, generator=g), beta=0.5 + 2 * torch.rand(C, generator=g),
                      lantern_neighbors=lantern_neighbors(torch.randn(V, 6, generator=g), 20),
                      config=GASVConfig(theta_geo=3.0, neighbours=12, kappa=1.5, lam=0.3),
                      target_hash=target_hash(target),
                      vocab_size=V).bind(W)


def make_vq(codebook_size=256, seed=0) -> VQModel:
    torch.manual_seed(seed)
    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32,
                    codebook_size=codebook_size, usage_buffer=16)
    return VQModel(cfg).eval()


def make_artifacts(model_type="c2i", seed=0):
    target = make_target(model_type, seed=seed)
    torch.manual_seed(seed)
    drafter = Drafter.from_target(target).eval()
    return dict(target=target, drafter=drafter, tables=make_tables(target), vq=make_vq(target.config.vocab_size))
