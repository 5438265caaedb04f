"""Memory plans (deploy/memory_plan.py): formulas against hand-computed bytes and the project's own models,
known names, the Lumina-mGPT-7B example, searches, the CLI and `run` refusing before any work."""

import json

import pytest
from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.deploy import model_shapes as S
from lisa_trt.deploy import memory_plan as P
from lisa_trt.deploy.memory_plan import GIB, PlanError, check_plan, known_shape, make_plan, preflight
from lisa_trt.families.chameleon import shapes as CS  # the families' shape plugins
from lisa_trt.families.llamagen import shapes as LS


def tiny_shape():
    from lisa_trt.models.target_config import target_config

    return LS.config_shape(target_config("tiny"), "tiny")


# ----------------------------------------------------------------------------- formulas

def test_tiny_llamagen_by_hand():
    # tiny: dim 64, 4 layers, 4 heads (head_dim 16), vocab 256, 16 image tokens, 10 classes,
    # ffn = find_multiple(int(8 * 64 / 3) = 170, 32) = 192
    s = tiny_shape()
    # per layer: wqkv 64 x 192 = 12288, wo 4096, w1 + w3 2 x 64 x 192 = 24576, w2 12288 -> 53248; norms 128
    # x 4 layers = 212992 + 512; class table 11 x 64 = 704; tok_embeddings 16384; norm 64; output 16384
    assert s.target.linear == 212992 + 16384
    assert s.target.other == 512 + 704 + 16384 + 64
    assert s.target.params == 247040
    p = make_plan(s, memory_gib=8, precision="fp16", batch=1, tree=8, search=False)
    t = p.engines["target"]
    assert t["weights"] == 2 * 247040
    # cache: round_up(1 class token + 16 image tokens + 8 tree, 8) = 32 slots; CFG: 2 rows
    assert p.max_cache_len == 32 and p.rows == 2
    # KV: 2 (k, v) x 4 layers x 4 kv heads x 16 x 32 slots x 2 rows x 2 bytes
    assert t["kv_cache"] == 2 * 4 * 4 * 16 * 32 * 2 * 2 == 65536
    # verify call (tree 8 > prefix 1): hidden 2 x 8 x (6 x 64 + 2 x 192) x 2 = 24576; scores
    # 2 x 4 heads x 8 x 32 x 4 = 8192
    assert t["activations"] == 24576 + 8192
    # io: 2 pooled buffers of logits 2 x 8 x 256 x 4 = 16384 and taps + hidden 2 x 8 x 256 x 2 = 8192, one of
    # the new K/V rows 2 x 4 layers x 4 kv heads x 16 x 2 rows x 8 tokens x 2 bytes = 16384
    assert t["io"] == 2 * (16384 + 8192) + 16384
    # the loop's tensors: 4 fp32 (1, 8, 256) + the (2, 8, 32) tree mask
    assert p.temporaries == 4 * 8 * 256 * 4 + 2 * 8 * 32
    assert p.total == sum(sum(e.values()) for e in p.engines.values()) + p.temporaries + P.CONTEXT_BYTES
    # int8: 1 byte per matmul weight + 4 per output channel; embeddings / norms stay fp16
    rows = 4 * (192 + 64 + 192 + 192 + 64) + 256
    assert make_plan(s, memory_gib=8, precision="int8", tree=8, search=False).engines["target"]["weights"] == \
        229376 + 4 * rows + 2 * 17664
    # int4: half a byte + an fp16 scale per block of 32 weights = 0.5625 byte per weight
    assert make_plan(s, memory_gib=8, precision="int4", tree=8, search=False).engines["target"]["weights"] == \
        229376 * 9 // 16 + 2 * 17664
    # fp32: weights, KV and activations at 4 bytes
    f = make_plan(s, memory_gib=8, precision="fp32", tree=8, search=False).engines["target"]
    assert f["weights"] == 4 * 247040 and f["kv_cache"] == 2 * 65536
    # no CFG: one row, half the cache
    assert make_plan(s, memory_gib=8, tree=8, cfg=False, search=False).engines["target"]["kv_cache"] == 32768


