"""One calibration driver for every family (LlamaGen, Chameleon / Lumina-mGPT, Janus-Pro).

Proves: the teacher-forced law calibration measures is the decode loop's law (greedy rollouts are
its argmax at every index, forced row ends included, CFG interval honoured); Janus calibrates to
valid GASV v2 tables over its codebook that the GASV / LANTERN rules accept on Janus logits and
that SpeculativeDecoder runs with (GASV delta 0 == exact; greedy GASV with zero gates == AR);
Chameleon's `calibrate_cli` records every GASV knob it is given (--delta / --neighbours were
dropped before).
"""

import sys
from pathlib import Path

import pytest
import torch

from lisa_trt.calibration.profile import calibrate, rollout_law
from lisa_trt.config import SamplingConfig
from lisa_trt.speculative.autoregressive import cfg_batch, generate, layout_for
from lisa_trt.speculative.gasv import GASVConfig
from lisa_trt.speculative.methods import get_method, resolve_method

testing = pytest.importorskip("lisa_trt.testing")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))


def _law_argmax(target, cond, tokens, sampling, layout):
    return rollout_law(target, cfg_batch(target, cond, sampling.cfg_scale), tokens, sampling, layout).argmax(-1)


# ----------------------------------------------------------------------------- the law

@pytest.mark.parametrize("cfg_interval", [-1, 3])
def test_llamagen_law_is_the_ar_loops(cfg_interval):
    """Greedy rollouts are the argmax of the teacher-forced law; with a CFG interval the law turns
    guidance off where the loop does (the old teacher forcing kept CFG on everywhere)."""
    target = testing.make_target(seed=0)
    cond = torch.tensor([1, 5, 9])
    s = SamplingConfig(cfg_scale=4.0, top_k=40, greedy=True, cfg_interval=cfg_interval)
    layout = layout_for(target)
    tokens = generate(target, cond, layout=layout, cfg_scale=4.0, top_k=40, greedy=True, cfg_interval=cfg_interval)
    assert torch.equal(_law_argmax(target, cond, tokens, s, layout), tokens)
    if cfg_interval > -1:  # CFG on everywhere would not give the loop's tokens
        always = SamplingConfig(cfg_scale=4.0, top_k=40, greedy=True)
        assert not torch.equal(_law_argmax(target, cond, tokens, always, layout), tokens)


@pytest.fixture(scope="module")
def chameleon(tmp_path_factory):
    import table_cases as tc

    return tc.chameleon_target(tmp_path_factory.mktemp("ch"))


def test_chameleon_law_is_the_span_loops(chameleon):
    """Image codes only, CFG rows = the span prefix, row ends forced (one-hot law)."""
    from lumina_calls import span_request

    target, tok = chameleon
    prompts, layout, _ = span_request(target, tok, ["a red fox", "tok70 tok71 tok72", "x"], 64, 96, cfg=True)
    s = SamplingConfig(cfg_scale=3.0, top_k=8, greedy=True)
    tokens = generate(target, prompts, layout=layout, cfg_scale=3.0, top_k=8, greedy=True)
    assert torch.equal(_law_argmax(target, prompts, tokens, s, layout), tokens)
    assert (tokens[:, layout.forced >= 0] == tok.newline).all()


@pytest.fixture(scope="module")
def janus(tmp_path_factory):
    import test_janus as TJ
    from lisa_trt.families import janus as J

    d = TJ.save(TJ.make_hf(seed=3), tmp_path_factory.mktemp("janus"))
    return TJ, J.load_janus_target(d), J.load_janus_vq(d)


def test_janus_law_is_the_ar_loops(janus):
    TJ, target, _ = janus
    cond = TJ.left_padded()
    s = SamplingConfig(cfg_scale=2.5, top_k=16, greedy=True)
    layout = layout_for(target)
    tokens = generate(target, cond, layout=layout, cfg_scale=2.5, top_k=16, greedy=True)
    assert torch.equal(_law_argmax(target, cond, tokens, s, layout), tokens)


# ----------------------------------------------------------------------------- Janus tables

def _janus_tables(janus, seed=0, **kw):
    TJ, target, vq = janus
    ids = torch.cat([TJ.prompts(3, 6, seed=7), TJ.prompts(3, 6, seed=8)])
    kw = {"sampling": SamplingConfig(cfg_scale=2.0, top_k=24), "lantern_k": 12, "n_clusters": 6, "batch_size": 4,
          "samples_per_pos": 4, "min_cluster_samples": 8, "progress": False, **kw}
    return calibrate(target, vq.quantize.embedding.weight, conds=ids, seed=seed, **kw)


@pytest.fixture(scope="module")
def janus_tables(janus):
    return _janus_tables(janus, gasv=GASVConfig(kappa=1.5, lam=0.5, delta=0.6, neighbours=8))


