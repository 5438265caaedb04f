"""The LISA extensions (docs/spec/lisa.md "Extensions") against hand-computed small cases, and the
recipe names that select them (the paper's form stays the default)."""

import pytest
import torch

from lisa_trt.errors import ConfigError
from lisa_trt.train import losses as L

torch.set_num_threads(1)

# Codebook of 3 unit vectors in 2-D: e0 = +x, e1 = +y, e2 = -x (as in test_losses.py).
E = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])


def logits_of(p):
    return torch.tensor(p, dtype=torch.float32).log()


def test_mass_mismatch_is_the_drafter_mass_outside_the_neighbourhood():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    # r = 0.6 with K_c = 2: N = {e0, e1}, alpha = 0.8 (test_losses.py works the distances out)
    s = logits_of([[0.3, 0.3, 0.4]])  # argmax e2 is outside N, but 0.6 of the drafter's mass is inside
    top1 = L.locality_score(p, s, E, radius=0.6, k=2)
    mass = L.locality_score(p, s, E, radius=0.6, k=2, mismatch="mass")
    assert top1["score"].item() == pytest.approx(0.8)  # paper: alpha (1 - 0)
    assert mass["score"].item() == pytest.approx(0.8 * (1 - 0.6))  # alpha (1 - p_s(N))
    assert mass["in_nbhd"].item() == 0.0  # the diagnostic stays the top-1 indicator
    # a drafter whose argmax is inside N but whose mass mostly is not still scores (top1 says 0)
    s2 = logits_of([[0.34, 0.02, 0.33]])  # argmax e0 (inside N); 0.36 / 0.69 of the mass inside
    share = 0.36 / 0.69
    assert L.locality_score(p, s2, E, 0.6, 2)["score"].item() == 0.0
    assert L.locality_score(p, s2, E, 0.6, 2, "mass")["score"].item() == pytest.approx(0.8 * (1 - share))


def test_mean_threshold_selects_above_the_batch_mean():
    s = torch.tensor([0.0, 0.1, 0.5, 0.9])  # mean 0.375
    assert L.select_positions(s, 0.9, "mean").tolist() == [False, False, True, True]
    assert L.select_positions(s, 0.1, "mean").tolist() == [False, False, True, True]  # q unused
    heavy = torch.tensor([0.0, 0.0, 0.0, 0.01, 1.0])  # one outlier: only it passes the mean (0.202)
    assert L.select_positions(heavy, 0.5, "mean").tolist() == [False, False, False, False, True]
    assert not L.select_positions(torch.full((4,), 0.3), 0.5, "mean").any()  # equal scores: none
    assert L.select_positions(torch.zeros(0), 0.5, "mean").numel() == 0


def test_additive_gate_never_zeroes_a_position():
    cfg = L.LossConfig(gate="additive")
    score = torch.tensor([0.0, 0.1, 0.5, 0.9])
    g = torch.tensor([1.0, 0.5, 0.5, 0.2])

    def normed(raw):
        return [x * len(raw) / sum(raw) for x in raw]

    # step 0: w_veto = 0 -> the paper's gate zeroes the selected position, the additive one keeps 1
    w_paper, sel = L.lisa_weights(score, g, 0, 20, L.LossConfig())
    assert sel.tolist() == [False, False, False, True] and w_paper[3].item() == 0.0
    w, _ = L.lisa_weights(score, g, 0, 20, cfg)
    assert w.tolist() == pytest.approx([1.0] * 4)
    # last step: w_veto = 1, q = 0.5 (threshold 0.3): selected gain beta (1 - g) over the base weight 1
    w, sel = L.lisa_weights(score, g, 19, 20, cfg)
    assert sel.tolist() == [False, False, True, True]
    assert w.tolist() == pytest.approx(normed([1.0, 1.0, 1 + 2 * 0.5, 1 + 2 * 0.8]))
    assert float(w.min()) > 0


