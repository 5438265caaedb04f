"""Tree speculation for Lumina-mGPT image spans on a tiny random Chameleon checkpoint:
greedy speculation is token-identical to the reference loop, row ends are forced (never
drafted), exact sampling keeps the span structure, and the drafter trains (the generic trainer)."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import lisa_trt  # noqa: E402
from chameleon_fixtures import N_CODES, make_hf_model, save_hf, save_tokenizer  # noqa: E402
from lisa_trt.families.chameleon.drafter import ChameleonDrafter  # noqa: E402
from lisa_trt.speculative.methods import get_method
from lumina_calls import LuminaTokenizer, generate_image_tokens, row_end_mask  # noqa: E402
from lumina_calls import LuminaSpec, span_request, speculative_image_tokens  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = save_hf(make_hf_model(seed=5, num_key_value_heads=2), tmp_path_factory.mktemp("spec"))
    save_tokenizer(d)
    target = lisa_trt.load_target(d)
    torch.manual_seed(0)
    return target, LuminaTokenizer(d), ChameleonDrafter.from_chameleon(target)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_greedy_speculation_matches_reference(setup, cfg_scale):
    target, tok, drafter = setup
    caps = ["a red fox", "tok70 tok71 tok72"]
    ref = generate_image_tokens(target, tok, caps, 64, 96, cfg_scale=cfg_scale, greedy=True)
    spec = LuminaSpec(method="greedy", cfg_scale=cfg_scale, tree_top_k=3, depth=3, total_tokens=8)
    got, stats = speculative_image_tokens(target, drafter, tok, caps, 64, 96, spec)
    assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.codes, ref.codes)
    assert stats.target_forwards < ref.tokens.shape[1]  # forced row ends at least come for free
    assert stats.mal > 1.0


def test_exact_sampling_keeps_the_span_structure(setup):
    target, tok, drafter = setup
    spec = LuminaSpec(method="exact", cfg_scale=2.0, top_k=10, tree_top_k=3, depth=2, total_tokens=6)
    got, _ = speculative_image_tokens(target, drafter, tok, ["x", "y", "z"], 32, 64, spec, seed=0)
    ends = row_end_mask(4, 2)
    assert (got.tokens[:, ends] == tok.newline).all()
    assert ((got.tokens[:, ~ends] >= 4) & (got.tokens[:, ~ends] < 4 + N_CODES)).all()
    again, _ = speculative_image_tokens(target, drafter, tok, ["x", "y", "z"], 32, 64, spec, seed=0)
    assert torch.equal(got.tokens, again.tokens)
    with pytest.raises(lisa_trt.LisaError, match="not 'sjd'"):
        LuminaSpec(method="sjd")
    from lisa_trt.models.family import family_of
    from lisa_trt.speculative.run import run_method

    req = family_of(target.config).prompter(target).encode(["x"], image_size=32, cfg=True)
    toks, _ = run_method(get_method("sjd"), target, None, None, req.cond, sampling=spec.sampling(), spec=spec.spec(), seed=0,
                         layout=req.layout)  # the Jacobi decoders read the family's layout (forced row ends)
    forced = req.layout.forced_mask(toks.device)
    assert forced.any() and (toks[:, forced] == req.layout.forced[forced.cpu()].to(toks.device)).all()
    assert ((toks[:, ~forced] >= 4) & (toks[:, ~forced] < 4 + N_CODES)).all()


def test_drafter_trains_on_target_taps(setup, tmp_path):
    """The generic trainer (train/trainer.py) on Lumina span rollouts: the loss decreases."""
    import json

    from lisa_trt.models.family import family_of
    from lisa_trt.train import DataConfig, LossConfig, TrainConfig, train_drafter

    target, tok, _ = setup
    req = family_of(target.config).prompter(target).encode([f"tok{60 + i}" for i in range(4)], image_size=64,
                                                           cfg=False)
    cfg = TrainConfig(steps=30, batch_size=4, ttt_steps=1, warmup_steps=1, checkpoint_every=30, lr=3e-3,
                      drafter_hidden=16, drafter_heads=2, loss=LossConfig(kind="eagle3"),
                      data=DataConfig(num_samples=4, eval_samples=0, cfg_scale=1.0, top_k=8, uncond_frac=0.0))
    torch.manual_seed(1)
    train_drafter(target, None, cfg, tmp_path, progress=False, request=req)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # KL(target || drafter) at step 0 (the soft CE without the target entropy's floor) falls
    assert rows[-1]["kl_0"] < 0.7 * rows[0]["kl_0"]


N_LAW = 4000  # span samples per law check (a few seconds of tree speculation on 2 cores)


@torch.no_grad()
def _next_laws(target, tok, prefixes, cfg_scale, top_k):
    """(P, V) float64: the reference sampler's law of the next span token after each span prefix
    (caption "x", a 2x2 latent grid), from one prefill of caption + span prefix + prefix (CFG rows:
    span prefix + prefix), the state the AR loop reaches token by token."""
    from lisa_trt.models.prompts import Prompts
    from lisa_trt.speculative.autoregressive import cfg_batch, new_target_cache
    from lisa_trt.speculative.sampling import guided_logits, process_logits

    prompts, layout, _ = span_request(target, tok, ["x"], 32, 32, True)
    cond, uncond = ([int(t) for t in p.ids[0][p.valid[0]]] for p in (prompts, prompts.uncond))
    rows = Prompts.from_rows([cond + list(x) for x in prefixes], prompts.ids.device)
    rows.uncond = Prompts.from_rows([uncond + list(x) for x in prefixes], prompts.ids.device)
    full = cfg_batch(target, rows, cfg_scale)
    raw = target.prefill(full, new_target_cache(target, 2 * len(prefixes), full, 1)).logits[:, -1]
    law = layout.law(guided_logits(raw, cfg_scale, True), None, lambda x: process_logits(x, 1.0, top_k))
    return torch.softmax(law.double(), -1), layout.forced.tolist()


def _exact_span_marginals(target, tok, n_tokens, cfg_scale, top_k):
    """The exact marginal law (V,) of each of the first n_tokens span tokens under the reference
    sampler, by enumerating every prefix it can draw (top_k choices per code, row ends forced)."""
    paths, marginals = {(): 1.0}, []
    for i in range(n_tokens):
        laws, forced = _next_laws(target, tok, list(paths), cfg_scale, top_k)
        if forced[i] >= 0:  # a row end: never sampled
            laws = torch.zeros_like(laws)
            laws[:, forced[i]] = 1.0
        w = torch.tensor(list(paths.values()), dtype=torch.float64)
        marginals.append((w[:, None] * laws).sum(0))
        paths = {k + (t,): float(pk * law[t]) for (k, pk), law in zip(paths.items(), laws)
                 for t in torch.nonzero(law > 0)[:, 0].tolist()}
    return marginals


@pytest.fixture(scope="module")
def span_law(setup):
    target, tok, _ = setup
    return _exact_span_marginals(target, tok, 5, cfg_scale=2.0, top_k=4)


def _assert_follows(samples, p, what):
    """`samples` (n,) i.i.d. from the law p (V,): TVD(empirical, p) below a bound set by n.

    E|p^_i - p_i| <= sd_i = sqrt(p_i (1 - p_i) / n), so a correct sampler's TVD, 1/2 sum |p^_i - p_i|,
    averages at most E = 1/2 sum sd_i (~ sqrt(m / (2 pi n)) for m equally likely outcomes; 0.013 to
    0.021 for the 4 to 12 outcomes here at n = 4000). Simulated, a correct sampler's TVD has mean
    0.8 E and sd 0.35 E on these laws (the largest of 20000 runs: 2.6 E), so 3 E is over 6 sd out;
    rigorously (McDiarmid: one sample moves the TVD by <= 1/n) P(TVD > 3 E) <= exp(-8 n E^2) < 4e-3.
    A rejected draft keeping its mass in the residual measures 4 to 7 E on codes 3 and 4 and fails."""
    n = samples.numel()
    q = torch.bincount(samples.cpu(), minlength=p.numel()).double() / n
    tvd, e = 0.5 * float((q - p).abs().sum()), 0.5 * float((p * (1 - p) / n).sqrt().sum())
    assert tvd < 3 * e, (what, tvd, e)


SPAN_CODES = (0, 1, 3, 4)  # the four codes of a 2x2 latent grid (span tokens 2 and 5 are row ends)


def test_exact_speculation_is_lossless(setup, span_law):
    """Each code of the span under exact speculation follows the reference sampler's exact law (the
    reference sampler too: the enumerated law is the one it draws from)."""
    target, tok, drafter = setup
    caps = ["x"] * N_LAW
    ref = generate_image_tokens(target, tok, caps, 32, 32, cfg_scale=2.0, top_k=4, seed=0).tokens
    spec = LuminaSpec(method="exact", cfg_scale=2.0, top_k=4, tree_top_k=3, depth=3, total_tokens=8)
    got, st = speculative_image_tokens(target, drafter, tok, caps, 32, 32, spec, seed=10)
    assert st.mal > 1.0  # drafts are accepted: the tree rule is exercised
    for col in SPAN_CODES:
        _assert_follows(ref[:, col], span_law[col], ("reference", col))
        _assert_follows(got.tokens[:, col], span_law[col], ("exact", col))


def test_drafter_artifact_and_cli_speculation(setup, tmp_path):
    from click.testing import CliRunner

    from lisa_trt.cli import main
    from lisa_trt.families.chameleon.drafter import load_chameleon_drafter, save_chameleon_drafter

    target, tok, drafter = setup
    save_chameleon_drafter(drafter, tmp_path / "drafter.safetensors")
    back = load_chameleon_drafter(tmp_path / "drafter.safetensors", target)
    for a, b in zip(drafter.state_dict().values(), back.state_dict().values()):
        assert torch.equal(a, b)
    other = lisa_trt.load_target(save_hf(make_hf_model(seed=6), tmp_path / "other"))
    with pytest.raises(lisa_trt.LisaError, match="target hash"):
        load_chameleon_drafter(tmp_path / "drafter.safetensors", other)
    model_dir = Path(target.source_dir)
    args = ["generate", "--model", str(model_dir), "--prompt", "a", "--image-size", "64", "--greedy"]
    r1 = CliRunner().invoke(main, args + ["--out", str(tmp_path / "ar")])
    r2 = CliRunner().invoke(main, args + ["--out", str(tmp_path / "sp"), "--verify", "greedy",
                                          "--drafter", str(tmp_path / "drafter.safetensors"), "--tree-top-k", "3",
                                          "--tree-tokens", "12"])
    assert r1.exit_code == 0 and r2.exit_code == 0, r1.output + r2.output
    assert "MAL" in r2.output
    import numpy as np

    assert np.array_equal(np.load(tmp_path / "ar" / "tokens.npy"), np.load(tmp_path / "sp" / "tokens.npy"))


@pytest.fixture(scope="module")
def code_tables(setup):
    """The one calibration driver over Lumina-mGPT's span request (image codes = its sub-vocabulary)."""
    from lisa_trt.calibration.profile import calibrate
    from lisa_trt.config import SamplingConfig
    from lumina_calls import span_request

    target, tok, _ = setup
    codebook = torch.randn(N_CODES, 8, generator=torch.Generator().manual_seed(0))
    prompts, layout, _ = span_request(target, tok, [f"tok{60 + i}" for i in range(6)], 64, 64, cfg=True)
    return calibrate(target, codebook, conds=prompts, layout=layout, sampling=SamplingConfig(cfg_scale=2.0, top_k=16),
                     samples_per_pos=4, n_clusters=4, lantern_k=8, batch_size=3, min_cluster_samples=8, progress=False)


