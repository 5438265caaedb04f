"""Pipeline / prompts with caption strings, and t2i drafter training data."""

import pytest
import torch

from lisa_trt.errors import InputError
from lisa_trt.runtime.pipeline import Pipeline
from lisa_trt.runtime.prompts import parse_prompts
from lisa_trt.testing import make_target

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def target():
    return make_target("t2i", std=0.3)


def test_prompt_files(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("a red car\nblue sky\n")
    ps = parse_prompts(p, captions="every-line")
    assert [x.caption for x in ps] == ["a red car", "blue sky"] and ps[1].line == 2
    p.write_text("a red car\n\nblue sky\n")
    with pytest.raises(InputError, match=r"line\(s\) 2"):
        parse_prompts(p, captions="every-line")
    j = tmp_path / "p.jsonl"
    j.write_text('{"caption": "a cat", "seed": 3}\n{"caption": ""}\n')
    with pytest.raises(InputError, match=r"p.jsonl:2: \"caption\" must be non-empty"):
        parse_prompts(j, captions="every-line")
    j.write_text('{"caption": "a cat", "seed": 3, "cfg": 2.5}\n')
    (q,) = parse_prompts(j, captions="every-line")
    assert q.caption == "a cat" and q.seed == 3 and q.cfg == 2.5


def test_pipeline_caption_strings(target, t5_dir, tmp_path, monkeypatch, check_mal):
    from lisa_trt.models.drafter import Drafter
    from lisa_trt.families.llamagen.captions import CaptionEncoder
    from lisa_trt.models.captions import save_caption_features

    monkeypatch.delenv("LISA_TRT_TEXT_ENCODER", raising=False)
    dr = Drafter.from_target(target)
    pipe = Pipeline.from_models(target, dr, generation={"sampling": {"cfg_scale": 3.0}}, text_encoder=t5_dir)
    res = pipe.generate(["a red car", "a dog"], verify="exact", decode=False, tree_top_k=2, tree_depth=2, tree_tokens=5)
    assert res.tokens.shape == (2, target.config.block_size)
    assert [s["caption"] for s in res.stats] == ["a red car", "a dog"]
    for s in res.stats:  # each caption decoded alone: its MAL is (N - 1) / its steps
        check_mal(s["mal"], s["forwards"], target.config.block_size)
    # exact verification is lossless: same tokens as the plain loop from the same features
    from lisa_trt.speculative.autoregressive import generate

    enc = CaptionEncoder(t5_dir, max_length=6)
    feats, mask = enc.encode(["a red car"])
    ref = generate(target, (feats, mask), cfg_scale=3.0, seed=0, greedy=True)
    got = pipe.generate(["a red car"], verify="greedy", decode=False, tree_top_k=2, tree_depth=2, tree_tokens=5)
    assert torch.equal(got.tokens, ref)
    # feature files work without an encoder; captions without one fail with the fix, before work
    from lisa_trt.runtime.prompts import Prompt

    save_caption_features(tmp_path / "f.safetensors", feats, mask, ["a red car"])
    bare = Pipeline.from_models(target, dr, generation={"sampling": {"cfg_scale": 3.0}})
    got2 = bare.generate([Prompt(1, caption_features=str(tmp_path / "f.safetensors"))], verify="greedy",
                         decode=False, tree_top_k=2, tree_depth=2, tree_tokens=5)
    assert torch.equal(got2.tokens, ref)
    with pytest.raises(InputError, match="T5 encoder"):
        bare.generate(["a red car"], verify="vanilla", decode=False)


def test_caption_dataset_null_rows_and_token_file(target, tmp_path):
    from lisa_trt.train.captions import CaptionConds, as_target_cond, load_caption_token_file
    from lisa_trt.train.data import OnlineFeatures, TokenDataset

    g = torch.Generator().manual_seed(0)
    feats = torch.randn(3, 6, 12, generator=g)
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[:, :3] = True
    conds = CaptionConds(feats, mask, torch.tensor([0, 1, 2, 0]), torch.tensor([False, False, False, True]))
    rows = conds[torch.tensor([0, 3])]
    f, m = as_target_cond(target, rows)
    assert torch.equal(f[0], feats[0])
    nf, _ = target.null_cond((feats[:1], mask[:1]))
    assert torch.equal(f[1], nf[0])  # null row: the target's null caption, as at deployment
    tokens = torch.randint(0, target.config.vocab_size, (4, target.config.block_size), generator=g)
    ds = TokenDataset(tokens, conds)
    a, b = ds.split(1)
    assert len(a) == 3 and len(b) == 1 and b.cond.null.tolist() == [True]
    ds.save(tmp_path / "tok.safetensors")
    back = load_caption_token_file(tmp_path / "tok.safetensors", target.config)
    assert torch.equal(back.tokens, tokens) and back.fingerprint() == ds.fingerprint()
    batch = OnlineFeatures(target, back).batch(torch.tensor([1, 3]))
    assert batch.logits.shape == (2, target.config.block_size, target.config.vocab_size)
    with pytest.raises(InputError, match="caption_index must lie"):
        from lisa_trt.io import save_safetensors

        save_safetensors({"tokens": tokens, "caption_features": feats, "caption_mask": mask,
                          "caption_index": torch.tensor([0, 1, 2, 5])}, tmp_path / "bad.safetensors")
        load_caption_token_file(tmp_path / "bad.safetensors", target.config)


def test_train_from_token_file_and_resume_exact(target, tmp_path, kill_training):
    """t2i drafter training on a token+feature file; a killed run resumes to the same weights."""
    import lisa_trt.train.trainer as T
    from lisa_trt.train.captions import self_distill_caption_tokens
    from lisa_trt.train.data import DataConfig
    from lisa_trt.train.losses import LossConfig

    g = torch.Generator().manual_seed(1)
    feats = torch.randn(4, 6, 12, generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[:, 4:] = False
    ds = self_distill_caption_tokens(target, feats, mask, 10, cfg_scale=3.0, seed=0, batch_size=5, progress=False)
    assert int(ds.cond.null.sum()) == 1 and sorted(ds.cond.index[:4].tolist()) == [0, 1, 2, 3]
    again = self_distill_caption_tokens(target, feats, mask, 10, cfg_scale=3.0, seed=0, batch_size=5, progress=False)
    assert torch.equal(again.tokens, ds.tokens)  # a pure function of the arguments
    ds.save(tmp_path / "tok.safetensors")
    cfg = T.TrainConfig(steps=4, batch_size=2, lr=3e-3, ttt_steps=2, checkpoint_every=2, seed=0,
                        loss=LossConfig(kind="eagle3"),
                        data=DataConfig(source="tokens", token_file=str(tmp_path / "tok.safetensors"), eval_samples=2))
    full = T.train_drafter(target, None, cfg, tmp_path / "full", progress=False)

    kill_training(lambda: T.train_drafter(target, None, cfg, tmp_path / "run", progress=False))
    resumed = T.train_drafter(target, None, cfg, tmp_path / "run", progress=False)
    from safetensors.torch import load_file

    a, b = load_file(full["drafter"]), load_file(resumed["drafter"])
    assert all((a[k] - b[k]).abs().max() <= 1e-6 for k in a)


def test_t2i_ddp_two_ranks_match_single_process(target, tmp_path):
    """torchrun --nproc_per_node 2 (gloo) on caption self-distillation == one process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    import lisa_trt
    from lisa_trt.models.captions import save_caption_features
    from lisa_trt.train import DataConfig, LossConfig, TrainConfig, train_drafter

    g = torch.Generator().manual_seed(2)
    mask = torch.zeros(5, 6, dtype=torch.bool)
    for i in range(5):
        mask[i, : 2 + i % 4] = True
    save_caption_features(tmp_path / "caps.safetensors", torch.randn(5, 6, 12, generator=g) * mask[..., None], mask)
    root = str(Path(lisa_trt.__file__).resolve().parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    env.pop("WORLD_SIZE", None)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(Path(__file__).with_name("ddp_t2i_worker.py")), str(tmp_path / "ddp"),
                        str(tmp_path / "caps.safetensors")], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = TrainConfig(steps=2, batch_size=4, ttt_steps=2, warmup_steps=1, checkpoint_every=1, log_every=1, lr=3e-3,
                      loss=LossConfig(kind="eagle3"),
                      data=DataConfig(num_samples=8, eval_samples=2, gen_batch=8, cfg_scale=3.0,
                                      caption_file=str(tmp_path / "caps.safetensors")))
    single = train_drafter(target, None, cfg, tmp_path / "single", progress=False)
    a, b = load_file(tmp_path / "ddp" / "drafter.safetensors"), load_file(single["drafter"])
    assert all((a[k] - b[k]).abs().max() < 1e-5 for k in a)


def test_large_caption_tables_are_read_lazily(target, tmp_path, monkeypatch):
    import lisa_trt.train.captions as C
    from lisa_trt.models.captions import save_caption_features

    g = torch.Generator().manual_seed(3)
    mask = torch.zeros(7, 6, dtype=torch.bool)
    mask[:, :4] = True
    feats = torch.randn(7, 6, 12, generator=g) * mask[..., None]
    save_caption_features(tmp_path / "c.safetensors", feats, mask, dtype="bfloat16")
    ef, em = C.load_caption_table(tmp_path / "c.safetensors", target.config)
    monkeypatch.setattr(C, "LAZY_BYTES", 0)
    lf, lm = C.load_caption_table(tmp_path / "c.safetensors", target.config)
    assert isinstance(lf, C.LazyFeatures) and torch.is_tensor(ef) and torch.equal(lm, em)
    idx = torch.tensor([5, 0, 5])
    assert torch.equal(lf[idx].float(), ef[idx])
    a = C.CaptionConds(ef, em, torch.tensor([0, 3, 6]))
    b = C.CaptionConds(lf, lm, torch.tensor([0, 3, 6]))
    assert a.fingerprint() == b.fingerprint() and torch.equal(a[torch.tensor([2])].feats, b[torch.tensor([2])].feats)
    ta = C.self_distill_caption_tokens(target, ef, em, 4, cfg_scale=3.0, seed=0, batch_size=4, progress=False)
    tb = C.self_distill_caption_tokens(target, lf, lm, 4, cfg_scale=3.0, seed=0, batch_size=4, progress=False)
    assert torch.equal(ta.tokens, tb.tokens)
    with pytest.raises(InputError, match="this target needs"):
        C.load_caption_table(tmp_path / "c.safetensors", make_target("t2i", cls_token_num=5).config)
