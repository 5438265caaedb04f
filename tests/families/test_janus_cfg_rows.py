"""Janus writes CFG's unconditional rows once: the torch target, the exported graph target's
condition and the reference generation loop all take them from the family (JanusFamily.null_cond),
and that rule is transformers' (BOS / BOI kept, every other token PAD, the mask unchanged)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

pytest.importorskip("transformers")

from test_janus import BOI, BOS, PAD, left_padded, make_hf, save  # noqa: E402

import lisa_trt  # noqa: E402


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return lisa_trt.load_target(str(save(make_hf(seed=3), tmp_path_factory.mktemp("janus_cfg"))))


def test_the_family_rule_is_transformers(target):
    from lisa_trt.models.family import family_of

    ids, mask = left_padded()
    null, m = family_of(target.config).null_cond(target.config, (ids, mask))
    keep = (ids == BOS) | (ids == BOI)
    assert torch.equal(m, mask) and torch.equal(null[keep], ids[keep]) and (null[~keep] == PAD).all()
    assert keep.any() and (~keep).any()


def test_every_caller_asks_the_family(target, monkeypatch):
    """A family rule swapped in (every unconditional id BOI) reaches the target, the graph
    condition and the reference loop: none of them has a copy of its own."""
    from lisa_trt.families.janus.export import JanusCondition
    from lisa_trt.families.janus.family import JanusFamily
    from lisa_trt.families.janus.generate import generate_image_tokens

    calls = []

    def rule(self, cfg, cond, uncond_embedding=None):
        calls.append(cond)
        ids, mask = cond if isinstance(cond, tuple) else (cond, None)
        null = torch.full_like(ids, cfg.boi_token_id)
        return null if mask is None else (null, mask)

    ids, mask = left_padded()
    want = generate_image_tokens(target, (ids, mask), cfg_scale=3.0)
    monkeypatch.setattr(JanusFamily, "null_cond", rule)
    assert (target.null_cond(ids) == BOI).all() and len(calls) == 1
    assert (JanusCondition(target.config).null_cond((ids, mask))[0] == BOI).all() and len(calls) == 2
    got = generate_image_tokens(target, (ids, mask), cfg_scale=3.0)
    assert len(calls) == 3 and not torch.equal(got, want)  # the swapped rule guided this decode