def test_totals_add_up():
    p = make_plan("GPT-L", gpu="l4", tree=32, search=False)
    assert p.total == sum(sum(e.values()) for e in p.engines.values()) + p.temporaries + P.CONTEXT_BYTES
    assert p.build_peak == max(e["weights"] + e["activations"] for e in p.engines.values()) + P.WORKSPACE_BYTES + P.CONTEXT_BYTES
    assert p.fits == (max(p.total, p.build_peak) <= P.GPUS["l4"].usable)


def test_target_counts_match_the_models():
    import torch

    from lisa_trt.models.target_config import target_config
    from lisa_trt.families.chameleon.model import ChameleonConfig, ChameleonTarget
    from lisa_trt.families.llamagen.model import Transformer

    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    for cfg in (target_config("tiny"), target_config("tiny", model_type="t2i", cls_token_num=3, caption_dim=32)):
        m = Transformer(cfg)
        buffers = sum(b.numel() for k, b in m.named_buffers() if k.endswith("uncond_embedding"))
        assert LS.config_shape(cfg, "x").target.params == n(m) + buffers
    ccfg = ChameleonConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2)
    with torch.device("meta"):
        cm = ChameleonTarget(ccfg)
    assert CS.config_shape(ccfg, "x", 512, 16).target.params == n(cm)


def test_drafter_count_matches_the_model():
    from lisa_trt.models.target_config import target_config
    from lisa_trt.models.drafter import Drafter
    from lisa_trt.families.llamagen.model import Transformer

    t = Transformer(target_config("tiny"))
    d = Drafter.from_target(t)
    s = tiny_shape()
    own = sum(p.numel() for p in d.parameters())
    assert P.drafter_weights(s).params == own + 256 * 64  # + the target embedding its step graph carries


def test_vq_decoder_counts_match_the_models():
    from lisa_trt.models.target_config import vq_config
    from lisa_trt.families.chameleon.vq import ChameleonVQConfig, ChameleonVQGAN
    from lisa_trt.families.llamagen.vq import VQModel

    def decode_params(m):
        return sum(p.numel() for c in (m.decoder, m.post_quant_conv) for p in c.parameters()) + \
            m.quantize.embedding.weight.numel()

    import torch

    with torch.device("meta"):
        assert decode_params(VQModel(vq_config("VQ-16"))) == S.VQ16_DECODE_PARAMS
        assert decode_params(ChameleonVQGAN(ChameleonVQConfig())) == CS.CHAMELEON_VQ_DECODE_PARAMS


def test_cache_rules_match_the_exporters():
    from lisa_trt.models.target_config import target_config
    from lisa_trt.families.chameleon.export import engine_cache_len, span_length
    from lisa_trt.families.llamagen.export import max_cache_len

    for name, size in (("GPT-B", 256), ("GPT-XL", 384), ("GPT-3B", 512)):
        s = known_shape(name, size)
        assert s.cache_len(s.prompt_len, 64) == max_cache_len(target_config(name, image_size=size), 64)
    for size in (512, 768, 1024):
        s = known_shape("Lumina-mGPT-7B", size)
        assert s.image_tokens == span_length(size)
        assert s.cache_len(128, 64) == engine_cache_len(size, 128, 64)


# ----------------------------------------------------------------------------- names

def test_shapes_come_from_the_family_plugins():
    """model_shapes dispatches to each family's shape plugin (ModelFamily.shapes_module)."""
    assert set(S.known_names()) == {*LS.NAMES, "Lumina-mGPT-7B", "Janus-Pro-7B", "Emu3-Gen"}
    assert S.default_sizes() == {"llamagen": 256, "chameleon": 768, "janus": 384, "emu3": 720}
    with pytest.raises(P.InputError, match="unknown model"):
        known_shape("GPT-nope")


