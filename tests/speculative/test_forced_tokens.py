"""Forced positions with SEVERAL distinct forced tokens under the relaxed rules (LANTERN, GASV)
over a sub-vocabulary (issue 37): a layout no current family has (a row end after each row of
image codes, then a tail of three distinct end tokens, Emu3's shape) on a tiny random Chameleon
checkpoint. Every forced position commits exactly its own forced id (greedy and sampled, tree
decoder and sjd-gasv), the degenerate relaxed rules equal the exact / greedy decode, and a draft
that equals the forced token at a forced position is accepted."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import lisa_trt  # noqa: E402
from chameleon_fixtures import N_CODES, make_hf_model, save_hf, save_tokenizer  # noqa: E402
from lisa_trt.config import SamplingConfig  # noqa: E402
from lisa_trt.families.chameleon import CHAMELEON  # noqa: E402
from lisa_trt.families.chameleon.drafter import ChameleonDrafter  # noqa: E402
from lisa_trt.models.family import SequenceLayout  # noqa: E402
from lisa_trt.speculative.methods import GASVRuleConfig, SpecConfig  # noqa: E402
from lisa_trt.speculative.run import run_method  # noqa: E402
from lisa_trt.speculative.methods import get_method, resolve_method
from lumina_calls import LuminaTokenizer, span_request  # noqa: E402

H, W = 2, 4  # 64 x 32 px span: 2 rows of 4 codes
CAPS = ["x", "tok61"]


def forced_layout(target, tok, tail):
    """Rows of W codes each ended by the row end, then the distinct `tail` tokens."""
    row = [-1] * W + [tok.newline]
    forced = torch.tensor(row * H + list(tail))
    return SequenceLayout(int(forced.numel()), CHAMELEON.image_ids(target), forced, CHAMELEON.sub_vocab(target))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from lisa_trt.calibration.profile import calibrate

    d = save_hf(make_hf_model(seed=5, num_key_value_heads=2), tmp_path_factory.mktemp("forced"))
    save_tokenizer(d)
    target = lisa_trt.load_target(d)
    tok = LuminaTokenizer(d)
    torch.manual_seed(0)
    drafter = ChameleonDrafter.from_chameleon(target)
    tail = [i for i in range(60, 96) if i != tok.newline][:3]
    layout = forced_layout(target, tok, tail)
    assert len(set(layout.forced[layout.forced >= 0].tolist())) == 4  # four distinct forced ids
    prompts, span, _ = span_request(target, tok, CAPS, 64, 32, cfg=True)
    assert span.n_tokens == H * (W + 1)
    cal, _, _ = span_request(target, tok, ["tok60", "tok62", "tok63"], 64, 32, cfg=True)
    codebook = torch.randn(N_CODES, 8, generator=torch.Generator().manual_seed(0))
    tables = calibrate(target, codebook, conds=cal, layout=layout, sampling=SamplingConfig(cfg_scale=2.0, top_k=16),
                       samples_per_pos=4, n_clusters=4, lantern_k=8, batch_size=3, min_cluster_samples=8,
                       progress=False)
    return dict(target=target, tok=tok, drafter=drafter, layout=layout, prompts=prompts, tables=tables)


def spec(method, gasv=GASVRuleConfig(), lantern_delta=0.3):
    import dataclasses

    cfg = SpecConfig.make(method, top_k=3, depth=4, total_tokens=10, lantern_k=8, lantern_delta=lantern_delta)
    return dataclasses.replace(cfg, gasv=gasv)


def decode(s, method, *, greedy, seed=1, **kw):
    sampling = SamplingConfig(cfg_scale=2.0, top_k=16, greedy=greedy)
    return run_method(resolve_method(method), s["target"], s["drafter"], s["tables"], s["prompts"], sampling=sampling,
                      spec=spec(method, **kw), seed=seed, layout=s["layout"])


def check_structure(tokens, layout):
    forced = layout.forced >= 0
    assert torch.equal(tokens[:, forced].cpu(), layout.forced[forced].expand(tokens.shape[0], -1))
    free = tokens[:, ~forced]
    assert ((free >= 4) & (free < 4 + N_CODES)).all()


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("method", ["lantern", "gasv"])
def test_every_forced_position_commits_its_own_token(setup, method, greedy):
    for seed in (1, 2):
        tokens, stats = decode(setup, method, greedy=greedy, seed=seed)
        check_structure(tokens, setup["layout"])
        assert stats.mal > 1.0


def test_greedy_relaxed_rules_in_their_exact_limit_are_greedy_decoding(setup):
    """LANTERN with delta 0 and GASV with zero gates (kappa 0, lambda 1) are greedy decoding."""
    ref, _ = run_method(get_method("vanilla"), setup["target"], None, None, setup["prompts"],
                        sampling=SamplingConfig(cfg_scale=2.0, top_k=16, greedy=True), spec=SpecConfig(), seed=0,
                        layout=setup["layout"])
    check_structure(ref, setup["layout"])
    lan, _ = decode(setup, "lantern", greedy=True, lantern_delta=0.0)
    gas, _ = decode(setup, "gasv", greedy=True, gasv=GASVRuleConfig(kappa=0.0, lam=1.0))
    assert torch.equal(lan, ref) and torch.equal(gas, ref)


def test_sampled_gasv_without_budget_is_exact_sampling(setup):
    """GASV with delta 0 gives the exact rule's tokens for the same seed (forced tail included)."""
    for seed in (1, 2):
        exact, _ = decode(setup, "exact", greedy=False, seed=seed)
        soft, st = decode(setup, "gasv", greedy=False, seed=seed, gasv=GASVRuleConfig(delta=0.0))
        check_structure(exact, setup["layout"])
        assert torch.equal(exact, soft) and st.mean_tvd < 1e-5