def test_recipes_select_the_extensions_and_keep_the_paper_form():
    paper = L.loss_recipe("lisa-paper")
    assert paper == L.LossConfig() == L.loss_recipe("lisa")
    assert (paper.mismatch, paper.threshold, paper.gate) == ("top1", "quantile", "paper")
    assert L.loss_recipe("lisa-soft").mismatch == "mass"
    assert L.loss_recipe("lisa-mean").threshold == "mean"
    assert L.loss_recipe("lisa-additive").gate == "additive"
    ext = L.loss_recipe("lisa-ext")
    assert (ext.mismatch, ext.threshold, ext.gate) == ("mass", "mean", "additive")
    assert L.loss_recipe("eagle3").kind == "eagle3"
    assert L.loss_recipe("lisa-ext", kd=False).kd is False
    with pytest.raises(ConfigError, match="unknown loss"):
        L.loss_recipe("lisa-v9")
    with pytest.raises(ConfigError, match="unknown gate"):
        L.LossConfig(gate="multiplicative")
    with pytest.raises(ConfigError, match="unknown mismatch"):
        L.LossConfig(mismatch="top3")


def test_soft_score_moves_the_selection_and_only_the_weights():
    """Row 0's drafter hits N by a hair (argmax e0 at 0.34): the paper scores it 0 and selects row 1;
    the mass score (0.7 * 0.66 = 0.462 > row 1's 0.5 * 0.9 = 0.45) selects row 0. CE / KD per row
    are the same, so only the weights (and hence the loss) differ."""
    t = logits_of([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2]])
    s = logits_of([[0.34, 0.33, 0.33], [0.1, 0.1, 0.8]])
    for mismatch, want in (("top1", [False, True]), ("mass", [True, False])):
        sc = L.locality_score(t.softmax(-1), s, E, 0.2, 2, mismatch)["score"]
        assert L.select_positions(sc, 0.5).tolist() == want
    base = dict(top_kc=2, joint_top_k=1, nucleus_p=0.6, veto=False, q_sel_start=0.5, q_sel_end=0.5)
    loss_p, st_p = L.lisa_loss(t, s, E, 0.2, 0, 1, L.LossConfig(**base))
    loss_s, st_s = L.lisa_loss(t, s, E, 0.2, 0, 1, L.LossConfig(mismatch="mass", **base))
    assert st_p["ce"].item() == pytest.approx(st_s["ce"].item())
    assert st_p["kd"].item() == pytest.approx(st_s["kd"].item())
    assert abs(loss_p.item() - loss_s.item()) > 1e-3


def test_the_train_cli_offers_every_recipe():
    """`lisa-trt train --loss` lists exactly the recipe names (cli/train.py keeps them as literals)."""
    from lisa_trt.cli.train import train

    choices = next(p for p in train.params if p.name == "loss").type.choices
    assert set(choices) == set(L.LOSS_RECIPES) and len(choices) == len(L.LOSS_RECIPES)


@pytest.mark.parametrize("loss", ["lisa", "lisa-soft", "lisa-ext"])
def test_every_lisa_recipe_without_a_codebook_is_refused_before_training(monkeypatch, loss):
    """`lisa-trt train --loss lisa-*` on a family with no decoder: a clear error naming --vq,
    not a training run that fails later; the EAGLE losses train without one."""
    from types import SimpleNamespace

    import lisa_trt.artifacts as A
    from lisa_trt.errors import InputError
    from lisa_trt.runtime.commands.train import _codebook

    monkeypatch.setattr(A, "find_vq", lambda *a, **k: (None, "no DIR/vqgan/"))
    rc = SimpleNamespace(source="x", family=SimpleNamespace())
    with pytest.raises(InputError, match="needs the VQ codebook: pass --vq"):
        _codebook(rc, None, None, loss)
    assert _codebook(rc, None, None, "eagle3") == (None, None)


def test_the_cli_loss_choices_are_the_recipes():
    """`lisa-trt train --loss` lists exactly the recipes loss_recipe knows (the CLI keeps its own
    list so that --help imports no torch)."""
    from lisa_trt.cli.train import train as train_cmd
    from lisa_trt.train.losses import LOSS_RECIPES

    (opt,) = [p for p in train_cmd.params if p.name == "loss"]
    assert set(opt.type.choices) == set(LOSS_RECIPES)
