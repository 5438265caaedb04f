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
        parse_prompts(f, model_type="t2i")
    with pytest.raises(LisaError, match="no prompts"):
        (tmp_path / "e.txt").write_text("\n# only comments\n")
        parse_prompts(tmp_path / "e.txt")
