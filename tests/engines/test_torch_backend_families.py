"""The torch backend opens the engine directories of every family, not only LlamaGen's: Chameleon /
Lumina-mGPT, Emu3 and Janus-Pro bundles (fp32 with an EAGLE-3 drafter, fp16 with Medusa heads; GASV
and the decoder in both) run on `load_engines(dir, "torch")` (the export's own wrappers, eager) and on
`Pipeline.from_dir(dir, backend="torch")` (the PyTorch models rebuilt from the shared weights file).

- The wrappers a bundle traces are those its family's `graph_module` returns, the ones the torch
  backend runs (no second copy that could be built with other settings).
- The models rebuilt from the shared weights file are the exported ones, tensor for tensor.
- Every graph's outputs on the torch runners (prefill, tree verify and the cache rows they write,
  the drafter, GASV, the decoder) agree with ONNX Runtime's within the export's validation threshold
  of the bundle's precision (export/validate.THRESHOLDS).
- The Pipeline's tokens on both torch routes equal ONNX Runtime's for the same seed: vanilla greedy,
  exact speculation with top-k 1 sampling, GASV; the decoded images within one uint8 level.
- A bundle exported before its family wrote the weights index gets the clear `no_torch_weights` error.

The bundles are tiny random transformers checkpoints (tests/engines/family_bundles.py)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_bundles import FAMILIES, export_family_bundle, family_artifacts, request  # noqa: E402

from lisa_trt.errors import InputError  # noqa: E402
from lisa_trt.export.validate import THRESHOLDS, output_error  # noqa: E402
from lisa_trt.models.io_spec import Graph  # noqa: E402

BUNDLES = {"fp32": "eagle3", "fp16": "medusa"}  # precision -> drafter: both precisions, both drafters
TREE = dict(tree_top_k=2, tree_depth=2, tree_tokens=6)  # fits the bundles' --max-tree 8
RUNS = (("vanilla", dict(greedy=True)), ("exact", dict(top_k=1)), ("gasv", dict(greedy=True)))


@pytest.fixture(scope="module", params=FAMILIES)
def arts(request, tmp_path_factory):
    return family_artifacts(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def bundles(arts, tmp_path_factory):
    root = tmp_path_factory.mktemp(arts["family"] + "_eng")
    return {p: export_family_bundle(arts, root / p, fp16=p == "fp16", drafter=d) for p, d in BUNDLES.items()}


def test_the_bundle_traces_the_wrappers_graph_module_returns(arts, monkeypatch):
    """bundle_graphs builds its target and decoder wrappers through graph_module (what the torch
    backend runs), over the model it is handed, with the export's cache length."""
    from lisa_trt.export.bundle import ExportOptions
    from lisa_trt.export.families import export_family
    from lisa_trt.export.memory import PrecisionCopy

    xf = export_family(arts["target"])
    made = []

    def recorded(graph, model, cfg, cache_len):
        module = type(xf).graph_module(xf, graph, model, cfg, cache_len)
        made.append((graph, model, cache_len, module))
        return module

    monkeypatch.setattr(xf, "graph_module", recorded)
    g = xf.bundle_graphs(arts["target"], arts["drafter"], arts["tables"], arts["vq"], ExportOptions(max_tree=8),
                         source=arts["dir"], image_size=arts["image_size"], max_prompt=16)
    assert g.torch_backend  # the shared weights get the index the torch backend reads
    built = [(graph, build()) for graph, build, _ in g.target(PrecisionCopy(arts["target"], False), "fp32")]
    built.append((Graph.VQ_DECODE, g.vq()))
    assert [b[0] for b in built] == [Graph.TARGET_PREFILL, Graph.TARGET_VERIFY, Graph.VQ_DECODE]
    assert [(graph, module) for graph, _, _, module in made] == built  # each one, and no other
    assert [m[1] for m in made] == [arts["target"], arts["target"], arts["vq"]]
    assert {m[2] for m in made} == {g.max_cache_len}


