import pytest

from lisa_trt.runtime.autotune import best_tree, expected_mal


def test_expected_mal_limits():
    assert expected_mal([1.0], 1, 3, 10) == pytest.approx(5.0)  # a perfect chain: root + 4 levels
    assert expected_mal([0.0], 4, 3, 20) == pytest.approx(1.0)
    assert expected_mal([1.0], 2, 5, 4) == pytest.approx(3.0)  # 3 drafted nodes: 2 + 1 levels fit
    # more siblings can only help
    assert expected_mal([0.4], 3, 3, 30) > expected_mal([0.4], 1, 3, 30)


def test_best_tree_follows_costs():
    accept = [0.6, 0.5, 0.4]
    flat = {1: 1.0, 8: 1.0, 16: 1.0, 64: 1.0}  # GPU-like: verification cost flat in tree size
    steep = {1: 1.0, 8: 6.0, 16: 12.0, 64: 48.0}  # CPU-like: linear
    big, _ = best_tree(flat, lambda n: 0.01, accept)
    small, table = best_tree(steep, lambda n: 0.01, accept)
    assert big["total_tokens"] > small["total_tokens"]
    assert all(r["speedup"] <= max(t["speedup"] for t in table) for r in table)


# ----------------------------------------------------------------------------- never slower

from lisa_trt.runtime.autotune import (MIN_GAIN, DecodeChoice, auto_method, choose_decoding,  # noqa: E402
                                       record_choices, recorded_choice)

ACCEPT = [0.6, 0.5, 0.4]
CHEAP_DRAFT = lambda n: 0.01  # noqa: E731


def test_flat_cost_curve_keeps_a_tree():
    flat = {1: 1.0, 8: 1.0, 16: 1.05, 64: 1.2}  # GPU-like
    c = choose_decoding(backend="trt", precision="fp16", verify_cost=flat, draft_cost=CHEAP_DRAFT, accept=ACCEPT)
    assert c.method == "tree" and c.tree == c.best_tree and c.speedup >= MIN_GAIN and not c.measured
    assert "K" in c.reason and "predicted" in c.reason


def test_steep_cost_curve_falls_back_to_vanilla_and_says_so():
    steep = {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0, 64: 64.0}  # every verified token costs a full step
    c = choose_decoding(backend="ort", precision="int8", verify_cost=steep, draft_cost=lambda n: 0.3, accept=ACCEPT)
    assert c.method == "vanilla" and c.tree is None and c.speedup == 1.0
    assert c.best_tree is not None and c.best_tree_speedup < MIN_GAIN
    assert "no tree beats vanilla" in c.reason and "ort/int8" in c.reason


def test_host_overhead_can_turn_a_win_into_a_fallback():
    curve = {1: 1.0, 4: 1.3, 8: 1.8, 16: 3.0}
    win = choose_decoding(backend="ort", precision="fp32", verify_cost=curve, draft_cost=CHEAP_DRAFT, accept=ACCEPT)
    lose = choose_decoding(backend="ort", precision="fp32", verify_cost=curve, draft_cost=CHEAP_DRAFT, accept=ACCEPT,
                           host_step_s=3.0)
    assert win.method == "tree" and lose.method == "vanilla"


def test_measured_speedups_override_the_prediction():
    flat = {1: 1.0, 64: 1.0}
    runs = [{"top_k": 2, "depth": 1, "total_tokens": 4, "speedup": 0.57},
            {"top_k": 3, "depth": 1, "total_tokens": 6, "speedup": 0.51}]
    c = choose_decoding(backend="ort", precision="fp32", verify_cost=flat, draft_cost=CHEAP_DRAFT, accept=ACCEPT,
                        measured=runs)
    assert c.method == "vanilla" and c.measured and c.best_tree == {"top_k": 2, "depth": 1, "total_tokens": 4}
    assert "measured 0.57x" in c.reason
    runs.append({"top_k": 2, "depth": 2, "total_tokens": 5, "speedup": 1.4})
    c = choose_decoding(backend="ort", precision="fp32", measured=runs)
    assert c.method == "tree" and c.tree["depth"] == 2 and c.speedup == pytest.approx(1.4)
    # a win below the margin is not a win
    c = choose_decoding(backend="ort", precision="fp32", measured=[{**runs[0], "speedup": 1.02}])
    assert c.method == "vanilla"


def test_sjd_is_the_fallback_when_it_was_measured_faster():
    runs = [{"top_k": 2, "depth": 1, "total_tokens": 4, "speedup": 0.8}]
    c = choose_decoding(backend="ort", precision="int8", measured=runs, sjd_speedup=1.2)
    assert c.method == "sjd" and c.speedup == pytest.approx(1.2) and "sjd measured 1.20x" in c.reason
    c = choose_decoding(backend="ort", precision="int8", measured=runs, sjd_speedup=0.9)
    assert c.method == "vanilla"
    assert choose_decoding(backend="ort", precision="fp32").method == "vanilla"  # nothing known: vanilla


