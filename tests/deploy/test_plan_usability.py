"""`lisa-trt plan` as a new user meets it: a --json folder that is not there, an unknown --gpu,
a plan that fits with little margin, model names in any case, and a NO sentence that offers only
what fits."""

import json

from click.testing import CliRunner

from lisa_trt.cli import main
from lisa_trt.deploy.memory_plan import make_plan

# TensorRT (default "swap" binding): 21.4 GiB of a 23 GiB device, 93 %
LUMINA_B1 = ["plan", "Lumina-mGPT-7B", "--memory-gib", "23", "--precision", "fp16", "--batch", "1", "--tree", "64",
             "--image-size", "768"]


def test_json_into_a_missing_folder_fails_and_creates_nothing(tmp_path):
    dest = tmp_path / "no" / "such" / "plan.json"
    r = CliRunner().invoke(main, ["plan", "GPT-B", "--json", str(dest)])
    assert r.exit_code == 2, r.output
    assert "does not exist" in r.output and "mkdir -p" in r.output
    assert not (tmp_path / "no").exists()


def test_an_unknown_gpu_names_memory_gib():
    r = CliRunner().invoke(main, ["plan", "GPT-B", "--gpu", "rtx5090"])
    assert r.exit_code == 2 and "rtx5090" in r.output and "--memory-gib" in r.output, r.output


def test_gpu_names_match_in_any_case():
    r = CliRunner().invoke(main, ["plan", "GPT-B", "--gpu", "RTX4090"])
    assert r.exit_code == 0 and "RTX 4090" in r.output, r.output


def test_a_fit_above_90_percent_warns_about_the_margin(tmp_path):
    js = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["plan", "Lumina-mGPT-7B", "--gpu", "rtx4090", "--precision", "fp16", "--batch", "2",
                                  "--tree", "64", "--image-size", "768", "--json", str(js)])  # 22.95 of 23.99 GiB
    assert r.exit_code == 0 and "fits: yes" in r.output, r.output
    assert "warning:" in r.output and "96 % of" in r.output
    assert json.loads(js.read_text())["margin_warning"]
    roomy = CliRunner().invoke(main, ["plan", "GPT-B", "--gpu", "h200"])
    assert roomy.exit_code == 0 and "warning:" not in roomy.output


def test_model_names_match_case_insensitively():
    a = make_plan("lumina-mgpt-7b", gpu="rtx4090", search=False)
    b = make_plan("Lumina-mGPT-7B", gpu="rtx4090", search=False)
    assert a.model == b.model and a.total == b.total
    r = CliRunner().invoke(main, ["plan", "gpt-b"])
    assert r.exit_code == 0, r.output


def test_the_no_sentence_offers_only_what_fits():
    # int4 is the lowest precision: the sentence may not offer "a lower precision"
    p = make_plan("Lumina-mGPT-7B", memory_gib=12, precision="int4", batch=16, tree=64)
    assert not p.fits and not p.fitting_precisions and p.max_batch
    assert "lower precision" not in p.reason.split("GiB. ", 1)[1] and f"--batch {p.max_batch} (at tree 64)" in p.reason
    # nothing fits at all: no "Use --batch", and the way out is a larger device
    none = make_plan("Lumina-mGPT-7B", memory_gib=2, precision="int4")
    assert not none.fits and not none.max_batch and not none.max_tree and not none.fitting_precisions
    assert "Use --" not in none.reason and "--memory-gib" in none.reason
    # a lower precision that fits is offered as such
    f = make_plan("Lumina-mGPT-7B", gpu="rtx4090", precision="fp32", batch=1, tree=64, image_size=768)
    assert "--precision fp16 fits" in f.reason


def test_backend_option_chooses_the_runtime_planned_with_one_kv_cache(tmp_path):
    """`plan --backend`: TensorRT and ONNX Runtime both hold one KV cache per cache-owning model
    (the graphs return the new rows, the runner commits them): no shadow column, the same cache
    bytes and totals on both; `--kv-binding` is gone."""
    def planned(*extra):
        js = tmp_path / f"plan{len(list(tmp_path.iterdir()))}.json"
        r = CliRunner().invoke(main, LUMINA_B1 + list(extra) + ["--json", str(js)])
        assert r.exit_code in (0, 1), r.output
        return r.output, json.loads(js.read_text())

    out, trt = planned()
    assert "TensorRT" in out and "shad" not in out and "kv_binding" not in trt
    assert all("kv_shadow" not in e for e in trt["engines"].values())
    out, ort = planned("--backend", "ort")
    assert ort["backend"] == "ort" and "ONNX Runtime" in out
    assert {k: e["kv_cache"] for k, e in trt["engines"].items() if "kv_cache" in e} == \
        {k: e["kv_cache"] for k, e in ort["engines"].items() if "kv_cache" in e}
    assert trt["total"] == ort["total"]
    r = CliRunner().invoke(main, LUMINA_B1 + ["--kv-binding", "swap"])
    assert r.exit_code == 2 and "--kv-binding" in r.output, r.output
