"""Tiny random transformers Emu3 checkpoints for tests (transformers is a test-only dependency)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))  # hf_fixtures

from hf_fixtures import randomize  # noqa: E402

VOCAB, N_CODES, FIRST_CODE = 128, 64, 32
SPECIALS = {"<|endoftext|>": 0, "<|extra_203|>": 1, "<|extra_204|>": 2, "<|image start|>": 3,
            "<|image token|>": 4, "<|image end|>": 5, "<|extra_200|>": 6, "<|extra_201|>": 7, "<image>": 8}
EOL, EOF, EOI, EOS, BOI, WRAP = 6, 7, 5, 2, 3, 4


def vocabulary_map() -> dict:
    names = dict(SPECIALS)
    names.update({str(d): 10 + d for d in range(10)})
    names["*"] = 20
    names.update({"a": 21, "red": 22, "fox": 23})  # caption words of the prompter's test
    names.update({f"<|visual token {c:06d}|>": FIRST_CODE + c for c in range(N_CODES)})
    taken = set(names.values())
    names.update({f"tok{i}": i for i in range(VOCAB) if i not in taken})
    return names


def visual_ids() -> list:
    return list(range(FIRST_CODE, FIRST_CODE + N_CODES))


TINY_VQ = dict(codebook_size=N_CODES, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 2],
               num_res_blocks=1, attn_resolutions=[1], hidden_size=64, num_attention_heads=2,
               temporal_downsample_factor=4)


def hf_config(**over):
    from transformers import Emu3Config

    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    text.update(over.pop("text", {}))
    cfg = Emu3Config(text_config=text, vq_config=dict(TINY_VQ, **over.pop("vq", {})), vocabulary_map=vocabulary_map(),
                     **over)
    return cfg


def make_hf_model(seed: int = 0, **over):
    from transformers import Emu3ForConditionalGeneration

    torch.manual_seed(seed)
    cfg = hf_config(**over)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vq_config._attn_implementation = "eager"
    model = Emu3ForConditionalGeneration(cfg).eval()
    randomize(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # non-trivial BatchNorm statistics (the temporal blocks)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    return model


def save_model_dir(path, seed: int = 0, **over):
    model = make_hf_model(seed, **over)
    model.save_pretrained(str(path), safe_serialization=True)
    return model, Path(path)


def image_prompt(text_ids: list, h: int, w: int) -> list:
    """BOS + text + `<|image start|>h*w<|image token|>`, as Emu3's processor writes it (digits one token each)."""
    grid = [10 + int(c) for c in str(h)] + [20] + [10 + int(c) for c in str(w)]
    return [1, *text_ids, BOI, *grid, WRAP]


def layout_rule(h: int, w: int, prompt_len: int):
    """The Emu3 model card's prefix_allowed_tokens_fn for an (h, w) image (offsets from <|image token|>,
    its order of tests: with w + 1 <= 3 an end token would read as a row end, so tests use w >= 3)."""
    def allowed(batch_id, input_ids):
        position = torch.nonzero(input_ids == WRAP, as_tuple=True)[0][0]
        offset = input_ids.shape[0] - position
        if offset % (w + 1) == 0:
            return [EOL]
        if offset == (w + 1) * h + 1:
            return [EOF]
        if offset == (w + 1) * h + 2:
            return [EOI]
        if offset == (w + 1) * h + 3:
            return [EOS]
        if offset > (w + 1) * h + 3:
            return [0]
        return visual_ids()
    return allowed


def hf_generate(model, ids, h, w, guidance=None, negative=None, attention_mask=None):
    """transformers' greedy image tokens; attention_mask: left padding (without one transformers
    masks every pad_token_id in the prompt, which an unknown word of the test tokenizer is)."""
    n = h * (w + 1) + 3
    kw = {} if guidance is None else {"guidance_scale": guidance}
    if negative is not None:
        kw["negative_prompt_ids"] = negative
    if attention_mask is not None:
        kw["attention_mask"] = attention_mask.long()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                             prefix_allowed_tokens_fn=layout_rule(h, w, ids.shape[1]), **kw)
    return out[:, ids.shape[1]:]


def save_tokenizer(folder) -> None:
    """A word-level tokenizer.json over the tiny vocabulary (protocol tokens special; digits and '*'
    split one per token, as Emu3's BPE does)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = vocabulary_map()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Split(Regex(r"[0-9*]"), "isolated")])
    tok.add_special_tokens(list(SPECIALS))
    tok.save(str(Path(folder) / "tokenizer.json"))


def cli(*args) -> str:
    """`lisa-trt ARGS` in this process; its output (the test fails with it when the exit code is not 0)."""
    from click.testing import CliRunner

    from lisa_trt.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output + (repr(r.exception) if r.exception else "")
    return r.output
