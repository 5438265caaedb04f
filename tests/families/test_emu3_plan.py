"""`lisa-trt plan Emu3-Gen --gpu rtx4090`: Emu3-Gen's real shape (the published config) at 720 px
with CFG, and what fits a 24 GB card at each precision."""

import pytest
from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.deploy import memory_plan as P
from lisa_trt.deploy.memory_plan import GIB, known_shape, make_plan


def test_emu3_gen_shape_is_the_published_config():
    s = known_shape("Emu3-Gen")
    assert (s.family, s.n_layer, s.dim, s.n_head, s.kv_heads, s.ffn, s.vocab) == ("emu3", 32, 4096, 32, 8, 14336, 184622)
    assert s.image_size == 720 and s.image_tokens == 90 * 91 + 3 == 8193  # 8,100 codes + 90 row ends + 3 ends
    assert 8.4e9 < s.target.params < 8.6e9  # Emu3-Gen: 8.49 B parameters
    assert s.max_positions == 9216 and s.cache_len(128, 64) <= s.max_positions + 64


@pytest.mark.parametrize("precision,fits", [("fp32", False), ("fp16", False), ("int8", True), ("int4", True)])
def test_what_fits_a_4090_at_720px_with_cfg(precision, fits):
    """One KV cache (2.05 GiB at fp16), updated in place on TensorRT as on ONNX Runtime: fp16 is 0.56 GiB
    short once the engines' I/O (the 184,622-wide fp32 logits) and the loop's tensors are counted; the
    same plan on both backends."""
    p = make_plan("Emu3-Gen", gpu="rtx4090", precision=precision, batch=1, tree=64)
    assert p.cfg and p.rows == 2 and p.fits is fits
    assert make_plan("Emu3-Gen", gpu="rtx4090", precision=precision, batch=1, tree=64, backend="ort").total == p.total
    kv = p.engines["target"]["kv_cache"] / (2 if precision == "fp32" else 1)  # fp32 caches: 4 bytes
    assert 1.9 * GIB < kv < 2.2 * GIB  # 32 layers x 2 x 8 heads x 128 x 8392 slots x 2 rows x 2 bytes
    if precision == "int4":
        assert p.max_batch >= 2 and p.total < P.GPUS["rtx4090"].usable - 8 * GIB  # weights are not the problem


def test_cli_plan_emu3_gen():
    r = CliRunner().invoke(main, ["plan", "Emu3-Gen", "--gpu", "rtx4090", "--precision", "int4"])
    assert r.exit_code == 0, r.output
    assert "Emu3-Gen (emu3)" in r.output and "720 px" in r.output and "fits: yes" in r.output
