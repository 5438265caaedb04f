"""io_spec: one consistent table of graph inputs/outputs (names, dtypes, axes)."""

import pytest

from lisa_trt.models.target_config import target_config
from lisa_trt.engines.base import GraphKind
from lisa_trt.models.io_spec import (
    DYNAMIC_AXES,
    GASV_PARAMS,
    Graph,
    describe,
    export_dims,
    graph_spec,
    past_names,
    present_names,
)
from lisa_trt.speculative.gasv import GASVConfig


@pytest.mark.parametrize("graph", list(Graph))
def test_every_graph_has_unique_names_and_known_axes(graph):
    spec = graph_spec(graph, n_layer=3)
    names = spec.input_names + spec.output_names
    assert len(set(spec.input_names)) == len(spec.input_names)
    assert len(set(spec.output_names)) == len(spec.output_names)
    cfg = target_config("tiny")
    from lisa_trt.models.target_config import vq_config
    from lisa_trt.models.drafter import DrafterConfig

    dims = export_dims(cfg, max_cache_len=40, drafter_cfg=DrafterConfig.for_target(cfg), vq_cfg=vq_config("VQ-16"))
    for t in spec.inputs + spec.outputs:
        for a in t.axes:
            assert a in DYNAMIC_AXES or a in dims, f"{graph.value}.{t.name}: axis {a} unresolved"
    assert all(n for n in names)
    assert isinstance(graph.kind, GraphKind)


def test_target_graphs_use_optimum_names_and_return_only_the_new_kv_rows():
    spec = graph_spec(Graph.TARGET_VERIFY, n_layer=4)
    assert spec.input_names[:4] == ["input_ids", "position_ids", "cache_slots", "attention_mask"]
    assert spec.input_names[4:] == past_names(4)
    assert spec.output_names[:3] == ["logits", "taps", "hidden"]
    assert spec.output_names[3:] == present_names(4)
    assert not hasattr(spec, "aliases")  # no output aliases an input: the runner commits the rows
    for i in range(4):  # present.* are the step's rows (seq), never a cache-sized (cache_len) tensor
        for p in ("key", "value"):
            assert spec.output(f"present.{i}.{p}").axes == ("batch", "kv_heads", "seq", "head_dim")
    prefill = graph_spec(Graph.TARGET_PREFILL, n_layer=4)
    assert all(prefill.output(n).axes == ("batch", "kv_heads", "prefix", "head_dim") for n in present_names(4))
    assert spec.output("logits").dtype == "float32"  # logits stay fp32 in fp16 exports
    assert spec.input("past_key_values.0.key").axes == ("batch", "kv_heads", "cache_len", "head_dim")
    assert spec.input("attention_mask").axes == ("batch", "seq", "cache_len")


def test_prefill_condition_inputs_depend_on_model_type():
    c2i = graph_spec(Graph.TARGET_PREFILL, n_layer=2, model_type="c2i")
    t2i = graph_spec(Graph.TARGET_PREFILL, n_layer=2, model_type="t2i")
    assert c2i.input_names[0] == "class_ids"
    assert t2i.input_names[:2] == ["caption_features", "caption_mask"]
    assert c2i.output("logits").axes == ("batch", "one", "vocab")
    assert "prefix_valid" in c2i.output_names
    with pytest.raises(ValueError):
        graph_spec(Graph.TARGET_PREFILL, n_layer=2, model_type="x2i")
    with pytest.raises(ValueError):
        graph_spec(Graph.TARGET_VERIFY)  # needs n_layer


def test_drafter_step_has_one_cache_returns_its_new_rows_and_taps_projection():
    step = graph_spec(Graph.DRAFTER_STEP)
    assert step.output_names[2:] == ["present.0.key", "present.0.value"]
    assert step.input("past_key_values.0.key").axes == ("batch", "draft_heads", "cache_len", "draft_head_dim")
    assert step.output("present.0.key").axes == ("batch", "draft_heads", "seq", "draft_head_dim")
    assert step.input_names[0] == "hidden_in" and step.output_names[:2] == ["logits", "hidden"]
    assert graph_spec(Graph.DRAFTER_PROJECT).input_names == ["taps"]


def test_gasv_params_follow_the_config_fields():
    fields = set(GASVConfig().to_dict())
    assert set(GASV_PARAMS) <= fields
    assert graph_spec(Graph.GASV).output_names == ["p", "delta_eff", "cand", "gate"]
    assert graph_spec(Graph.GASV).input_names == ["guided_logits", "node_tokens", "node_parents", "gasv_params"]


def test_describe_lists_every_graph():
    text = describe()
    for g in Graph:
        assert f"{g.value}.onnx" in text


def test_shape_ranges_for_tensorrt_profiles():
    from lisa_trt.models.io_spec import shape_ranges

    cfg = target_config("tiny")
    spec = graph_spec(Graph.TARGET_VERIFY, n_layer=cfg.n_layer)
    r = shape_ranges(spec, export_dims(cfg, max_cache_len=40), {"batch": (1, 2, 8), "seq": (1, 16, 64)})
    assert r["input_ids"] == ((1, 1), (2, 16), (8, 64))
    assert r["attention_mask"] == ((1, 1, 40), (2, 16, 40), (8, 64, 40))
    assert r["past_key_values.3.value"][2] == (8, cfg.kv_heads, 40, cfg.head_dim)