def test_sjd_gasv_commits_every_forced_token(setup):
    s = setup
    sampling = SamplingConfig(cfg_scale=2.0, top_k=16)
    tokens, _ = run_method(get_method("sjd-gasv"), s["target"], None, s["tables"], s["prompts"], sampling=sampling,
                           spec=SpecConfig(), seed=3, sjd_window=4, layout=s["layout"])
    check_structure(tokens, s["layout"])


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("method", ["lantern", "gasv"])
def test_forced_drafts_are_accepted(setup, method, greedy):
    """A draft path through forced positions (the last row end, then two distinct tail tokens)
    is accepted whole: accept_len 3 and the bonus is the third tail token (rejecting the forced
    drafts would stop after one token)."""
    from lisa_trt.speculative.methods import RuleContext
    from lisa_trt.speculative.subvocab import SubVocabVerifier
    from lisa_trt.speculative.tree import DraftTree

    s = setup
    layout, V = s["layout"], s["target"].config.vocab_size
    n = layout.n_tokens
    f = layout.forced.tolist()
    last_code = 4 + 7
    # node 0: root (the last code of the last row) -> row end -> tail[0] -> tail[1]; node 4: a
    # wrong sibling (a code) at the forced row-end position
    tokens = torch.tensor([[last_code, f[n - 4], f[n - 3], f[n - 2], 4]])
    parents = torch.tensor([[-1, 0, 1, 2, 0]])
    tree = DraftTree.from_parents(tokens, parents)
    token_index = torch.tensor([[n - 4, n - 3, n - 2, n - 1, n - 3]])  # the index each node's law predicts
    raw = torch.randn(1, 5, V, generator=torch.Generator().manual_seed(0))
    logits = layout.law(raw, token_index, lambda x: x)
    forced_ids = layout.forced[token_index]
    ver = SubVocabVerifier(layout.sub_vocab, V, s["tables"], logits.device)
    ctx = RuleContext(spec=spec(method), greedy=greedy, generator=torch.Generator().manual_seed(0), tables=s["tables"])
    res = ver(method, logits, tree, forced_ids, ctx)
    assert int(res.accept_len[0]) == 3
    assert res.tokens[0].tolist() == [f[n - 4], f[n - 3], f[n - 2], f[n - 1]]
    assert int(res.bonus[0]) == f[n - 1]


def test_sampled_lantern_without_budget_is_exact_sampling(setup):
    """LANTERN with delta 0 ('clean' residual) gives the exact rule's tokens for the same seed."""
    for seed in (1, 2):
        exact, _ = decode(setup, "exact", greedy=False, seed=seed)
        soft, _ = decode(setup, "lantern", greedy=False, seed=seed, lantern_delta=0.0)
        assert torch.equal(exact, soft)


def test_to_sub_gives_the_forced_index_only_to_the_forced_token():
    """SubVocab.to_sub: at a forced position only the forced id maps to K; any other draft there
    keeps its own index (a code, or K + 1), so verification can reject it."""
    from lisa_trt.models.family import SubVocab

    sv = SubVocab(code_ids=torch.tensor([4, 5, 6]), codes=torch.zeros(3, 2))
    lut = sv.lut(10, "cpu")
    tokens = torch.tensor([9, 4, 9, 5, 0, 6])
    forced = torch.tensor([9, 9, -1, -1, 9, 7])
    assert sv.to_sub(tokens, forced, lut).tolist() == [3, 0, 4, 1, 4, 2]


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("method", ["lantern", "gasv"])
def test_a_wrong_draft_at_a_forced_position_is_rejected_before_the_right_one(setup, method, greedy):
    """At the last row end the FIRST child is a wrong draft (a code), its sibling the row end: the
    wrong child is rejected (the forced law has no mass on it) and the path goes through the
    sibling and on through the tail; the wrong child's own child (the right tail token) is never
    on the path (a wrong draft counted as the forced token would take its subtree)."""
    from lisa_trt.speculative.methods import RuleContext
    from lisa_trt.speculative.subvocab import SubVocabVerifier
    from lisa_trt.speculative.tree import DraftTree

    s = setup
    layout, V = s["layout"], s["target"].config.vocab_size
    n = layout.n_tokens
    f = layout.forced.tolist()
    # node 0 root (last code) -> 1: wrong code, 2: row end; 1 -> 3: tail[0]; 2 -> 4: tail[0] -> 5: tail[1]
    tokens = torch.tensor([[4 + 7, 4 + 2, f[n - 4], f[n - 3], f[n - 3], f[n - 2]]])
    parents = torch.tensor([[-1, 0, 0, 1, 2, 4]])
    tree = DraftTree.from_parents(tokens, parents)
    token_index = torch.tensor([[n - 4, n - 3, n - 3, n - 2, n - 2, n - 1]])
    raw = torch.randn(1, 6, V, generator=torch.Generator().manual_seed(0))
    logits = layout.law(raw, token_index, lambda x: x)
    ver = SubVocabVerifier(layout.sub_vocab, V, s["tables"], logits.device)
    ctx = RuleContext(spec=spec(method), greedy=greedy, generator=torch.Generator().manual_seed(0), tables=s["tables"])
    res = ver(method, logits, tree, layout.forced[token_index], ctx)
    assert int(res.accept_len[0]) == 3
    assert res.path[0, :4].tolist() == [0, 2, 4, 5], res.path
    assert res.tokens[0].tolist() == [f[n - 4], f[n - 3], f[n - 2], f[n - 1]]