def test_code_tables_cover_the_image_codes(code_tables, setup):
    assert code_tables.vocab_size == N_CODES and code_tables.w_tilde.shape == (N_CODES, 32)
    assert code_tables.lantern_neighbors.shape == (N_CODES, 8) and code_tables.theta_geo > 0
    assert code_tables.settings["family"] == "chameleon"


def test_code_tables_are_gasv_version_2(code_tables, setup, tmp_path):
    """Calibration writes tables GASV v2 accepts: version-2 metadata, beta from the draft-anchored
    statistic s(v|z) over N(z), a neighbour table that covers the candidates."""
    from lisa_trt.calibration.tables import load_tables_for, save_tables
    from lisa_trt.families.chameleon import CHAMELEON
    from lisa_trt.io import load_safetensors
    from lisa_trt.speculative.gasv import GASV_VERSION, gasv_gates

    target, tok, _ = setup
    assert GASV_VERSION == 2 and code_tables.metadata()["gasv_version"] == 2
    assert code_tables.settings["statistic"] == "s(v|z), v in N(z)" and code_tables.settings["n_samples"] > 0
    # the default 16 candidates are clamped to the 8-wide neighbour table (recorded in the config)
    assert code_tables.config.neighbours == 8 <= code_tables.lantern_neighbors.shape[1]
    assert code_tables.beta.shape == (4,) and bool((code_tables.beta > 0).all())
    save_tables(code_tables, tmp_path / "t.safetensors")
    assert load_safetensors(tmp_path / "t.safetensors")[1]["gasv_version"] == 2
    back = load_tables_for(tmp_path / "t.safetensors", target, CHAMELEON.sub_vocab(target))
    assert back.config == code_tables.config and torch.equal(back.beta, code_tables.beta)
    assert torch.allclose(back.w_tilde, code_tables.w_tilde)
    x = 3 * torch.randn(4, N_CODES, generator=torch.Generator().manual_seed(0))
    out = gasv_gates(x, torch.tensor([0, 5, 7, 9]), torch.tensor([-1, 0, 0, 1]), back)
    assert out.cand.shape == (4, 8) and out.gate.shape == (4, 8) and bool((out.gate[0] == 0).all())


