"""ONNX Runtime one-copy mode (engines/ort.ExclusiveSessions): the target's prefill and verify
sessions are never open together, and the tokens / logits are those of the default mode."""

import torch

from lisa_trt.engines.graph import load_engines


def _decode(engine_dir, one_copy: bool):
    e = load_engines(engine_dir, "ort", threads=1, one_copy=one_copy)
    t = e.target
    cache = t.new_cache(2, extra=8)
    out = t.prefill(torch.tensor([3, t.config.num_classes]), cache, taps=True)
    toks, T = [out.logits.argmax(-1).reshape(2, 1)], t.config.cls_token_num
    for i in range(3):
        pos = torch.full((2, 1), T + i)
        mask = torch.zeros(2, 1, t.max_cache_len, dtype=torch.bool)
        mask[:, :, :T + i + 1] = True
        o = t.forward_tokens(toks[-1], pos, pos.clone(), mask, cache)
        toks.append(o.logits.argmax(-1).reshape(2, 1))
    out2 = t.prefill(torch.tensor([5, 1]), t.new_cache(2, extra=8))  # back to prefill: a second switch
    open_now = [r.session is not None for r in (t._prefill, t._verify)]
    group = getattr(t._prefill, "_exclusive", None)
    e.close()
    return torch.cat(toks, 1), o.logits, out2.logits, open_now, group


def test_one_copy_gives_the_same_outputs_with_one_target_session(bundle):
    ref = _decode(bundle, False)
    one = _decode(bundle, True)
    for a, b in zip(ref[:3], one[:3]):
        assert torch.equal(a, b)
    assert ref[3] == [True, True] and ref[4] is None
    assert one[3] == [True, False] and one[4].switches == 2
