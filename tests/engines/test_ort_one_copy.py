"""One copy of the target in ONNX Runtime memory (issue 26).

By default ORT opens one target session: the verify graph embeds the condition ids too
(ExportFamily.prefill_ids), so the prefill is a verify call and the prefill graph is never opened.
Its outputs, the cache it writes and the decoded tokens are bit-identical to the prefill graph's.
Bundles exported before that (no `prefill_ids` in the manifest) open both graphs as before, or one
at a time in one-copy mode (engines/ort.ExclusiveSessions)."""

import json
import shutil

import torch

from lisa_trt.engines.graph import load_engines
from lisa_trt.models.io_spec import Graph


def _decode(engine_dir, **options):
    e = load_engines(engine_dir, "ort", threads=1, **options)
    t = e.target
    cache = t.new_cache(2, extra=8)
    out = t.prefill(torch.tensor([3, t.config.num_classes]), cache, taps=True)
    first = (out.logits.clone(), out.taps.clone(), out.hidden.clone(), [k.clone() for k in cache.k],
             cache.col_valid.clone(), cache.lengths.clone())
    toks, T = [out.logits.argmax(-1).reshape(2, 1)], t.config.cls_token_num
    for i in range(3):
        pos = torch.full((2, 1), T + i)
        mask = torch.zeros(2, 1, t.max_cache_len, dtype=torch.bool)
        mask[:, :, :T + i + 1] = True
        o = t.forward_tokens(toks[-1], pos, pos.clone(), mask, cache)
        toks.append(o.logits.argmax(-1).reshape(2, 1))
    out2 = t.prefill(torch.tensor([5, 1]), t.new_cache(2, extra=8))  # back to prefill: a second switch
    opened = sorted(g.value for g in t.runners)
    open_now = [r.session is not None for r in (t._prefill, t._verify) if r is not None]
    group = getattr(t._prefill, "_exclusive", None)
    e.close()
    return dict(tokens=torch.cat(toks, 1), logits=o.logits, again=out2.logits, first=first, opened=opened,
                open_now=open_now, group=group)


def _same(a, b):
    for x, y in zip(a["first"][:3], b["first"][:3]):
        assert x.shape == y.shape and torch.equal(x, y)
    assert all(torch.equal(x, y) for x, y in zip(a["first"][3], b["first"][3]))  # the cache the prefill wrote
    assert torch.equal(a["first"][4], b["first"][4]) and torch.equal(a["first"][5], b["first"][5])
    for k in ("tokens", "logits", "again"):
        assert torch.equal(a[k], b[k]), k


def test_the_manifest_records_the_prefill_ids_of_the_verify_graph(bundle):
    from lisa_trt.export.manifest import read_manifest

    man = read_manifest(bundle)
    cfg = man.target_config
    assert man.target["prefill_ids"] == {"offset": cfg.vocab_size, "count": cfg.num_classes + 1}


def test_ort_opens_one_target_session_with_the_prefill_graphs_outputs(bundle):
    one = _decode(bundle)
    two = _decode(bundle, prefill_via_verify=False)  # the prefill graph, as before
    assert one["opened"] == [Graph.TARGET_VERIFY.value] and one["open_now"] == [True]
    assert two["opened"] == [Graph.TARGET_PREFILL.value, Graph.TARGET_VERIFY.value]
    _same(one, two)


def test_an_old_bundle_opens_both_graphs_and_one_copy_keeps_one_open(bundle, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(bundle, old)
    m = json.loads((old / "manifest.json").read_text())
    del m["target"]["prefill_ids"]  # as exported before the verify graph embedded the class ids
    (old / "manifest.json").write_text(json.dumps(m))
    ref = _decode(old)
    assert ref["opened"] == [Graph.TARGET_PREFILL.value, Graph.TARGET_VERIFY.value]
    assert ref["open_now"] == [True, True] and ref["group"] is None
    one = _decode(old, one_copy=True)
    assert one["open_now"] == [True, False] and one["group"].switches == 2
    _same(ref, one)
    _same(ref, _decode(bundle))


def test_ort_opens_each_drafter_weight_once_by_default(bundle):
    """ORT opens drafter_fused alone (it holds the fc, layer and head; a commit is one call):
    drafter_project, a second copy of the fc, opens at the first project_taps only; with
    fused_drafter=False it opens project + step (how a bundle exported before drafter_fused runs)."""
    with load_engines(bundle, "ort", threads=1) as e:
        assert sorted(g.value for g in e.drafter.runners) == [Graph.DRAFTER_FUSED.value]
        assert e.drafter.fused_commit
        e.drafter.project_taps(torch.zeros(1, 1, e.manifest.dims["tap_dim"]))
        assert sorted(g.value for g in e.drafter.runners) == [Graph.DRAFTER_FUSED.value, Graph.DRAFTER_PROJECT.value]
    with load_engines(bundle, "ort", threads=1, fused_drafter=False) as e:
        assert sorted(g.value for g in e.drafter.runners) == [Graph.DRAFTER_PROJECT.value, Graph.DRAFTER_STEP.value]
        assert not e.drafter.fused_commit


def test_teacher_forcing_an_engine_target_names_the_eager_target(bundle, artifacts):
    """lisa_trt.teacher_forced_logits on an engine target (no cache-free forward) is an InputError naming
    load_target, not an AttributeError from inside the family; the eager target still answers."""
    import pytest

    import lisa_trt
    from lisa_trt.errors import InputError

    cond, tokens = torch.tensor([1, 2]), torch.zeros(2, 3, dtype=torch.long)
    assert lisa_trt.teacher_forced_logits(artifacts["target"], cond, tokens).shape[:2] == (2, 3)
    with load_engines(bundle, "ort", threads=1) as e:
        with pytest.raises(InputError, match="load_target"):
            lisa_trt.teacher_forced_logits(e.target, cond, tokens)