def test_a_directory_no_family_claims_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(P.InputError, match="which no family loads"):
        P.resolve_model(tmp_path)


def test_known_names():
    from lisa_trt.families.llamagen.config import GPT_SHAPES as _GPT_SHAPES

    for name in LS.NAMES:
        s = known_shape(name)
        grid = LS.DEFAULT_SIZES[name] // 16  # the released size (256 px: 16 x 16 codes)
        assert (s.n_layer, s.n_head, s.dim) == _GPT_SHAPES[name] and s.image_tokens == grid * grid and s.vocab == 16384
    assert known_shape("GPT-L", 384).image_tokens == 576
    lum = known_shape("Lumina-mGPT-7B", 768)
    assert (lum.n_layer, lum.dim, lum.kv_heads, lum.ffn, lum.vocab) == (32, 4096, 32, 11008, 65536)
    assert lum.image_tokens == 48 * 49 and 7.0e9 < lum.target.params < 7.1e9
    jan = known_shape("Janus-Pro-7B")
    assert (jan.n_layer, jan.dim, jan.vocab, jan.image_tokens) == (30, 4096, 16384, 576)
    long = lambda size: any("max_position_embeddings" in n for n in  # noqa: E731
                            make_plan("Lumina-mGPT-7B", image_size=size, search=False).notes)
    assert long(1024) and not long(768)  # 128 + 3 + 64 x 65 = 4296 > 4096 positions
    with pytest.raises(P.InputError, match="384 px"):
        known_shape("Janus-Pro-7B", 512)
    with pytest.raises(P.InputError, match="multiples of 32"):
        known_shape("Lumina-mGPT-7B", 500)
    with pytest.raises(P.InputError, match="known name"):
        known_shape("GPT-Z")


def test_checkpoint_reads_only_its_header(tmp_path):
    from lisa_trt.models.target_config import target_config
    from lisa_trt.models.checkpoints import save_model
    from lisa_trt.families.llamagen.model import Transformer

    cfg = target_config("tiny")
    path = tmp_path / "t.safetensors"
    save_model(Transformer(cfg), cfg, path)
    (tmp_path / "t.json").unlink()  # the header alone is enough
    assert S.safetensors_metadata(path)["config"]
    p = make_plan(str(path), memory_gib=4, search=False)
    assert p.engines["target"]["weights"] == 2 * 247040
    pt = tmp_path / "official.pt"
    pt.write_bytes(b"not read")
    with pytest.raises(P.InputError, match="plan the known name"):
        make_plan(str(pt), memory_gib=4)


def test_prompt_len_and_chameleon_directory(tmp_path):
    assert known_shape("GPT-B").prompt_len == 1 and known_shape("GPT-B", prompt_len=120).prompt_len == 120
    # round_up(120 + 256 + 64, 8) = 440 slots (vs round_up(1 + 256 + 64, 8) = 328 for one class token)
    assert make_plan("GPT-B", prompt_len=120, tree=64, search=False).max_cache_len == 440
    assert make_plan("GPT-B", tree=64, search=False).max_cache_len == 328
    d = tmp_path / "lumina"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(
        model_type="chameleon", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)))
    p = make_plan(str(d), memory_gib=4, image_size=512, prompt_len=16, search=False)
    # 16 prompt + 3 span prefix + 32 x 33 + 64 tree = 1139 -> 1144 slots
    assert p.family == "chameleon" and p.max_cache_len == 1144
    assert p.engines["target"]["kv_cache"] == 2 * 2 * 2 * 16 * 1144 * 2 * 2


# ----------------------------------------------------------------------------- verdicts

