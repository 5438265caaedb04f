"""`lisa-trt train` on a tiny Emu3 checkpoint with the LISA loss, for both drafter architectures
(Medusa heads, EAGLE-3): the VQ codebook the loss needs is found in the model directory (no
--vq; without a codebook a lisa loss is refused, tests/train), the heads / drafter predict the visual tokens only, and each trained drafter decodes
through `lisa-trt generate` and `bench` under greedy verification exactly the plain greedy
tokens (forced row ends and end tokens included)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from emu3_fixtures import N_CODES, cli, save_model_dir, save_tokenizer, visual_ids  # noqa: E402

import lisa_trt  # noqa: E402

pytestmark = pytest.mark.slow
CAPTIONS = ["red fox", "a fox", "a red fox"]
SIZE, CFG = 8, 3.0


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """train --loss lisa (no --vq) with Medusa heads and with an EAGLE-3 drafter."""
    root = tmp_path_factory.mktemp("emu3_train")
    _, d = save_model_dir(root / "m", seed=0)
    save_tokenizer(d)
    caps = root / "captions.txt"
    caps.write_text("\n".join(CAPTIONS) + "\n")
    common = ["--model", d, "--image-size", SIZE, "--captions-file", caps, "--seed", 0, "--cfg-scale", CFG,
              "--loss", "lisa", "--num-samples", 3, "--batch-size", 2, "--eval-images", 1]
    outs = {"medusa": cli("train", *common, "--arch", "medusa", "--medusa-heads", 2, "--steps", 3, "--out",
                          root / "medusa"),
            "eagle3": cli("train", *common, "--steps", 2, "--out", root / "eagle3")}
    return root, d, caps, outs, {"medusa": root / "medusa" / "medusa.safetensors",
                           "eagle3": root / "eagle3" / "drafter.safetensors"}


def test_the_lisa_runs_read_emu3s_codebook_and_draft_visual_tokens(trained):
    from lisa_trt.models.drafter import load_drafter
    from lisa_trt.models.medusa import load_medusa

    root, d, _, outs, files = trained
    target = lisa_trt.load_target(d)
    for arch, steps in (("medusa", 3), ("eagle3", 2)):
        log = json.loads((root / arch / "train_log.json").read_text())
        assert (log["family"], log["loss"], log["steps"]) == ("emu3", "lisa", steps) and log["losses_this_run"], log
        assert "held-out decoding (1 images, exact verification)" in outs[arch]
    from lisa_trt.artifacts import find_vq
    from lisa_trt.models.family import family_of

    fam = family_of(target.config)
    vq, why = find_vq(d, None, family=fam)  # what `train` reads without --vq
    assert why is None and type(vq).__name__ == "Emu3VQ"
    assert torch.equal(fam.codebook(vq), vq.quantize.embedding.weight) and fam.codebook(vq).shape == (N_CODES, 4)
    heads = load_medusa(files["medusa"], target)
    assert heads.config.n_heads == 2 and heads.d2t.tolist() == visual_ids()  # the visual tokens, not the vocabulary
    drafter = load_drafter(files["eagle3"], target)
    assert drafter.family == "emu3" and drafter.d2t.tolist() == visual_ids()


@pytest.mark.parametrize("arch", ["medusa", "eagle3"])
def test_greedy_speculation_with_the_trained_drafter_equals_plain_greedy(trained, arch, tmp_path):
    root, d, caps, _, files = trained
    prompts = [a for c in CAPTIONS[:2] for a in ("--prompt", c)]
    common = ["--model", d, "--image-size", SIZE, *prompts, "--greedy", "--cfg-scale", CFG, "--seed", 0]
    cli("generate", *common, "--out", tmp_path / "ar")
    cli("generate", *common, "--drafter", files[arch], "--verify", "greedy", "--out", tmp_path / "spec")
    want, got = np.load(tmp_path / "ar" / "tokens.npy"), np.load(tmp_path / "spec" / "tokens.npy")
    assert want.shape[0] == 2 and len(np.unique(want)) > 2 and np.array_equal(got, want)
    st = json.loads((tmp_path / "spec" / "stats.json").read_text())
    assert st.get("verify", "greedy") == "greedy", st
    cli("bench", "--model", d, "--image-size", SIZE, "--captions", caps, "--drafter", files[arch], "--methods",
        "vanilla,greedy", "--num-images", 2, "--cfg-scale", CFG, "--json", tmp_path / "bench.json")
    res = json.loads((tmp_path / "bench.json").read_text())["results"]
    # the bench's MAL is its decodes' own: one image per decode, so MAL = (N - 1) / steps with N the
    # plain loop's forwards per image (lossless greedy is checked above; the speed-up of a drafter
    # trained 2-3 steps is not claimed)
    fwd = res["greedy"]["target_forwards_per_image"]
    assert res["greedy"]["mal"] == pytest.approx((res["vanilla"]["target_forwards_per_image"] - 1) / (fwd - 1))