def test_torch_weights_copies_are_refused_naming_why(arts, tmp_path):
    """A token-prompt family's bundle needs no fp32 copy (its loaders read HF directories, the torch
    backend the shared weights file): `--torch-weights` is refused before any work, and a quantized
    bundle's torch-backend error does not send the user to it."""
    from types import SimpleNamespace

    from lisa_trt.export.bundle import export_bundle
    from lisa_trt.export.families import export_family
    from lisa_trt.export.weights import no_torch_weights

    with pytest.raises(InputError, match="--torch-weights writes fp32 copies that .* do not use"):
        export_bundle(arts["target"], None, None, None, tmp_path / "eng", source=arts["dir"],
                      image_size=arts["image_size"], max_prompt=16, torch_weights=True, progress=False)
    assert not (tmp_path / "eng").exists()
    q = SimpleNamespace(dir=tmp_path, quantization="int8", export_family=export_family(arts["target"]))
    msg = no_torch_weights(q)
    assert "--backend ort" in msg and "without --quantize" in msg and "--quantize int8 --torch-weights" not in msg


def test_models_rebuilt_from_the_shared_weights_are_the_exported_ones(arts, bundles):
    from lisa_trt.export.weights import model_from_bundle

    for precision, man in bundles.items():
        target = model_from_bundle(man, "target")
        _same_state(target, arts["target"], precision)
        _same_state(model_from_bundle(man, "vq"), arts["vq"], "fp32")  # the decoder graph is fp32
        if man.drafter_arch == "eagle3":
            _same_state(model_from_bundle(man, "drafter", target), arts["drafter"], precision)


def _same_state(have, want, precision: str) -> None:
    got = have.state_dict()
    assert set(got) == set(want.state_dict())
    for name, t in want.state_dict().items():
        ref = t.half().float() if precision == "fp16" and t.is_floating_point() else t
        assert torch.equal(got[name].to(ref.dtype), ref), name


def test_model_from_bundle_takes_the_manifest_family(bundles, monkeypatch):
    """The manifest's family (looked up once per Manifest), never a second registry look-up."""
    import lisa_trt.models.family as F
    from lisa_trt.export.manifest import read_manifest
    from lisa_trt.export.weights import model_from_bundle

    man = read_manifest(bundles["fp32"].dir)
    assert man.model_family.name == man.family  # resolved here, once

    def no_lookup(cfg):
        raise AssertionError("family_of called again")

    monkeypatch.setattr(F, "family_of", no_lookup)
    assert model_from_bundle(man, "target") is not None and model_from_bundle(man, "vq") is not None


@pytest.mark.parametrize("precision", sorted(BUNDLES))
def test_torch_runners_agree_with_ort_graph_by_graph(arts, bundles, precision):
    from lisa_trt.engines.graph import load_engines
    from lisa_trt.engines.torch_runner import TorchRunner
    from lisa_trt.models.prompts import Prompts

    man = bundles[precision]
    tol = THRESHOLDS[precision]
    with load_engines(man.dir, "ort", threads=1) as ort, load_engines(man.dir, "torch") as tch:
        assert all(isinstance(r, TorchRunner) for r in tch.target.runners.values())
        model = tch.target.runners[Graph.TARGET_VERIFY].module.model
        assert model.output.weight.dtype == (torch.float16 if precision == "fp16" else torch.float32)
        assert model.inv_freq.dtype == torch.float32  # the RoPE table stays fp32, as in the fp16 graphs
        taps = _target_steps(ort, tch, Prompts.of(request(arts, ort.target).cond), tol)
        _drafter_steps(ort, tch, taps, tol)
        _gasv_and_decoder(ort, tch, man)


def _outputs(o) -> dict:
    return dict(logits=o.logits, taps=o.taps, hidden=o.hidden)


def _close(a: dict, b: dict, tol: float, what: str) -> None:
    for name in a:
        err = output_error(b[name], a[name])
        assert err <= tol, (what, name, err)