def test_lumina_768_fp16_cfg_batch2_tree64_on_a_4090():
    """Fits on TensorRT and ONNX Runtime alike: both hold one KV cache per model, updated in place
    (the graphs return the new rows; issue 36), so the two plans are the same."""
    p = make_plan("Lumina-mGPT-7B", gpu="rtx4090", precision="fp16", batch=2, tree=64, image_size=768, backend="ort")
    assert p.fits and p.cfg and p.rows == 4 and p.max_batch >= 2
    assert 20 * GIB < p.total <= P.GPUS["rtx4090"].usable
    assert 12.5 * GIB < p.engines["target"]["weights"] < 13.5 * GIB  # 7.01 B parameters x 2 bytes
    t = make_plan("Lumina-mGPT-7B", gpu="rtx4090", precision="fp16", batch=2, tree=64, image_size=768)
    assert t.backend == "trt" and t.fits and t.total == p.total and t.max_batch == p.max_batch
    assert all("kv_shadow" not in e for e in t.engines.values())
    f = make_plan("Lumina-mGPT-7B", gpu="rtx4090", precision="fp32", batch=2, tree=64, image_size=768)
    assert not f.fits and f.fitting_precisions == ["fp16", "int8", "int4"] and "--precision fp16 fits" in f.reason
    with pytest.raises(PlanError, match="does not fit|needs") as e:
        check_plan("Lumina-mGPT-7B", gpu="rtx4090", precision="fp32", batch=2, tree=64, image_size=768)
    assert "run total" in str(e.value)  # the table comes with the refusal


def test_largest_batch_and_tree():
    sizes = [8, 16, 24, 48, 80]
    best = [make_plan("GPT-XXL", memory_gib=m, tree=64).max_batch or 0 for m in sizes]
    assert best == sorted(best) and best[-1] > best[0]
    p = make_plan("GPT-XXL", memory_gib=16, tree=64)
    assert make_plan("GPT-XXL", memory_gib=16, batch=p.max_batch, tree=64, search=False).fits
    assert not make_plan("GPT-XXL", memory_gib=16, batch=p.max_batch + 1, tree=64, search=False).fits
    assert make_plan("GPT-XXL", memory_gib=16, tree=p.max_tree, search=False).fits
    if p.max_tree < P.MAX_TREE_SEARCH:
        assert not make_plan("GPT-XXL", memory_gib=16, tree=p.max_tree + 1, search=False).fits
    tiny = make_plan("Lumina-mGPT-7B", memory_gib=4)
    assert not tiny.fits and tiny.max_batch is None and tiny.max_tree is None


def test_bad_values():
    with pytest.raises(P.InputError, match="unknown GPU"):
        make_plan("GPT-B", gpu="rtx9999")
    with pytest.raises(P.InputError, match="not both"):
        make_plan("GPT-B", gpu="l4", memory_gib=24)
    with pytest.raises(P.InputError, match="positive"):
        make_plan("GPT-B", memory_gib=-1)
    with pytest.raises(P.InputError, match="unknown precision"):
        make_plan("GPT-B", precision="int2")
    with pytest.raises(P.InputError, match="--batch"):
        make_plan("GPT-B", batch=0)


# ----------------------------------------------------------------------------- engine directories

@pytest.fixture
def bundle(tmp_path):
    """An engine directory's manifest alone (the plan reads nothing else): the tiny c2i target with
    a drafter, tables and a VQ decoder, max tree 16."""
    from lisa_trt.models.target_config import VQConfig, target_config
    from lisa_trt.export.manifest import Manifest, write_manifest
    from lisa_trt.families.llamagen.export import max_cache_len
    from lisa_trt.models.drafter import DrafterConfig

    t = target_config("tiny")
    man = Manifest(precision="fp32", opset=23, max_tree=16, max_cache_len=max_cache_len(t, 16),
                   target={"hash": "0" * 16, "config": t.to_dict()}, graphs={},
                   drafter={"hash": "1" * 16, "config": DrafterConfig.for_target(t).to_dict(), "arch": "eagle3"},
                   tables={"hash": "2" * 16, "target_hash": "0" * 16, "vocab_size": 256, "n_clusters": 32, "gasv": {}},
                   vq={"hash": "3" * 16, "config": VQConfig(codebook_size=256).to_dict()},
                   generation={"cfg_scale": 4.0})
    d = tmp_path / "eng"
    d.mkdir()
    write_manifest(man, d)
    return d


