"""One decode session for every loop (issue 49 item 1, speculative/session.py): the prefill, the
target cache, the CFG rows, the guide and the random source are set up in one place, and every
registered method (plus Medusa heads through the tree decoder) decodes through `open_session`."""

import ast
from pathlib import Path

import pytest
import torch

from lisa_trt.config import SamplingConfig
from lisa_trt.errors import InputError
from lisa_trt.models.drafter import Drafter
from lisa_trt.models.medusa import MedusaHeads
from lisa_trt.speculative import session as S
from lisa_trt.speculative.methods import METHODS, SpecConfig
from lisa_trt.speculative.run import run_method
from lisa_trt.testing import make_target
from lisa_trt.speculative.methods import get_method, resolve_method

from test_step_budget import _tables

SPECULATIVE = Path(S.__file__).resolve().parent
# (attribute called, what sets it up): each may be called in one place of the package's decode loops
SETUP_CALLS = {"prefill": "the target's prefill", "new_cache": "a target cache", "cfg_batch": "the CFG rows",
               "Guide": "the guide", "make_generator": "a batch generator", "RowGenerators": "per-row generators"}


def setup_sites(root: Path = SPECULATIVE) -> dict:
    """{name: ['file:line', ...]} of every call of a SETUP_CALLS name in `root`'s modules, except inside
    the engines' own methods (a def named prefill / new_cache: the proxies' forwarding, the oracle
    drafter's copy of the target), the RowGenerators class itself and the drafter's cache
    (`<...>.drafter.new_cache`)."""
    out = {k: [] for k in SETUP_CALLS}

    def visit(node, scope: tuple, where: str):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            scope = scope + (node.name,)
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            drafter = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr == "drafter"
            engine = {"prefill", "new_cache", "RowGenerators"} & set(scope)
            if name in out and not engine and not drafter:
                out[name].append(f"{where}:{node.lineno}")
        for child in ast.iter_child_nodes(node):
            visit(child, scope, where)

    for p in sorted(root.glob("*.py")):
        visit(ast.parse(p.read_text()), (), p.name)
    return out


def test_every_setup_step_is_written_once_in_the_session():
    sites = setup_sites()
    assert {k: len(v) for k, v in sites.items()} == {k: 1 for k in SETUP_CALLS}, sites
    assert all(v[0].startswith("session.py:") for v in sites.values()), sites


def test_the_site_count_sees_a_loop_that_prefills_itself(tmp_path):
    """The count can fail: a loop with its own cache and prefill (the pre-session SJD) is two more sites."""
    for p in SPECULATIVE.glob("*.py"):
        (tmp_path / p.name).write_text(p.read_text())
    (tmp_path / "own_loop.py").write_text(
        "def loop(target, cond, new_target_cache, B, N):\n"
        "    cache = target.new_cache(B, extra=1, prompt_len=1, n_tokens=N)\n"
        "    return target.prefill(cond, cache), Guide(None)\n")
    sites = setup_sites(tmp_path)
    assert len(sites["prefill"]) == len(sites["new_cache"]) == len(sites["Guide"]) == 2
    assert "own_loop.py:3" in sites["prefill"]


def test_the_seeds_message_is_written_once():
    """'N seeds for M prompts' lives in the session's generators alone."""
    hits = [p.name for p in SPECULATIVE.glob("*.py") if "seeds for" in p.read_text()]
    assert hits == ["session.py"]


# -- every method decodes through open_session -------------------------------------------------------

@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    t = make_target(std=0.3)
    return t, Drafter.from_target(t).eval(), _tables(t), MedusaHeads.from_target(t, n_heads=2).eval()


class _Counted:
    """Counts open_session calls and the target prefills each one runs (a prefill outside a session:
    a loop that sets itself up)."""

    def __init__(self, monkeypatch, target):
        self.sessions, self.inside, self.outside, self._in = 0, 0, 0, False
        inner_open, inner_prefill = S.open_session, target.prefill

        def open_session(*a, **kw):
            self.sessions += 1
            self._in = True
            try:
                return inner_open(*a, **kw)
            finally:
                self._in = False

        def prefill(*a, **kw):
            if self._in:
                self.inside += 1
            else:
                self.outside += 1
            return inner_prefill(*a, **kw)

        monkeypatch.setattr(S, "open_session", open_session)
        monkeypatch.setattr(target, "prefill", prefill)


CASES = sorted(METHODS) + ["medusa"]