def test_gasv_lossless_limit_is_exact(setup, code_tables):
    """GASV v2 with delta 0 (no budget) is exact speculative sampling: the same tokens as the
    `exact` rule for the same seed; greedy GASV with zero gates (kappa 0, lambda 1) is greedy
    decoding."""
    from lisa_trt.speculative.methods import GASVRuleConfig

    target, tok, drafter = setup
    kw = dict(cfg_scale=2.0, top_k=8, tree_top_k=3, depth=3, total_tokens=8)
    caps = ["x", "tok61", "a red fox"]
    exact, _ = speculative_image_tokens(target, drafter, tok, caps, 64, 32, LuminaSpec(method="exact", **kw), seed=3)
    soft, st = speculative_image_tokens(target, drafter, tok, caps, 64, 32,
                                        LuminaSpec(method="gasv", gasv=GASVRuleConfig(delta=0.0), **kw), seed=3,
                                        tables=code_tables)
    assert torch.equal(exact.tokens, soft.tokens) and st.mean_tvd < 1e-5
    ref = generate_image_tokens(target, tok, caps, 64, 32, cfg_scale=2.0, greedy=True)
    g, _ = speculative_image_tokens(target, drafter, tok, caps, 64, 32,
                                    LuminaSpec(method="gasv", greedy=True, gasv=GASVRuleConfig(kappa=0.0, lam=1.0),
                                               **kw), tables=code_tables)
    assert torch.equal(g.tokens, ref.tokens)