def test_janus_tables_are_gasv_v2_over_its_codebook(janus, janus_tables, tmp_path):
    from lisa_trt.calibration.tables import load_tables_for, save_tables
    from lisa_trt.io import load_safetensors

    TJ, target, _ = janus
    t = janus_tables
    V, H = target.output.weight.shape
    assert t.vocab_size == TJ.CODES == V and t.w_tilde.shape == (V, H)
    assert t.lantern_neighbors.shape == (V, 12) and t.n_clusters == 6 and bool((t.beta > 0).all())
    assert t.theta_geo > 0 and t.settings["family"] == "janus" and t.settings["num_rollouts"] == 6
    assert (t.config.kappa, t.config.lam, t.config.delta, t.config.neighbours) == (1.5, 0.5, 0.6, 8)
    assert 0 < t.settings["n_samples"] <= 6 * TJ.GRID * TJ.GRID * 4
    save_tables(t, tmp_path / "t.safetensors")
    assert load_safetensors(tmp_path / "t.safetensors")[1]["gasv_version"] == 2
    back = load_tables_for(tmp_path / "t.safetensors", target)
    assert back.config == t.config and torch.equal(back.beta, t.beta) and torch.equal(back.w_tilde, t.w_tilde)
    again = _janus_tables(janus, gasv=GASVConfig(kappa=1.5, lam=0.5, delta=0.6, neighbours=8))
    assert torch.equal(again.beta, t.beta) and torch.equal(again.cluster, t.cluster)  # deterministic
    assert not torch.equal(_janus_tables(janus, seed=1).beta, t.beta)


def _janus_tree(janus, janus_tables):
    """Chains of Janus rollout codes as draft trees, with the target's law at every node."""
    from lisa_trt.speculative.tree import DraftTree

    TJ, target, _ = janus
    cond = TJ.prompts(2, 6, seed=9)
    s = SamplingConfig(cfg_scale=2.0, top_k=24)
    layout = layout_for(target)
    tokens = generate(target, cond, layout=layout, cfg_scale=2.0, top_k=24, seed=4)
    law = rollout_law(target, cfg_batch(target, cond, 2.0), tokens, s, layout)  # (B, N, V)
    j, D = 5, 4  # root = z_{j-1}; one chain of drafts z_j .. z_{j+D-1} (the rollout's own codes)
    tree = DraftTree.from_parents(tokens[:, j - 1: j + D], torch.arange(-1, D)[None].expand(2, -1))
    return tree, law[:, j: j + D + 1]  # node n (z_{j-1+n}): the law of its children, z_{j+n}


def test_gasv_and_lantern_rules_accept_janus_tables(janus, janus_tables):
    """The rules the decode loop runs (methods registry) on Janus logits with its tables: GASV
    gates move mass onto drafted neighbours; delta 0 is exact sampling (same tokens as `exact`)."""
    from lisa_trt.speculative.gasv import gasv_gates
    from lisa_trt.speculative.methods import RuleContext, SpecConfig, get_method

    tree, law = _janus_tree(janus, janus_tables)
    B, N, V = law.shape
    flat_par = torch.where(tree.parents >= 0, tree.parents + torch.arange(B)[:, None] * N, -1).reshape(-1)
    gates = gasv_gates(law.reshape(B * N, V), tree.tokens.reshape(-1), flat_par, janus_tables)
    assert gates.cand.shape == (B * N, 8) and bool((gates.gate[tree.parents.reshape(-1) < 0] == 0).all())
    assert bool((gates.gate >= 0).all() and (gates.gate <= 1).all()) and float(gates.gate.max()) > 0

    def run(method, greedy=False, **knobs):
        ctx = RuleContext(spec=SpecConfig.make(method, **knobs), greedy=greedy,
                          generator=torch.Generator().manual_seed(11), tables=janus_tables)
        return get_method(method).rule(law, tree, ctx)

    exact, lossless = run("exact"), run("gasv", gasv_delta=0.0)
    assert torch.equal(exact.tokens, lossless.tokens) and torch.equal(exact.accept_len, lossless.accept_len)
    for method in ("gasv", "lantern"):
        for greedy in (False, True):
            res = run(method, greedy)
            assert res.tokens.shape[0] == B and bool((res.accept_len >= 0).all() and (res.accept_len <= N - 1).all())
            assert bool(((res.tokens == -1) | ((res.tokens >= 0) & (res.tokens < V))).all())
    relaxed = run("gasv", gasv_delta=1.0, gasv_kappa=50.0, gasv_lambda=0.01)
    assert float(relaxed.tvd.max()) > 1e-3 > float(exact.tvd.max())  # GASV moved neighbour mass


