"""The condition's static axes come from the config's `cond_dims()` (TargetShape), never from a
family's own fields: a toy config with a shape no family has (a 40-slot prefix and a "style_dim"
condition axis, no cls_token_num / caption_dim) sizes the export dims and the TensorRT profiles."""

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from lisa_trt.engines.profiles import profiles_from_io_spec
from lisa_trt.errors import InputError
from lisa_trt.models.io_spec import Graph, export_dims, graph_spec
from lisa_trt.models.target_config import target_config


@dataclass(frozen=True)
class FourthShape:
    """Only the config protocol (models/target_config.TargetShape) and a fixed image length."""

    model_type: str = "fourth"
    dim: int = 32
    n_layer: int = 2
    n_head: int = 4
    vocab_size: int = 64
    block_size: int = 16
    prefix: int = 40
    style: int = 5

    @property
    def kv_heads(self) -> int:
        return 2

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    def cond_dims(self) -> dict:
        return {"prefix": self.prefix, "style_dim": self.style} if self.prefix else {}


def test_export_dims_read_the_configs_cond_dims():
    dims = export_dims(FourthShape(), max_cache_len=64)
    assert dims["prefix"] == 40 and dims["style_dim"] == 5
    assert "caption_dim" not in dims
    assert (dims["vocab"], dims["dim"], dims["kv_heads"], dims["head_dim"], dims["block"]) == (64, 32, 2, 8, 16)


@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_llamagen_cond_dims_are_its_prefix_and_caption_width(model_type):
    cfg = target_config("tiny", model_type=model_type)
    dims = export_dims(cfg, max_cache_len=64)
    assert dims["prefix"] == cfg.cls_token_num and dims["caption_dim"] == cfg.caption_dim


def _one_engine_manifest(cfg, max_tree=8):
    """What profiles_from_io_spec reads of a bundle whose verify graph runs the prefill."""
    xf = SimpleNamespace(prefill_max_seq=lambda layout: None, bundle_prefill_ids=lambda man: object())
    return SimpleNamespace(max_tree=max_tree, dims=export_dims(cfg, max_cache_len=64), export_family=xf,
                           layout=None, target_config=cfg, graphs=[Graph.TARGET_VERIFY.value],
                           spec=lambda g: graph_spec(g, n_layer=cfg.n_layer))


def test_verify_prefill_profile_spans_the_configs_prefix():
    profs = profiles_from_io_spec(_one_engine_manifest(FourthShape()), max_batch=1)["target_verify"]
    prefill = {p.name: p for p in profs}["prefill"]
    assert prefill.shapes["input_ids"] == ((1, 1), (2, 20), (2, 40))


def test_one_engine_bundle_without_a_prefix_is_refused_naming_cond_dims():
    with pytest.raises(InputError, match="cond_dims"):
        profiles_from_io_spec(_one_engine_manifest(FourthShape(prefix=0)), max_batch=1)