@pytest.mark.parametrize("method,greedy", [("lantern", False), ("gasv", False), ("lantern", True), ("gasv", True)])
def test_relaxed_rules_keep_the_span_structure(setup, code_tables, method, greedy, check_stats):
    target, tok, drafter = setup
    spec = LuminaSpec(method=method, cfg_scale=2.0, top_k=16, tree_top_k=3, depth=3, total_tokens=8,
                      lantern_k=8, lantern_delta=0.3, greedy=greedy)
    got, stats = speculative_image_tokens(target, drafter, tok, ["x", "tok61"], 64, 32, spec, seed=1,
                                          tables=code_tables)
    ends = row_end_mask(2, 4)
    assert (got.tokens[:, ends] == tok.newline).all()
    assert ((got.tokens[:, ~ends] >= 4) & (got.tokens[:, ~ends] < 4 + N_CODES)).all()
    assert check_stats(stats, got.tokens) > 1.0
    if greedy:  # greedy rules report no distortion (verify.py)
        assert stats.mean_tvd == 0.0
    else:  # the budget (LANTERN's delta 0.3, GASV v2's gated neighbour mass) moves mass onto the drafts
        assert stats.mean_tvd > 0.0
    with pytest.raises(lisa_trt.LisaError, match="calibration tables"):
        speculative_image_tokens(target, drafter, tok, ["x"], 32, 32, spec)