def test_engine_directory(bundle):
    from lisa_trt.export.manifest import read_manifest

    man = read_manifest(bundle, check_files=False)
    p = make_plan(str(bundle), memory_gib=4)
    assert p.max_cache_len == man.max_cache_len and p.tree == man.max_tree and p.precision == man.precision
    assert set(p.engines) == {"target", "drafter", "gasv", "vq_decode"} and p.fits
    assert p.max_tree == man.max_tree  # the static cache caps the tree
    with pytest.raises(P.InputError, match="max_tree"):
        make_plan(str(bundle), memory_gib=4, tree=man.max_tree + 1)
    with pytest.raises(P.InputError, match="fixed at export"):
        make_plan(str(bundle), memory_gib=4, image_size=256)


def test_preflight_skips_cpu_runs(bundle):
    assert preflight(bundle, gpu_backend=False) is None  # CPU: never refused by a GPU plan
    assert preflight(bundle, memory_gib=4, gpu_backend=False).fits
    with pytest.raises(PlanError):
        preflight(bundle, memory_gib=0.5, gpu_backend=False)
    assert P.run_uses_cfg(bundle, 1.0) is False and P.run_uses_cfg(bundle) is True  # the bundle's cfg 4.0
    assert preflight(bundle, memory_gib=4, gpu_backend=False, cfg_scale=1.0).rows == 1
    from lisa_trt.engines.trt_plans import engines_built

    assert not engines_built(bundle)


def test_run_refuses_before_loading_anything(bundle, tmp_path, monkeypatch):
    from lisa_trt.runtime import pipeline

    def boom(*a, **k):
        raise AssertionError("engines were opened")

    monkeypatch.setattr(pipeline.Pipeline, "from_dir", classmethod(boom))
    prompts = tmp_path / "p.txt"
    prompts.write_text("1\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["run", str(bundle), str(prompts), "--out", str(out), "--memory-gib", "0.5"])
    assert r.exit_code == 2, r.output
    assert "0.50 GiB" in r.output and "run total" in r.output
    assert not out.exists()
    # TensorRT without --gpu: the visible device is the budget ...
    monkeypatch.setattr(P, "device_memory_gib", lambda: 0.5)
    r = CliRunner().invoke(main, ["run", str(bundle), str(prompts), "--out", str(out), "--backend", "trt"])
    assert r.exit_code == 2 and "run total" in r.output, r.output
    # ... but a CPU run is not checked against it: it goes on to open the engines
    r = CliRunner().invoke(main, ["run", str(bundle), str(prompts), "--out", str(out), "--backend", "ort"])
    assert isinstance(r.exception, AssertionError) and "engines were opened" in str(r.exception)


def test_preflight_for_build(bundle, monkeypatch):
    """What `lisa-trt build` calls: the visible device, CFG rows; nothing without a device."""
    monkeypatch.setattr(P, "device_memory_gib", lambda: None)
    assert preflight(bundle, gpu_backend=True, batch=8, cfg=True) is None
    monkeypatch.setattr(P, "device_memory_gib", lambda: 4.0)
    p = preflight(bundle, gpu_backend=True, batch=8, tree=16, cfg=True, workspace=512 << 20)
    assert p.rows == 16 and p.workspace == 512 << 20 and p.usable == 4 * GIB


def test_build_refuses_a_plan_that_does_not_fit_before_any_tensorrt_work(bundle, monkeypatch):
    from lisa_trt.deploy import build as B

    def boom(*a, **k):
        raise AssertionError("build_engines was called")

    monkeypatch.setattr(B, "build_engines", boom)
    r = CliRunner().invoke(main, ["build", str(bundle), "--dry-run", "--memory-gib", "0.5", "--max-batch", "4"])
    assert r.exit_code == 2 and "run total" in r.output and "0.50 GiB" in r.output, r.output
    r = CliRunner().invoke(main, ["build", str(bundle), "--dry-run", "--memory-gib", "500"])
    assert isinstance(r.exception, AssertionError) and "build_engines was called" in str(r.exception)


# ----------------------------------------------------------------------------- CLI

def test_cli_plan_fits_and_json(tmp_path):
    js = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["plan", "Lumina-mGPT-7B", "--gpu", "rtx4090", "--precision", "fp16", "--batch", "1",
                                  "--tree", "64", "--image-size", "768", "--json", str(js)])
    assert r.exit_code == 0, r.output
    assert "fits: yes" in r.output and "target" in r.output and "bandwidth floor per step" in r.output
    d = json.loads(js.read_text())
    assert d["fits"] is True and d["rows"] == 2 and d["max_cache_len"] == 2552
    assert d["engines"]["target"]["kv_cache"] > 0
    e = d["engines"]["target"]
    assert "kv_shadow" not in e and "kv_binding" not in d  # one cache, committed in place on TensorRT too
    # the floor: weights + one read of the cache (the committed rows are negligible beside it)
    assert d["step_bytes"]["target"] == e["weights"] + e["kv_cache"]
    assert d["bandwidth_floor_ms"]["target"] == round(1e3 * d["step_bytes"]["target"] / 1008e9, 3)


