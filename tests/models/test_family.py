"""The model-family seam: LlamaGen behind family_of, a toy family registered here drives the io
spec, TargetConfig describes non-square grids, and "demo" is a registered artifact set."""

import pytest
import torch

from lisa_trt.models.target_config import TargetConfig
from lisa_trt.errors import ConfigError, InputError
from lisa_trt.models.io_spec import Graph, graph_spec
from lisa_trt.models import family as F
from lisa_trt.models.conditioning import CaptionFeatures, ClassLabels, TextPrompts
from lisa_trt.models.artifact_sets import artifact_set, bundled_file, bundled_names
from lisa_trt.testing import make_target


def test_llamagen_is_the_family_of_c2i_and_t2i():
    c2i, t2i = make_target("c2i"), make_target("t2i")
    fam = F.family_of(c2i.config)
    assert fam is F.family_of("t2i") and fam.name == "llamagen"
    assert fam.conditioning(c2i.config) == ClassLabels(c2i.config.num_classes)
    assert fam.conditioning(t2i.config) == CaptionFeatures(t2i.config.cls_token_num, t2i.config.caption_dim)
    assert fam.conditioning("c2i") == ClassLabels() and fam.conditioning("t2i") == CaptionFeatures()
    cond = torch.tensor([1, 2])
    assert fam.check_cond(c2i.config, cond) == c2i.check_cond(cond) == 2
    assert torch.equal(fam.null_cond(c2i.config, cond), c2i.null_cond(cond))
    with pytest.raises(InputError, match="unknown class id"):
        fam.check_cond(c2i.config, torch.tensor([99]))
    assert fam.condition_tensors(c2i) == {} and set(fam.condition_tensors(t2i)) == {"uncond_embedding"}
    cap = fam.example_cond(t2i.config, 2, torch.Generator().manual_seed(0))
    assert fam.check_cond(t2i.config, cap) == 2
    ins = fam.cond_inputs(t2i.config, cap, "cpu", torch.float32)
    back = fam.cond_from_inputs(t2i.config, ins)
    assert torch.equal(back[0], cap[0]) and torch.equal(back[1], cap[1])


def test_the_family_answers_caption_shape_and_the_tiny_test_targets():
    """The generic text / training layers ask the family (its conditioning), and lisa_trt.testing
    builds through it (random_target / random_cond), instead of branching on model_type."""
    from lisa_trt.testing import make_cond
    from lisa_trt.models.captions import caption_shape

    c2i, t2i = make_target("c2i"), make_target("t2i")
    fam = F.family_of("c2i")
    assert caption_shape(t2i.config) == (6, 12)
    with pytest.raises(InputError, match="captions condition text-to-image targets only"):
        caption_shape(c2i.config)
    assert F.family_of("chameleon").conditioning(object()) == TextPrompts(negative=True)  # its prompter takes one
    assert F.family_of("janus").conditioning(object()) == TextPrompts(negative=True)  # the template's negative row
    assert fam.check_cond(t2i.config, make_cond(t2i, batch=3)) == 3
    assert bool((make_cond(c2i, batch=8) < c2i.config.num_classes).all())  # real classes, never the null id
    with pytest.raises(NotImplementedError, match="tiny random target"):
        F.family_of("janus").random_target("janus")


def test_unknown_model_types_name_the_registered_ones():
    with pytest.raises(F.UnknownModelTypeError, match="c2i, chameleon, emu3, janus, t2i"):
        F.family_of("x2i")
    assert issubclass(F.UnknownModelTypeError, ConfigError)
    from lisa_trt.families.llamagen.model import Transformer

    with pytest.raises(ConfigError, match="LlamaGen Transformer serves"):
        Transformer(TargetConfig(dim=64, n_layer=2, n_head=4, vocab_size=256, block_size=16, model_type="toy"))


class ToyFamily(F.ModelFamily):
    """A second family with a non-square grid and a text-token prefix (a Lumina-mGPT stand-in)."""

    name = "toy"
    model_types = ("toy",)

    def cond_specs(self, cfg_or_type):
        return (("prompt_ids", "int64", ("batch", "prefix"), "text token ids"),)

    def check_cond(self, cfg, cond):
        if cond.dim() != 2:
            raise InputError("toy conditions are (B, prefix) token ids")
        return cond.shape[0]


def test_a_new_family_registers_here_and_owns_the_prefill_inputs():
    F.register_family(ToyFamily())
    try:
        assert "toy" in F.model_types() and F.family_of("toy").name == "toy"
        spec = graph_spec(Graph.TARGET_PREFILL, n_layer=2, model_type="toy")
        assert spec.input_names[0] == "prompt_ids" and spec.input("prompt_ids").axes == ("batch", "prefix")
        cfg = TargetConfig(dim=64, n_layer=2, n_head=4, vocab_size=256, block_size=12, grid_shape=(3, 4),
                           cls_token_num=5, model_type="toy")
        assert cfg.grid_hw == (3, 4) and cfg.seq_len == 17
        assert TargetConfig.from_dict(cfg.to_dict()) == cfg
        with pytest.raises(ConfigError, match="grid_hw"):
            cfg.grid_size
        assert F.family_of(cfg).check_cond(cfg, torch.zeros(2, 5, dtype=torch.long)) == 2
    finally:
        F._FAMILIES.pop("toy")


def test_square_configs_serialise_as_before_and_bad_grids_are_refused():
    assert "grid_shape" not in TargetConfig().to_dict()
    with pytest.raises(ConfigError, match="grid_shape"):
        TargetConfig(dim=64, n_head=4, block_size=12, grid_shape=(3, 5))
    with pytest.raises(ConfigError, match="must be a square"):
        TargetConfig(dim=64, n_head=4, block_size=12)


def test_demo_is_a_registered_artifact_set():
    s = artifact_set("demo")
    assert s is not None and s.default_drafter == "demo-lisa" and s.default_tables == "demo" and s.vq == "demo"
    assert artifact_set("some/checkpoint.pt") is None and artifact_set(None) is None
    assert bundled_file("demo-eagle3", "drafters").name == "drafter_eagle3.safetensors"
    assert bundled_file("nope", "drafters") is None and "demo-lisa" in bundled_names("drafters")
    assert callable(s.extra("class_names")) and s.extra("no_such_hook", 3) == 3