def test_the_fastest_quality_neutral_decoder_wins_and_relaxed_ones_need_the_frontier():
    """Issue 27: the never-slower choice is re-made from timed decoders. A relaxed / approximate
    decoder is eligible only when the frontier found it quality-neutral; the fastest eligible one
    beating vanilla by MIN_GAIN runs, with its knobs; a lossless one needs no frontier verdict."""
    tree = [{"top_k": 2, "depth": 1, "total_tokens": 4, "speedup": 0.75}]
    decs = [{"method": "mcsjd", "speedup": 1.26, "lossless": True},
            {"method": "zipar", "knobs": {"zipar_window": 4}, "speedup": 1.89, "lossless": False,
             "quality_neutral": True},
            {"method": "gsd", "knobs": {"gsd_group": 25}, "speedup": 2.5, "lossless": False,
             "quality_neutral": False}]
    c = choose_decoding(backend="torch", precision="fp32", measured=tree, decoders=decs)
    assert (c.method, c.knobs, c.lossless) == ("zipar", {"zipar_window": 4}, False)
    assert c.speedup == pytest.approx(1.89) and c.measured and c.tree is None
    assert "zipar[window=4] measured 1.89x" in c.reason and "gsd[group=25] (2.50x) is not quality-neutral" in c.reason
    assert "no tree beats vanilla" in c.reason
    # without the frontier's verdict the approximate one drops out: the lossless one runs
    c = choose_decoding(backend="torch", precision="fp32", decoders=[decs[0], {**decs[1], "quality_neutral": None}])
    assert (c.method, c.knobs, c.lossless) == ("mcsjd", None, True)
    assert "zipar[window=4] (1.89x) has no quality verdict" in c.reason
    # nothing eligible beats vanilla by the margin: vanilla, and the reason names the best loser
    c = choose_decoding(backend="ort", precision="fp32", measured=tree,
                        decoders=[{"method": "mcsjd", "speedup": 0.65, "lossless": True}])
    assert c.method == "vanilla" and "best mcsjd 0.65x" in c.reason and "no tree beats vanilla" in c.reason
    # a tree that beats every decoder still wins
    c = choose_decoding(backend="trt", precision="fp16", measured=[{**tree[0], "speedup": 3.0}], decoders=decs)
    assert c.method == "tree" and c.speedup == pytest.approx(3.0)
    # recorded and read back: auto runs the method with its knobs
    gen = record_choices({}, [choose_decoding(backend="torch", precision="fp32", decoders=decs)])
    assert auto_method(gen, "torch", "fp32", "gasv")[:2] == ("zipar", {"zipar_window": 4})
    assert recorded_choice(gen, "torch", "fp32").knobs == {"zipar_window": 4}


def test_choices_are_recorded_in_the_bundle_settings_and_read_back():
    keep = choose_decoding(backend="ort", precision="fp32",
                           measured=[{"top_k": 2, "depth": 1, "total_tokens": 4, "speedup": 1.5}])
    drop = choose_decoding(backend="ort", precision="int8",
                           measured=[{"top_k": 2, "depth": 1, "total_tokens": 4, "speedup": 0.7}])
    gen = record_choices({"tree": {"ort": {"top_k": 3, "depth": 3, "total_tokens": 10}}}, [keep, drop])
    assert gen["tree"]["ort"] == {"top_k": 2, "depth": 1, "total_tokens": 4}
    assert recorded_choice(gen, "ort", "int8") == drop and isinstance(recorded_choice(gen, "ort", "fp32"), DecodeChoice)
    assert recorded_choice(gen, "trt", "fp16") is None
    assert auto_method(gen, "ort", "int8")[:2] == ("vanilla", None)
    assert auto_method(gen, "ort", "fp32", "gasv")[:2] == ("gasv", keep.tree)
    assert auto_method(gen, "torch", "fp32", "gasv")[0] == "gasv"
    assert record_choices({"tree": {}}, []) == {"tree": {}}  # nothing measured: settings unchanged


def test_demo_export_records_the_shipped_choices(monkeypatch, tmp_path):
    import json

    import lisa_trt.demo.registry as A
    from lisa_trt.runtime.demo import _measured_choices

    c = choose_decoding(backend="ort", precision="int8",
                        measured=[{"top_k": 2, "depth": 1, "total_tokens": 4, "speedup": 0.9}])
    (tmp_path / "decode_choice.json").write_text(json.dumps({"choices": [c.to_dict()]}))
    monkeypatch.setattr(A, "DEMO_DIR", tmp_path)
    assert _measured_choices() == [c]
    gen = record_choices({}, _measured_choices())
    assert auto_method(gen, "ort", "int8")[0] == "vanilla"


def test_the_shipped_demo_choices_are_runnable_and_never_slower():
    """The demo bundle records lisa_trt/assets/demo/decode_choice.json (bench/decoders.py --choose):
    every choice names a registered method whose knobs SpecConfig accepts, and is not slower than
    vanilla where it was measured."""
    import json

    from lisa_trt.demo.registry import DEMO_DIR
    from lisa_trt.speculative.methods import SpecConfig, get_method

    choices = json.loads((DEMO_DIR / "decode_choice.json").read_text())["choices"]
    assert {(c["backend"], c["precision"]) for c in choices} >= {("ort", "fp32"), ("torch", "fp32")}
    for d in choices:
        c = DecodeChoice.from_dict(d)
        assert c.speedup >= 1.0 and c.reason.startswith(f"{c.backend}/{c.precision}:")
        if c.method not in ("tree", "vanilla"):
            m = get_method(c.method)
            SpecConfig.make(method=m.name if m.kind == "tree" else "exact", **(c.knobs or {}))
            assert c.lossless is not None and c.speedup >= MIN_GAIN