def test_cli_plan_does_not_fit(tmp_path):
    js = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["plan", "Lumina-mGPT-7B", "--precision", "fp32", "--json", str(js)])
    assert r.exit_code == 1
    assert "does not fit" in r.output and "fits: NO" in r.output
    assert json.loads(js.read_text())["fits"] is False


@pytest.mark.parametrize("args, msg", [
    (["plan", "GPT-Z"], "known name"),
    (["plan", "GPT-B", "--gpu", "l4", "--memory-gib", "24"], "not both"),
    (["plan", "GPT-B", "--gpu", "rtx9999"], "rtx9999"),
    (["plan", "Janus-Pro-7B", "--image-size", "512"], "384 px"),
    (["plan", "GPT-B", "--batch", "0"], "0"),
])
def test_cli_plan_errors(args, msg):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and msg in r.output


def test_docs_table_is_current():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("plan_table", root / "scripts" / "plan_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = (root / "docs" / "deployment.md").read_text()
    assert mod.splice(doc, mod.table()) == doc, "python scripts/plan_table.py --write docs/deployment.md"
    assert "| Lumina-mGPT-7B | 768 | fp16 |" in doc and "| Janus-Pro-7B | 384 | int4 |" in doc


def test_jetson_plans_the_whole_plan_read_while_loading():
    """On unified memory (Jetson) trt_plans.load_plan's whole read of a plan file costs GPU memory too:
    loading the target (first, before any cache) peaks at its weights twice; a discrete GPU has no
    such transient."""
    kw = dict(precision="fp16", batch=1, tree=64, image_size=768, search=False)
    j, d = make_plan("Lumina-mGPT-7B", gpu="orin-32", **kw), make_plan("Lumina-mGPT-7B", gpu="h100", **kw)
    t = j.engines["target"]
    assert d.load_transient == 0 and d.run_peak == d.total
    assert j.run_peak == P.CONTEXT_BYTES + 2 * t["weights"] + t["activations"] > j.total
    assert "load peak" in j.table() and "load peak" not in d.table()


def test_default_sizes_are_the_released_ones():
    """LlamaGen's c2i GPT-XL / GPT-XXL / GPT-3B were released at 384 px only: planning them at
    256 px would count 44 % of their KV cache; GPT-B / GPT-L default to 256 px."""
    for name, size in (("GPT-B", 256), ("GPT-L", 256), ("GPT-XL", 384), ("GPT-XXL", 384), ("GPT-3B", 384)):
        assert make_plan(name).image_size == size, name