# ----------------------------------------------------------------------------- Chameleon CLI knobs

@pytest.fixture(scope="module")
def chameleon_dir(tmp_path_factory):
    import table_cases as tc

    return tc.chameleon_model_dir(tmp_path_factory.mktemp("chdir"))


def test_chameleon_calibrate_cli_records_every_gasv_knob(chameleon_dir, tmp_path):
    """The former Chameleon-only calibrate_cli dropped delta / neighbours (GASVConfig(kappa, lam) only);
    the generic `lisa-trt calibrate` records every knob for every family."""
    from lisa_trt.calibration.tables import load_tables
    from lumina_calls import calibrate_cli

    kw = dict(image_size=32, rollouts=2, samples_per_pos=2, clusters=3, lantern_k=8, top_k=12, cfg_scale=2.0)
    t = calibrate_cli(chameleon_dir, tmp_path / "a.safetensors", kappa=1.3, lam=0.5, delta=0.25, neighbours=4, **kw)
    assert (t.config.kappa, t.config.lam, t.config.delta, t.config.neighbours) == (1.3, 0.5, 0.25, 4)
    assert load_tables(tmp_path / "a.safetensors").config == t.config
    u = calibrate_cli(chameleon_dir, tmp_path / "b.safetensors", delta=0.7, neighbours=6, cluster_space="w_tilde",
                      top_p=0.9, **kw)
    base = GASVConfig()
    assert (u.config.gamma_delta, u.config.theta_clu, u.config.delta, u.config.scope, u.config.neighbours) == \
        (base.gamma_delta, base.theta_clu, 0.7, base.scope, 6)
    assert u.cluster_space == "w_tilde" and u.settings["sampling"]["top_p"] == 0.9
    assert u.settings["family"] == "chameleon" and (u.settings["width"], u.settings["height"]) == (32, 32)


def test_chameleon_cli_calibrate_passes_delta_and_neighbours(chameleon_dir, tmp_path):
    from click.testing import CliRunner

    from lisa_trt.calibration.tables import load_tables
    from lisa_trt.cli import main

    out = tmp_path / "t.safetensors"
    r = CliRunner().invoke(main, ["calibrate", "--model", str(chameleon_dir), "--image-size", "32", "--rollouts", "2",
                                  "--samples-per-pos", "2", "--clusters", "3", "--lantern-k", "8", "--top-k", "12",
                                  "--cfg-scale", "2", "--delta", "0.25", "--neighbours", "4", "--out", str(out)])
    assert r.exit_code == 0, r.output
    cfg = load_tables(out).config
    assert (cfg.delta, cfg.neighbours) == (0.25, 4)


def test_speculative_decoder_accepts_janus_tables(janus, janus_tables, check_stats):
    """SpeculativeDecoder(target, drafter, tables).generate(prompt_ids, spec=gasv | lantern) on Janus.

    The drafter is the generic Drafter built for the Janus target (untrained: MAL is not the point)."""
    import dataclasses

    from lisa_trt.models.drafter import Drafter
    from lisa_trt.speculative.decode import SpeculativeDecoder
    from lisa_trt.speculative.methods import SpecConfig

    TJ, target, _ = janus
    torch.manual_seed(0)
    drafter = Drafter.from_target(target).eval()
    ids = TJ.prompts(2, 6, seed=9)
    dec = SpeculativeDecoder(target, drafter, janus_tables)
    s = SamplingConfig(cfg_scale=2.0, top_k=24)
    tree = dict(top_k=3, depth=3, total_tokens=8)
    for method in ("lantern", "gasv"):
        out, stats = dec.generate(ids, sampling=s, method=resolve_method(method), spec=SpecConfig.make(method, **tree), seed=0)
        assert out.shape == (2, TJ.GRID * TJ.GRID) and bool(((out >= 0) & (out < TJ.CODES)).all())
        check_stats(stats, out)
        assert stats.mean_tvd > 0.0  # the tables' budget moves mass onto the drafts
    exact, _ = dec.generate(ids, sampling=s, method=get_method("exact"), spec=SpecConfig.make("exact", **tree), seed=5)
    lossless, st = dec.generate(ids, sampling=s, method=get_method("gasv"), spec=SpecConfig.make("gasv", gasv_delta=0.0, **tree), seed=5)
    assert torch.equal(exact, lossless) and st.mean_tvd < 1e-5
    greedy = dataclasses.replace(s, greedy=True)
    g, _ = dec.generate(ids, sampling=greedy, method=get_method("gasv"), spec=SpecConfig.make("gasv", gasv_kappa=0.0, gasv_lambda=1.0, **tree))
    assert torch.equal(g, generate(target, ids, cfg_scale=2.0, top_k=24, greedy=True))
