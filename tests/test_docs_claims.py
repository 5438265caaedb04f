"""Issue 52: the README's and docs' claims about families, precisions, `plan` names and defaults
equal the code's tables. Every expected value is computed from the registries (model families,
export families, the shape plug-ins, PRECISIONS, export's --precision choices), never listed here."""

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DEPLOYMENT = (ROOT / "docs" / "deployment.md").read_text()
FAMILIES = (ROOT / "docs" / "families.md").read_text()
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text()
         for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}


# ----------------------------------------------------------------------------- the code's tables

def plan_defaults() -> dict:
    """{known plan name: its default image size}, from the families' shape plug-ins."""
    from lisa_trt.deploy.model_shapes import known_names, known_shape

    return {n: known_shape(n).image_size for n in known_names()}


def plan_names() -> list:
    from lisa_trt.deploy.model_shapes import known_names

    return list(known_names())


def plan_names_of(family: str) -> list:
    from lisa_trt.deploy.model_shapes import _plugin

    return list(_plugin(family).KNOWN)


def export_precisions() -> set:
    from lisa_trt.cli.export import EXPORT_PRECISIONS

    return set(EXPORT_PRECISIONS)


def plan_precisions() -> set:
    from lisa_trt.deploy.memory_plan import PRECISIONS

    return set(PRECISIONS)


def family_words() -> set:
    """How the docs name the registered families: registry names and the plan names' stems."""
    from lisa_trt.models.family import families

    return {f.name for f in families()} | {n.rsplit("-", 1)[0] for n in plan_names()}


# ----------------------------------------------------------------------------- parsing helpers

def _name_at(text: str, name: str):
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)


def expand(listing: str) -> list:
    """'GPT-B ... GPT-7B, Emu3-Gen' -> the known names, a range 'A ... B' as the names between."""
    names, out = plan_names(), []
    for part in (p.strip() for p in listing.split(",")):
        if "..." in part:
            a, b = (x.strip() for x in part.split("..."))
            out += names[names.index(a):names.index(b) + 1]
        elif part:
            out.append(part.strip("`"))
    return out


def _sizes_in(text: str) -> dict:
    """{name: size} of prose such as 'default 256 for GPT-B / GPT-L and 768 for Lumina-mGPT-7B'
    (or 'GPT-B / GPT-L 256, ...'): the number nearest each known name on the side it is written."""
    found = {}
    for n in plan_names():
        m = _name_at(text, n)
        if m is None:
            continue
        before = list(re.finditer(r"(\d{3,4}) for ", text[:m.start()]))
        after = re.match(r"[\w /-]*?(\d{3,4})", text[m.end():])
        found[n] = int(before[-1].group(1)) if " for " in text else int(after.group(1))
    return found


# ----------------------------------------------------------------------------- families

def test_the_families_deployment_table_is_the_registries():
    from lisa_trt.export.families import export_family
    from lisa_trt.models.family import families

    table = FAMILIES.split("### Deployment per family", 1)[1].split("\n#", 1)[0]
    rows = {m.group(1): [c.strip() for c in m.group(2).split("|")]
            for m in re.finditer(r"^\| `(\w+)` \|(.*)\|$", table, re.M)}
    assert set(rows) == {f.name for f in families()}
    for fam in families():
        precisions, trt, names = rows[fam.name]
        ef = export_family(fam)
        assert {p.strip() for p in precisions.split(",")} == export_precisions(), fam.name
        assert trt == ("yes" if ef.engines_module else "no"), fam.name
        listed = dict(re.findall(r"([\w.-]+) \((\d+)\)", names))
        want = {n: plan_defaults()[n] for n in plan_names_of(fam.name)}
        assert {k: int(v) for k, v in listed.items()} == want, fam.name


def test_no_page_says_a_registered_family_cannot_deploy():
    """The claims issue 52 found ('no TensorRT or fp16 yet', '`export` refuses them', 'no Janus
    family yet') may not come back for any family the registries hold."""
    bad = re.compile(r"no TensorRT or fp16|no (?:TensorRT|fp16|export)\b[^.]*\byet\b|refuses them for now|"
                     r"has no (\w[\w-]*) family", re.I)
    words = {w.lower() for w in family_words()}
    problems = []
    for page, text in PAGES.items():
        for sentence in re.split(r"(?<=[.!?])\s+", text):
            m = bad.search(sentence)
            if m and any(w in sentence.lower() for w in words):
                problems.append(f"{page}: {' '.join(sentence.split())[:160]}")
    assert not problems, problems


# ----------------------------------------------------------------------------- plan: names and defaults

def _plan_help() -> str:
    from lisa_trt.cli import main

    r = CliRunner().invoke(main, ["plan", "--help"], terminal_width=2000)
    assert r.exit_code == 0, r.output
    return " ".join(r.output.split())


def test_plan_help_lists_every_known_name_and_its_default_size():
    text = _plan_help()
    listing = re.search(r"MODEL: a known name \(([^;)]*)", text).group(1)
    assert expand(listing) == plan_names()
    image = re.search(r"--image-size INTEGER RANGE Pixels \(default: (.*?)\)", text).group(1)
    assert _sizes_in(image) == plan_defaults()


def test_every_config_name_plans():
    """`--config` takes every registered GPT shape; `plan` knows each of them."""
    from lisa_trt.models.target_config import target_names

    shapes = [n for n in target_names() if n in plan_names_of("llamagen") or n.startswith("GPT-")]
    assert set(shapes) <= set(plan_names())


def test_readme_plan_row():
    row = next(ln for ln in README.splitlines() if ln.startswith("| `lisa-trt plan MODEL"))
    assert expand(re.search(r"memory plan of a name \(([^)]*)\)", row).group(1)) == plan_names()
    assert set(re.search(r"--precision ([\w\\|]+)\]", row).group(1).replace("\\", "").split("|")) == plan_precisions()


def test_deployment_page_plan_names_precisions_and_sizes():
    model = re.search(r"\*\*MODEL\*\*: a known name \((.*?)\)", DEPLOYMENT, re.S).group(1)
    assert re.findall(r"`([\w.-]+)`", model) == plan_names()
    usage = re.search(r"--precision ([\w|]+)\]", DEPLOYMENT).group(1)
    assert set(usage.split("|")) == plan_precisions()
    bullet = re.search(r"\*\*--image-size\*\* \(default (.*?)\) and", DEPLOYMENT, re.S).group(1)
    assert _sizes_in("default " + " ".join(bullet.split())) == plan_defaults()


def test_readme_export_row_spells_plans_precisions():
    row = next(ln for ln in README.splitlines() if ln.startswith("| `lisa-trt export --model M"))
    listed = set(re.search(r"--precision ([\w\\|]+)\]", row).group(1).replace("\\", "").split("|"))
    assert listed == export_precisions() and listed <= plan_precisions()


def test_a_near_miss_plan_name_gets_a_suggestion():
    from lisa_trt.deploy.model_shapes import known_shape
    from lisa_trt.errors import InputError

    name = plan_names()[-1]
    with pytest.raises(InputError, match=rf"did you mean {re.escape(name)}\?"):
        known_shape(name[:-1] + "Q")