def test_lantern_with_zero_budget_is_lossless(setup, code_tables, span_law):
    """LANTERN with delta = 0 ('clean' residual) is exact: each code follows the reference sampler's law."""
    target, tok, drafter = setup
    spec = LuminaSpec(method="lantern", cfg_scale=2.0, top_k=4, tree_top_k=3, depth=3, total_tokens=8,
                      lantern_k=8, lantern_delta=0.0)
    got, st = speculative_image_tokens(target, drafter, tok, ["x"] * N_LAW, 32, 32, spec, seed=20, tables=code_tables)
    for col in SPAN_CODES:
        _assert_follows(got.tokens[:, col], span_law[col], ("lantern", col))
    assert st.mal > 1.0 and st.mean_tvd < 1e-6  # drafts accepted; no budget: no mass moved (up to rounding)


def test_cli_gasv_with_code_tables(setup, code_tables, tmp_path):
    from click.testing import CliRunner

    from lisa_trt.calibration.tables import save_tables
    from lisa_trt.cli import main
    from lisa_trt.families.chameleon.drafter import save_chameleon_drafter

    target, tok, drafter = setup
    save_tables(code_tables, tmp_path / "tables.safetensors")
    save_chameleon_drafter(drafter, tmp_path / "d.safetensors")
    args = ["generate", "--model", target.source_dir, "--prompt", "a", "--image-size", "64", "--top-k", "16",
            "--drafter", str(tmp_path / "d.safetensors"), "--tree-top-k", "3", "--tree-tokens", "8",
            "--out", str(tmp_path / "o")]
    r = CliRunner().invoke(main, args + ["--verify", "gasv", "--tables", str(tmp_path / "tables.safetensors")])
    assert r.exit_code == 0 and "gasv: MAL" in r.output, r.output
    r = CliRunner().invoke(main, args + ["--verify", "gasv", "--overwrite"])
    assert r.exit_code != 0 and "--tables" in r.output


