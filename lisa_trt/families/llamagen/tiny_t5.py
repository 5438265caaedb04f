"""A tiny random T5 encoder + word-level tokenizer saved locally, for LlamaGen's caption encoder
(captions.py) in tests and smoke runs; no downloads."""

from __future__ import annotations

from pathlib import Path

WORDS = ("a the of on in with and photo painting picture cat dog bird horse car house tree sky sea "
         "mountain city street red blue green yellow black white small big old young sunny night").split()


def make_tiny_t5(out_dir, *, d_model: int = 12, num_layers: int = 2, num_heads: int = 3, seed: int = 0) -> Path:
    """Write a random T5 encoder (d_model wide) and a lower-casing word-level tokenizer that
    appends </s> like T5's, in transformers' save_pretrained layout. Returns the directory."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    out = Path(out_dir)
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(str(out))
    torch.manual_seed(seed)
    cfg = T5Config(vocab_size=len(vocab), d_model=d_model, d_kv=d_model // num_heads, d_ff=2 * d_model,
                   num_layers=num_layers, num_heads=num_heads, feed_forward_proj="gated-gelu",
                   dropout_rate=0.0)
    T5EncoderModel(cfg).eval().save_pretrained(str(out))
    return out
