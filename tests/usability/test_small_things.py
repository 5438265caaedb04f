"""Issue 52 item 11 (the smaller things): a prompts file is one kind, JSONL or plain (a mix is
refused naming the line); the Python API's errors name its own keywords, not the CLI's flags."""

import pytest

from lisa_trt.errors import InputError
from lisa_trt.runtime.prompts import parse_prompts


def _file(tmp_path, text, name="p.txt"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_one_json_line_among_plain_lines_is_refused_naming_it(tmp_path):
    p = _file(tmp_path, "1\n2\n# a comment\n{\"class\": 3, \"seed\": 5}\n4\n")
    with pytest.raises(InputError) as e:
        parse_prompts(p, num_classes=10)
    assert f"{p}:4: a JSON object among plain text" in str(e.value) and "either JSONL" in str(e.value)
    p = _file(tmp_path, "{\"class\": 1}\n{\"class\": 2}\n3\n", "q.txt")
    with pytest.raises(InputError, match=r"q.txt:3: a plain-text line among JSON objects"):
        parse_prompts(p, num_classes=10)
    caps = _file(tmp_path, "a red car\n{\"caption\": \"a cat\"}\na dog\n", "c.txt")
    with pytest.raises(InputError, match=r"c.txt:2: a JSON object"):
        parse_prompts(caps, captions="lines")


def test_each_kind_alone_reads_as_before(tmp_path):
    plain = parse_prompts(_file(tmp_path, "1\n2\n"), num_classes=10)
    assert [q.class_id for q in plain] == [1, 2]
    js = parse_prompts(_file(tmp_path, "{\"class\": 3, \"seed\": 5}\n{\"class\": 4}\n", "j.txt"), num_classes=10)
    assert [q.class_id for q in js] == [3, 4] and js[0].seed == 5
    named = parse_prompts(_file(tmp_path, "{\"class\": 3}\n", "n.jsonl"), num_classes=10)
    assert named[0].class_id == 3
    with pytest.raises(InputError, match="n2.jsonl:2"):  # a .jsonl name: every line must be an object
        parse_prompts(_file(tmp_path, "{\"class\": 3}\n4\n", "n2.jsonl"), num_classes=10)


def test_python_api_errors_name_its_keywords():
    import lisa_trt
    from lisa_trt.testing import make_target

    pipe = lisa_trt.Pipeline.from_models(make_target())
    with pytest.raises(InputError) as e:
        pipe.generate([0], top_p=2.0, temperature=0.0, decode=False)
    msg = str(e.value)
    assert "top_p=" in msg and "temperature=" in msg and "greedy=True" in msg
    assert "--top-p" not in msg and "--greedy" not in msg


def test_the_cli_still_names_its_flags():
    from click.testing import CliRunner

    from lisa_trt.cli import main

    r = CliRunner().invoke(main, ["generate", "--model", "demo", "--top-p", "2"])
    assert r.exit_code == 2 and "--top-p" in r.output


def test_python_api_names_its_own_way_to_give_a_drafter():
    import lisa_trt
    from lisa_trt.testing import make_target

    pipe = lisa_trt.Pipeline.from_models(make_target())
    for verify, what in (("gasv", "needs a drafter"), ("exact", "needs a drafter")):
        with pytest.raises(InputError) as e:
            pipe.generate([0], verify=verify, decode=False)
        assert what in str(e.value) and "Pipeline.from_models(target, drafter" in str(e.value)
        assert "--drafter" not in str(e.value)
