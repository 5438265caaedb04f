"""Tiny random HF Chameleon checkpoints for tests (transformers is a test-only dependency)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # hf_fixtures, when imported from another folder

from hf_fixtures import randomize  # noqa: E402,F401 (re-exported)

N_CODES = 32  # image-code tokens at ids 4 .. 4 + N_CODES - 1 (protocol tokens at 40..48)
VOCAB = 96


def code_name(code: int) -> str:
    """HF / Chameleon image-token name of VQ code `code` (digits spelt A..J, closing 'Z')."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def vocabulary_map(vocab: int = VOCAB, n_codes: int = N_CODES) -> dict:
    names = {0: "<pad>", 1: "<s>", 2: "</s>", 3: "<image>"}
    for c in range(n_codes):
        names[4 + c] = code_name(c)
    for i in range(4 + n_codes, vocab):
        names[i] = f"tok{i}"
    for i, n in enumerate(LUMINA_SPECIALS):  # Lumina-mGPT's protocol tokens, by name
        names[40 + i] = n
    return {n: i for i, n in names.items()}


LUMINA_SPECIALS = ["<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>", "<reserved08801>",
                   "<reserved08802>", "<reserved08803>", "<reserved08804>", "<unk>"]


def save_tokenizer(folder, vocab: int = VOCAB) -> None:
    """A word-level tokenizer.json over the tiny vocabulary (protocol tokens as special tokens)."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=vocabulary_map(vocab), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(LUMINA_SPECIALS + ["<s>", "</s>"])
    tok.save(str(Path(folder) / "tokenizer.json"))
    (Path(folder) / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


def hf_config(**over):
    from transformers import ChameleonConfig

    kw = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
              vocabulary_map=vocabulary_map(), swin_norm=False,
              vq_config=dict(embed_dim=8, num_embeddings=N_CODES, latent_channels=32, resolution=32,
                             base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1,
                             attn_resolutions=[]))
    kw.update(over)
    return ChameleonConfig(**kw)


def make_hf_model(seed: int = 0, **over):
    from transformers import ChameleonForConditionalGeneration

    torch.manual_seed(seed)
    cfg = hf_config(**over)
    cfg._attn_implementation = "eager"
    model = ChameleonForConditionalGeneration(cfg).eval()
    randomize(model, seed)
    return model


def save_hf(model, path, max_shard_size=None):
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(path), safe_serialization=True, **kw)
    return path


TINY_VQ = dict(embed_dim=8, n_embed=N_CODES, z_channels=32, ch=32, ch_mult=(1, 2), num_res_blocks=1, resolution=16)


def save_model_dir(path, seed: int = 5, vq: bool = True, **over):
    """A tiny checkpoint directory at `path`: make_hf_model(seed, **over), its tokenizer, and
    (vq) a VQGAN (TINY_VQ, built after torch.manual_seed(0)) in path/vqgan/, as users lay it out."""
    from lisa_trt.families.chameleon.vq import ChameleonVQConfig, ChameleonVQGAN, save_chameleon_vq

    d = save_hf(make_hf_model(seed=seed, **over), path)
    save_tokenizer(d)
    if not vq:
        return d
    torch.manual_seed(0)
    save_chameleon_vq(ChameleonVQGAN(ChameleonVQConfig(**TINY_VQ)), Path(d) / "vqgan")
    return d


def hf_raw_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """HF's decoder + lm_head WITHOUT the image-token mask of ChameleonForConditionalGeneration."""
    with torch.no_grad():
        hidden = model.model(input_ids=input_ids).last_hidden_state
        return model.lm_head(hidden).float()


def hf_greedy_raw(model, input_ids: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy over the raw head with full recomputation (HF reference)."""
    ids = input_ids
    for _ in range(n):
        nxt = hf_raw_logits(model, ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
    return ids[:, input_ids.shape[1]:]
