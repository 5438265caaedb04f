"""The generic decode and encode paths read a target's token grid as `grid_hw` and decode through
the family (`codes_to_pixels`, `to_uint8`), never a square `grid_size` off the config: a LlamaGen
config with a 2 x 4 grid (`grid_shape`, whose `grid_size` refuses) decodes, encodes and scores."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from lisa_trt.families.llamagen.config import tiny_config
from lisa_trt.families.llamagen.vq import VQModel
from lisa_trt.models.family import ModelFamily, family_of
from lisa_trt.models.target_config import vq_config

GRID = (2, 4)


@pytest.fixture(scope="module")
def vq():
    torch.manual_seed(0)
    cfg = vq_config("VQ-16", ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32, codebook_size=256)
    return VQModel(cfg).eval()


@pytest.fixture(scope="module")
def tc():
    cfg = tiny_config(block_size=GRID[0] * GRID[1], grid_shape=GRID)
    assert cfg.grid_hw == GRID
    return cfg


class _Recording(ModelFamily):
    """A family whose decoder answers a constant image per code grid and records the grids."""

    name = "recording"

    def __init__(self):
        self.grids = []

    def codes_to_pixels(self, vq, codes):
        self.grids.append(tuple(codes.shape))
        B, h, w = codes.shape
        return torch.full((B, 3, 3 * h, 5 * w), 0.5)


def test_decode_and_save_decodes_a_non_square_grid_through_the_family(vq, tc, tmp_path):
    from lisa_trt.runtime.outputs import decode_and_save

    tokens = torch.randint(0, 256, (2, GRID[0] * GRID[1]), generator=torch.Generator().manual_seed(3))
    paths = decode_and_save(tokens, vq, None, tc, tmp_path, family_of(tc))
    assert len(paths) == 2
    ds = vq.config.downsample
    with torch.no_grad():
        want = family_of(tc).to_uint8(vq.tokens_to_pixels(tokens.reshape(2, *GRID)))
    for p, img in zip(paths, want):
        got = np.asarray(Image.open(p))
        assert got.shape == (GRID[0] * ds, GRID[1] * ds, 3)
        assert np.array_equal(got, img)

    fam = _Recording()
    paths = decode_and_save(tokens, vq, None, tc, tmp_path / "rec", fam)
    assert fam.grids == [(2, *GRID)]
    assert np.asarray(Image.open(paths[0])).shape == (3 * GRID[0], 5 * GRID[1], 3)


def _folder(root, sizes):
    for i, (w, h) in enumerate(sizes):
        d = root / str(i % 2)
        d.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(i)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return root


def test_train_encodes_an_image_folder_on_the_targets_grid(vq, tc, tmp_path):
    from lisa_trt.io import load_safetensors
    from lisa_trt.models.family import family_of
    from lisa_trt.runtime.commands.train import _data_config
    from lisa_trt.runtime.conditions import run_conditions

    images = _folder(tmp_path / "imgs", [(20, 12), (9, 17), (8, 8)])
    rc = SimpleNamespace(target=SimpleNamespace(config=tc), conditions=run_conditions(family_of(tc), tc), given={"sampling": {}},
                         source=str(tmp_path / "no-set"))
    o = dict(data="images", token_file=None, captions=None, encoder_dir=None, image_dir=str(images),
             features="online", num_samples=None)
    dc = _data_config(rc, vq, tmp_path / "run", o)
    t, meta = load_safetensors(dc.token_file)
    assert dc.source == "tokens"
    assert t["tokens"].shape == (3, GRID[0] * GRID[1])
    ds = vq.config.downsample
    assert meta["image_size"] == [GRID[0] * ds, GRID[1] * ds]


def test_encode_image_folder_square_grid_as_int_or_pair(vq, tmp_path):
    from lisa_trt.io import load_safetensors
    from lisa_trt.train.data import encode_image_folder

    images = _folder(tmp_path / "imgs", [(20, 12), (9, 17)])
    a, _ = load_safetensors(encode_image_folder(vq, images, tmp_path / "a.safetensors", grid=4, progress=False))
    b, meta = load_safetensors(encode_image_folder(vq, images, tmp_path / "b.safetensors", grid=(4, 4),
                                                   progress=False))
    assert torch.equal(a["tokens"], b["tokens"]) and a["tokens"].shape == (2, 16)
    assert meta["image_size"] == 4 * vq.config.downsample


def test_bench_scorer_decodes_through_the_family(monkeypatch, vq, tc):
    import lisa_trt.models.artifact_sets as A
    from lisa_trt.harness import _scoring

    aset = SimpleNamespace(extra=lambda name: (lambda *a: None), load_vq=lambda: vq)
    monkeypatch.setattr(A, "artifact_set", lambda source: aset)
    fam = _Recording()
    rc = SimpleNamespace(source="set", family=fam, target=SimpleNamespace(config=tc))
    _, decode_fn, _ = _scoring(rc, [0, 1], None, None)
    out = decode_fn(torch.zeros(2, GRID[0] * GRID[1], dtype=torch.long))
    assert fam.grids == [(2, *GRID)]
    assert out.shape == (2, 3, 3 * GRID[0], 5 * GRID[1])
