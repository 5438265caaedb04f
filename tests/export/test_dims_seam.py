"""One source of an export's static axes: `io_spec.common_dims` (every family's head, cache, GASV and
draft axes), to which a family's `ExportFamily.export_dims` adds its own; `add_graphs` sizes the
graphs it adds through the bundle's export family."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lisa_trt.families.llamagen.config import tiny_config
from lisa_trt.models.drafter import DrafterConfig
from lisa_trt.models.io_spec import common_dims, export_dims
from lisa_trt.models.medusa import MedusaConfig
from lisa_trt.models.target_config import vq_config


def _prompt_cfg():
    """What the token-prompt export family reads of a config (no prefix, no image length)."""
    return SimpleNamespace(model_type="toy", vocab_size=96, dim=32, n_layer=2, n_head=4, kv_heads=2, head_dim=8)


@pytest.mark.parametrize("drafter", ["eagle", "medusa", None])
def test_every_family_shares_common_dims(drafter):
    from lisa_trt.export.families import export_family_named

    cfg = tiny_config()
    dc = {"eagle": DrafterConfig.for_target(cfg), "medusa": MedusaConfig(dim=cfg.dim, vocab_size=cfg.vocab_size),
          None: None}[drafter]
    common = common_dims(cfg, max_cache_len=40, drafter_cfg=dc)
    assert ("draft_hidden" in common) == (drafter == "eagle")
    assert common["cache_len"] == 40 and common["tap_dim"] == 3 * cfg.dim

    ll = export_dims(cfg, max_cache_len=40, drafter_cfg=dc)
    assert {k: ll[k] for k in common} == common
    assert set(ll) - set(common) == {"prefix", "caption_dim", "block"}

    pcfg = _prompt_cfg()
    pf = export_family_named("chameleon").export_dims(pcfg, max_cache_len=40, drafter_cfg=dc, codes=17)
    assert pf == {**common_dims(pcfg, max_cache_len=40, drafter_cfg=dc), "codes": 17}


def test_export_dims_size_a_non_square_image():
    cfg = tiny_config(block_size=8, grid_shape=(2, 4))
    vq = vq_config("VQ-16")
    dims = export_dims(cfg, max_cache_len=40, vq_cfg=vq)
    assert (dims["height"], dims["width"]) == (2 * vq.downsample, 4 * vq.downsample)


class _Stop(Exception):
    pass


def test_add_graphs_sizes_through_the_bundles_export_family(monkeypatch, tmp_path):
    import lisa_trt.export.manifest as M
    import lisa_trt.export.upgrade as U

    seen = []

    class Family:
        def export_dims(self, cfg, **kw):
            seen.append((cfg, kw))
            raise _Stop

    cfg, dc = tiny_config(), object()  # a drafter config no generic code could size
    man = SimpleNamespace(has=lambda g: False, quantization="none", drafter_config=dc, target_config=cfg,
                          max_cache_len=48, export_family=Family())
    monkeypatch.setattr(M, "read_manifest", lambda d: man)
    monkeypatch.setattr(U, "_bundle_models", lambda d, m: {"target": None, "drafter": None})
    with pytest.raises(_Stop):
        U.add_graphs(tmp_path)
    assert seen == [(cfg, {"max_cache_len": 48, "drafter_cfg": dc})]