@pytest.mark.parametrize("method", CASES)
def test_every_method_decodes_through_one_session(models, monkeypatch, method):
    t, d, tables, heads = models
    name, drafter = ("exact", heads) if method == "medusa" else (method, d)
    counted = _Counted(monkeypatch, t)
    spec = SpecConfig.make("exact", top_k=3, depth=2, total_tokens=8).replace(sjd_window=3, zipar_window=2)
    toks, st = run_method(resolve_method(name), t, drafter, tables, torch.tensor([1, 5]), sampling=SamplingConfig(cfg_scale=2.0),
                          spec=spec, seed=3)
    assert toks.shape == (2, t.config.block_size) and bool((toks >= 0).all())
    assert counted.sessions == 1 and counted.inside == 1, vars(counted)
    # the oracle's drafter is a second copy of the target with its own prompt (oracle.py), no loop's setup
    assert counted.outside == (1 if METHODS[name].drafter_factory is not None else 0), vars(counted)
    assert st.target_forwards >= 1


def test_the_session_counts_see_a_loop_that_sets_itself_up(models, monkeypatch):
    """Planted: a decoder whose decode prefills a cache of its own is seen (a prefill outside)."""
    from lisa_trt.speculative.autoregressive import ARDecoder

    t = models[0]
    counted = _Counted(monkeypatch, t)
    inner = ARDecoder.decode

    def own_setup(self, session, **kw):
        session.cache = S.new_target_cache(t, 4, session.full, session.N)
        t.prefill(session.full, session.cache)
        return inner(self, session, **kw)

    monkeypatch.setattr(ARDecoder, "decode", own_setup)
    run_method(get_method("vanilla"), t, None, None, torch.tensor([1, 5]), sampling=SamplingConfig(cfg_scale=2.0),
               spec=SpecConfig(), seed=3)
    assert counted.sessions == 1 and counted.outside == 1


def test_one_seed_rule_for_every_decoder(models):
    """Per-row seeds: the session's one message for a wrong count; decoders without per-row
    generators (Decoder.row_seeds False: the Jacobi loops but ZipAR) refuse them by name."""
    t, d, tables, _ = models
    spec = SpecConfig.make("exact", top_k=3, depth=2, total_tokens=8).replace(sjd_window=3)
    kw = dict(sampling=SamplingConfig(cfg_scale=2.0), spec=spec, seed=0)
    for name in sorted(METHODS):
        dec = METHODS[name].decoder(t, d, tables, None, spec)
        # the registry's word for the serving path (Method.row_seeds, read by Pipeline) is the decoder's
        assert dec.row_seeds == (METHODS[name].kind != "sjd" or METHODS[name].row_seeds), name
        if dec.row_seeds:
            with pytest.raises(InputError, match="3 seeds for 2 prompts; pass one seed per prompt"):
                run_method(resolve_method(name), t, d, tables, torch.tensor([1, 5]), seeds=[1, 2, 3], **kw)
        else:
            with pytest.raises(InputError, match=f"the {name} loop has no per-row generators"):
                run_method(resolve_method(name), t, d, tables, torch.tensor([1, 5]), seeds=[1, 2], **kw)


def test_session_setup():
    """open_session: CFG rows and cache rows, the scratch slots, the first logits guided, the dump column."""
    torch.manual_seed(0)
    t = make_target(std=0.3)
    s = SamplingConfig(cfg_scale=2.0, top_k=4)
    plain = S.open_session(t, torch.tensor([1, 5]), sampling=s, seed=0)
    wide = S.open_session(t, torch.tensor([1, 5]), sampling=s, seed=0, extra=40)
    assert plain.B == 2 and plain.cfg and plain.cache.batch == 4 and plain.N == t.config.block_size
    assert wide.cache.max_len >= plain.cache.max_len + 32
    assert plain.out_buf.shape == (2, plain.N + 1) and bool((plain.out == -1).all())
    assert plain.first.shape == (2, t.config.vocab_size) and int(torch.isfinite(plain.first).sum(-1).max()) <= 4
    assert plain.stats.target_forwards == 1 and "target" in plain.timer.totals
    plain.commit(torch.tensor([[7, 8, 9], [4, 5, 6]]), torch.tensor([0, plain.N - 1]), torch.tensor([2, 3]))
    assert plain.out[0, :3].tolist() == [7, 8, -1] and plain.out[1, -1] == 4  # past the image: the dump column