def test_drafter_training_resumes_exactly(setup, tmp_path, monkeypatch):
    """An interrupted generic training run resumes from its checkpoint to the same weights."""
    from lisa_trt.models.drafter import load_drafter
    from lisa_trt.models.family import family_of
    from lisa_trt.train import DataConfig, LossConfig, TrainConfig, train_drafter
    from lisa_trt.train import trainer as T

    target, tok, _ = setup
    req = family_of(target.config).prompter(target).encode(["a", "tok61", "x", "y"], image_size=32, cfg=True)
    cfg = TrainConfig(steps=6, batch_size=2, ttt_steps=2, warmup_steps=1, checkpoint_every=1, lr=3e-3,
                      drafter_hidden=16, drafter_heads=2, loss=LossConfig(kind="eagle3"),
                      data=DataConfig(num_samples=6, eval_samples=0, cfg_scale=2.0, top_k=8))
    straight = train_drafter(target, None, cfg, tmp_path / "a", progress=False, request=req)

    class Stop(Exception):
        pass

    def stop(step):
        if step == 3:
            raise Stop
    monkeypatch.setattr(T, "_after_step", stop)
    with pytest.raises(Stop):
        train_drafter(target, None, cfg, tmp_path / "b", progress=False, request=req)
    monkeypatch.setattr(T, "_after_step", lambda step: None)
    again = train_drafter(target, None, cfg, tmp_path / "b", progress=False, request=req)
    a, b = load_drafter(straight["drafter"], target), load_drafter(again["drafter"], target)
    for x, y in zip(a.state_dict().values(), b.state_dict().values()):
        assert torch.equal(x, y)


def test_coupled_drafting_on_a_span(setup, check_stats):
    """Coupled tree drafting (speculative/coupled.py) on the span layout: forced row ends are
    committed, image codes elsewhere, and the tokens do not depend on the drafter's tree."""
    from lisa_trt.config import SamplingConfig
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method
    from lumina_calls import span_request

    target, tok, drafter = setup
    prompts, layout, (h, w) = span_request(target, tok, ["x", "tok70 tok71"], 32, 64, True)
    s = SamplingConfig(cfg_scale=2.0, top_k=10)
    got = []
    for tree in ((3, 2, 6), (2, 3, 8)):
        spec = SpecConfig.make("coupled", top_k=tree[0], depth=tree[1], total_tokens=tree[2])
        toks, st = run_method(get_method("coupled"), target, drafter, None, prompts, sampling=s, spec=spec, seed=0, layout=layout)
        got.append(toks)
        check_stats(st, toks)
        assert st.mean_tvd == 0.0
    ends = row_end_mask(h, w)
    assert torch.equal(got[0], got[1])
    assert (got[0][:, ends] == tok.newline).all()
    assert ((got[0][:, ~ends] >= 4) & (got[0][:, ~ends] < 4 + N_CODES)).all()


def test_sjd_gasv_on_a_span(setup, code_tables):
    """GASV inside Jacobi windows over the image codes (the tables' sub-vocabulary): delta 0 is
    MC-SJD (its default drafts) token for token; relaxed, the span keeps its structure and
    reports TVD."""
    from lisa_trt.config import SamplingConfig
    from lisa_trt.speculative.methods import SpecConfig
    from lisa_trt.speculative.run import run_method
    from lumina_calls import span_request

    target, tok, _ = setup
    prompts, layout, (h, w) = span_request(target, tok, ["x", "tok70 tok71"], 64, 64, True)
    s = SamplingConfig(cfg_scale=2.0, top_k=16)
    ref, _ = run_method(get_method("mcsjd"), target, None, None, prompts, sampling=s, spec=SpecConfig(), seed=1, sjd_window=4,
                        layout=layout)
    same, st0 = run_method(get_method("sjd-gasv"), target, None, code_tables, prompts, sampling=s,
                           spec=SpecConfig.make("gasv", gasv_delta=0.0), seed=1, sjd_window=4, layout=layout)
    assert torch.equal(same, ref) and st0.mean_tvd == 0.0
    got, st = run_method(get_method("sjd-gasv"), target, None, code_tables, prompts, sampling=s,
                         spec=SpecConfig.make("gasv", gasv_kappa=8.0, gasv_lambda=0.2), seed=1, sjd_window=4,
                         layout=layout)
    ends = row_end_mask(h, w)
    assert (got[:, ends] == tok.newline).all()
    assert ((got[:, ~ends] >= 4) & (got[:, ~ends] < 4 + N_CODES)).all()
    assert st.mean_tvd > 0
