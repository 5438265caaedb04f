import pytest

from lisa_trt import LisaError
from lisa_trt.runtime.prompts import parse_prompts


def test_text_ids_and_names(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("3\n# comment\n\ncoffee\n 0 \n")
    ps = parse_prompts(f, num_classes=5, class_names=["a", "coffee", "b", "c", "d"])
    assert [(p.line, p.class_id) for p in ps] == [(1, 3), (4, 1), (5, 0)]


def test_jsonl_fields(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"class": 2, "seed": 5, "cfg": 3.5}\n{"class": "b"}\n')
    ps = parse_prompts(f, num_classes=4, class_names=["a", "b", "c", "d"])
    assert ps[0].class_id == 2 and ps[0].seed == 5 and ps[0].cfg == 3.5 and ps[1].class_id == 1


def test_every_bad_line_reported_with_numbers(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"class": 2}\n{"class": 9}\n{oops\n{"class": 1, "seed": -1}\n{"klass": 1}\n["x"]\n')
    with pytest.raises(LisaError) as e:
        parse_prompts(f, num_classes=4)
    msg = str(e.value)
    for no, what in [(2, "unknown class id 9"), (3, "not valid JSON"), (4, "seed must be"),
                     (5, "unknown keys"), (6, "each JSONL line must be an object")]:
        assert f"p.jsonl:{no}: {what}" in msg
    assert "p.jsonl:1:" not in msg and "nothing was generated" in msg


def test_t2i_lines(tmp_path):
    (tmp_path / "c.npy").write_bytes(b"x")
    f = tmp_path / "p.jsonl"
    f.write_text('{"caption_features": "c.npy"}\n{"caption_features": "missing.npy"}\n')
    with pytest.raises(LisaError, match=r"p.jsonl:2: caption features file not found"):
        parse_prompts(f, captions="every-line")
    with pytest.raises(LisaError, match="no prompts"):
        (tmp_path / "e.txt").write_text("\n# only comments\n")
        parse_prompts(tmp_path / "e.txt", num_classes=1000)


def test_cli_classes_take_names_as_serve_matches_them():
    """`--classes` (parse_classes) and a served prompt (_class_id) are one matcher: ids, names in any
    case with "_" for " ", ImageNet's names for a 1000-class model without its own; ambiguous and
    unknown names refused naming the fix."""
    from lisa_trt.errors import InputError
    from lisa_trt.runtime.class_names import imagenet_class_names
    from lisa_trt.runtime.prompts import _class_id, parse_classes

    names = ["coffee mug", "red fox", "Tabby"]
    assert parse_classes("2, Coffee_Mug,RED FOX,tabby", 3, names) == [2, 0, 1, 2]
    for tok in ("Coffee_Mug", "RED FOX", "tabby", "1"):
        assert parse_classes(tok, 3, names) == [_class_id(tok, 3, names)[0]]
    assert parse_classes("golden_retriever,Tench", 1000) == [imagenet_class_names().index("golden retriever"), 0]
    with pytest.raises(InputError, match="--classes: class name 'crane' is ambiguous: classes 134, 517"):
        parse_classes("crane", 1000)
    with pytest.raises(InputError, match=r"--classes: unknown class 'zebra' \(use ids 0..2 or names coffee mug"):
        parse_classes("0,zebra", 3, names)
    with pytest.raises(InputError, match=r"unknown class id 7 \(valid 0..2\)"):
        parse_classes("7", 3, names)
    with pytest.raises(InputError, match="no classes given"):
        parse_classes(" , ", 3, names)
