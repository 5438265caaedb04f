"""ImageNet class names for 1000-class bundles (runtime/class_names.py): the shipped ILSVRC-2012
list, names matched case- and "_"-insensitively, ambiguous and unknown names refused with the ids
or the closest names; a bundle's own names still win."""

import json

import pytest
import torch

from lisa_trt.runtime.class_names import _FILE, bundle_class_names, imagenet_class_names, match_class_name
from lisa_trt.runtime.prompts import _class_id


def test_the_shipped_list_is_ilsvrc2012_with_its_source():
    names = imagenet_class_names()
    assert len(names) == 1000 and len(set(names)) == 998  # "crane" and "maillot" are two classes each
    assert (names[0], names[1], names[207], names[281], names[999]) == (
        "tench", "goldfish", "golden retriever", "tabby", "toilet tissue")
    assert "pytorch/hub" in json.loads(_FILE.read_text())["source"]


def test_names_match_case_insensitively_and_ambiguous_or_unknown_names_are_refused():
    names = imagenet_class_names()
    for text in ("golden retriever", "Golden_Retriever", "  GOLDEN   retriever "):
        assert match_class_name(text, names) == (207, None)
    assert _class_id("207", 1000, names) == (207, None)
    cid, err = _class_id("crane", 1000, names)
    assert cid is None and "ambiguous" in err and "134, 517" in err and "class id" in err
    cid, err = _class_id("goldn retriever", 1000, names)
    assert cid is None and "unknown class 'goldn retriever'" in err and "'golden retriever' (207)" in err
    cid, err = _class_id("c3", 10, [f"c{i}" for i in range(10)])  # a short list: exact names as before
    assert cid == 3 and err is None
    assert "names c0, c1" in _class_id("nope", 10, [f"c{i}" for i in range(10)])[1]


def test_a_1000_class_pipeline_without_names_takes_imagenet_names():
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.testing import make_target

    torch.manual_seed(0)
    t = make_target(std=0.3, num_classes=1000)
    pipe = Pipeline.from_models(t, generation={"sampling": {"cfg_scale": 1.0}})
    assert pipe.class_names[207] == "golden retriever"
    a = pipe.generate(["Golden_Retriever"], seed=3, verify="vanilla", decode=False)
    b = pipe.generate([207], seed=3, verify="vanilla", decode=False)
    assert torch.equal(a.tokens, b.tokens)
    with pytest.raises(Exception, match="ambiguous"):
        pipe.generate(["crane"], verify="vanilla", decode=False)
    assert bundle_class_names(["a", "b"], 1000) == ["a", "b"]  # the bundle's own names win
    assert bundle_class_names(None, 10) is None