def _target_steps(ort, tch, cond, tol):
    """A left-padded prefill, then a 4-node draft tree verified; outputs and cache rows compared."""
    caches, outs = [], []
    for e in (ort, tch):
        cache = e.target.new_cache(cond.ids.shape[0], e.target.max_cache_len)
        caches.append(cache)
        outs.append(e.target.prefill(cond.ids, cache, cond.valid, taps=True))
    _close(_outputs(outs[0]), _outputs(outs[1]), tol, "prefill")
    assert not cond.valid.all()  # the captions' lengths differ: left padding is exercised
    anc = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    oc = caches[0]
    B = oc.batch
    toks = torch.randint(0, ort.target.config.vocab_size, (B, 4), generator=torch.Generator().manual_seed(0))
    slots = oc.lengths[:, None] + torch.arange(4)[None]
    pos = oc.positions(oc.lengths[:, None]) + torch.tensor([0, 1, 1, 2])[None]
    mask = oc.attention_mask(slots, anc[None].expand(B, 4, 4))
    outs = [e.target.forward_tokens(toks, pos, slots, mask, c, taps=True) for e, c in zip((ort, tch), caches)]
    _close(_outputs(outs[0]), _outputs(outs[1]), tol, "verify")
    for i, (a, b) in enumerate(zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v)):
        assert output_error(b, a) <= tol, ("cache", i)
    return outs[0].taps, outs[0].hidden


def _drafter_steps(ort, tch, taps_hidden, tol):
    """EAGLE-3: project the taps, one drafter step over 3 causal tokens; Medusa: every head."""
    taps, hidden = taps_hidden
    B, S = taps.shape[0], 3
    if ort.manifest.drafter_arch == "medusa":
        depth = torch.arange(S)[None].expand(B, S) % (ort.manifest.medusa_config.n_heads + 1)
        a, b = (e.drafter.head_logits(hidden[:, :S].float(), depth) for e in (ort, tch))
        assert output_error(b, a) <= tol, "medusa heads"
        return
    outs = []
    for e in (ort, tch):
        d = e.drafter
        cache = d.new_cache(B, d.max_cache_len)
        slots = torch.arange(S)[None].expand(B, S)
        mask = torch.zeros(B, S, d.max_cache_len, dtype=torch.bool)
        for i in range(S):
            mask[:, i, : i + 1] = True
        h = d.project_taps(taps[:, :S])
        outs.append(dict(zip(("logits", "hidden"), d(h, slots.clone() % d.config.vocab_size, slots, slots, mask,
                                                    cache)), project=h))
    _close(outs[0], outs[1], tol, "drafter")


def _gasv_and_decoder(ort, tch, man):
    """GASV gates on random guided logits over the tables' vocabulary, and code grids decoded; both
    graphs are fp32 in every bundle."""
    g = torch.Generator().manual_seed(1)
    K = man.tables["vocab_size"]
    logits = torch.randn(5, K, generator=g) * 3
    tokens = torch.randint(0, K, (5,), generator=g)
    parents = torch.tensor([-1, 0, 0, 1, 1])
    a, b = (e.gasv(logits, tokens, parents)._asdict() for e in (ort, tch))
    _close(a, b, THRESHOLDS["fp32"], "gasv")
    h, w = man.layout["latent"]
    codes = torch.randint(0, ort.vq.n_codes, (2, h, w), generator=g)
    assert output_error(tch.vq.decode_code(codes), ort.vq.decode_code(codes)) <= THRESHOLDS["fp32"], "decoder"


