"""A class-label token file is checked against the family's ClassLabels(num_classes): ids
0..num_classes (num_classes: the null class of CFG's unconditional rows), nothing above."""

import pytest
import torch

from lisa_trt.errors import InputError
from lisa_trt.io import save_safetensors
from lisa_trt.models.family import family_of
from lisa_trt.testing import make_target
from lisa_trt.train.data import load_token_file


def _write(path, tcfg, classes):
    tokens = torch.zeros(len(classes), tcfg.block_size, dtype=torch.long)
    save_safetensors({"tokens": tokens, "classes": torch.tensor(classes, dtype=torch.long)}, path)
    return path


def test_class_ids_up_to_the_null_class_load(tmp_path):
    tcfg = make_target("c2i").config
    n = family_of(tcfg).conditioning(tcfg).num_classes
    ds = load_token_file(_write(tmp_path / "ok.safetensors", tcfg, [0, n - 1, n]), tcfg)
    assert ds.cond.tolist() == [0, n - 1, n]


def test_a_class_id_above_the_null_class_is_refused_naming_the_range(tmp_path):
    tcfg = make_target("c2i").config
    n = family_of(tcfg).conditioning(tcfg).num_classes
    with pytest.raises(InputError, match=rf"class ids must lie in 0\.\.{n} \({n} = unconditional\)"):
        load_token_file(_write(tmp_path / "bad.safetensors", tcfg, [0, n + 1]), tcfg)