@pytest.mark.parametrize("precision", sorted(BUNDLES))
def test_pipeline_tokens_on_torch_equal_ort(arts, bundles, precision):
    """Both torch routes (the rebuilt PyTorch models; the graph wrappers with device=) decode the
    ORT tokens for the same seed, and the same pictures. fp32: token for token. fp16: the same too,
    unless the decodes part at a near tie the two backends' fp16 logits there explain (teacher-forced
    along the ORT tokens: their difference within the fp16 threshold, the ORT margin at most twice it)."""
    from lisa_trt.engines.graph import load_engines
    from lisa_trt.export.weights import model_from_bundle
    from lisa_trt.runtime.pipeline import Pipeline

    man = bundles[precision]
    with Pipeline.from_dir(man.dir, backend="ort", threads=1) as ort, \
            Pipeline.from_dir(man.dir, backend="torch") as eager, \
            Pipeline.from_dir(man.dir, backend="torch", device="cpu") as graphs, \
            load_engines(man.dir, "ort", threads=1) as ort_e, load_engines(man.dir, "torch") as tch_e:
        targets = {id(eager): model_from_bundle(man, "target"), id(graphs): tch_e.target}
        for verify, sampling in RUNS:
            want = ort.generate(arts["captions"], verify=verify, seed=3, **TREE, **sampling)
            assert len(set(want.codes.flatten().tolist())) > 1, verify  # not a constant image
            for pipe in (eager, graphs):
                got = pipe.generate(arts["captions"], verify=verify, seed=3, **TREE, **sampling)
                if precision == "fp32" or torch.equal(got.tokens, want.tokens):
                    assert torch.equal(got.tokens, want.tokens), (verify, pipe.backend)
                    for x, y in zip(got.images, want.images):
                        assert np.abs(np.asarray(x).astype(int) - np.asarray(y).astype(int)).max() <= 1, verify
                else:
                    cfg = ort.sampling().cfg_scale
                    _parted_at_a_tie(arts, ort_e.target, targets[id(pipe)], want.tokens, got.tokens, cfg, man)


def _parted_at_a_tie(arts, ort_target, tch_target, want, got, cfg_scale: float, man) -> None:
    """The first position where `got` leaves `want` is a near tie of the ORT guided logits that the
    torch backend's (teacher-forced along `want`) tip the other way, within the fp16 threshold."""
    rows, cols = (want != got).nonzero(as_tuple=True)
    r, t = int(rows[0]), int(cols[0])
    ga, gb = (_guided(tg, request(arts, tg).cond, want[:, : t + 1], cfg_scale, man.max_cache_len)[r, t]
              for tg in (ort_target, tch_target))
    assert output_error(gb, ga) <= THRESHOLDS["fp16"], (r, t)
    diff = float((ga - gb).abs().max())
    w, g = int(want[r, t]), int(got[r, t])
    assert gb[g] >= gb[w] and 0 <= float(ga[w] - ga[g]) <= 2 * diff, (r, t, float(ga[w] - ga[g]), diff)


def _guided(target, cond, tokens, cfg_scale: float, cache_len: int):
    """Guided logits (B, N, V) before each of `tokens` (B, N), teacher-forced after `cond` (the
    decode loop's steps: speculative/autoregressive.py)."""
    from lisa_trt.speculative.autoregressive import cfg_batch, step_inputs
    from lisa_trt.speculative.sampling import cfg_active, guided_logits

    rows = cfg_batch(target, cond, cfg_scale)
    n = 2 if cfg_active(cfg_scale) else 1
    cache = target.new_cache(n * tokens.shape[0], cache_len)
    raw = [target.prefill(rows, cache).logits[:, -1].float()]
    for i in range(tokens.shape[1] - 1):
        x = tokens[:, i : i + 1].repeat(n, 1)
        pos, slots, mask = step_inputs(cache, x)
        raw.append(target.forward_tokens(x, pos, slots, mask, cache).logits[:, -1].float())
        cache.lengths += 1
    return guided_logits(torch.stack(raw, 1), cfg_scale, True)


def test_a_bundle_without_the_weights_index_names_the_reexport(bundles, tmp_path):
    """What a bundle of these families exported before they wrote the index looks like (the same
    shared weights file, no `tensors` record): the torch backend refuses it naming the fix, ORT runs it."""
    from lisa_trt.engines.graph import load_engines
    from lisa_trt.runtime.pipeline import Pipeline

    old = tmp_path / "old"
    shutil.copytree(bundles["fp32"].dir, old)
    raw = json.loads((old / "manifest.json").read_text())
    for key in ("tensors", "rest"):
        raw["weights"].pop(key, None)
    shutil.rmtree(old / "weights", ignore_errors=True)
    (old / "manifest.json").write_text(json.dumps(raw, indent=1))
    fix = r"carries no PyTorch weights for its target .* re-export it with `lisa-trt export`"
    with pytest.raises(InputError, match=fix):
        load_engines(old, "torch")
    with pytest.raises(InputError, match=fix):
        Pipeline.from_dir(old, backend="torch")
    with load_engines(old, "ort", threads=1) as e:
        assert e.target is not None
