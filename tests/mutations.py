"""Mutation check (issue 53): does the suite catch realistic single-line bugs?

Each mutation plants one bug (one exact snippet of one file replaced) in a temporary copy of the
repository (lisa_trt/, tests/ and what the tests read: pyproject.toml, README.md, docs/, bench/,
scripts/; the real tree is never written) and runs that mutation's tests there
(`pytest -n 0 -x -q`, one timeout per mutant). A mutant is CAUGHT when its tests fail, MISSED
when they pass. The unmutated copy runs each distinct test selection first (the baseline): a
selection that fails without any bug makes its mutants' results meaningless, and is reported so.

A mutation whose snippet is not found exactly once in its file is refused before anything runs
(the code moved: update the list), so the list stays honest as the code changes.

    python tests/mutations.py --list
    python tests/mutations.py --only openai_size_hxw,plan_kv_per_copy --json bench/mutations.json
    python tests/mutations.py              # every mutation (long: run it before resolving an issue
                                           # that touches verification, the KV path, the plan or serving)

Not a test module (no test_ prefix: pytest does not collect it); its list is checked by
tests/test_no_vacuous.py (every snippet found exactly once).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("lisa_trt", "tests", "docs", "bench", "scripts", "pyproject.toml", "README.md")


@dataclass(frozen=True)
class Mutation:
    name: str
    area: str
    file: str  # relative to the repository root
    original: str  # an exact snippet, found exactly once in `file`
    replacement: str
    tests: tuple  # pytest arguments: test files / node ids, optionally "-k EXPR"
    why: str = ""


def M(name, area, file, original, replacement, tests, why=""):
    return Mutation(name, area, file, original, replacement, tuple(tests), why)


MUTATIONS = [
    # -- the five the previous wave missed (issue 53)
    M("rows_attention_fp16_scores", "KV attention", "lisa_trt/models/layers.py",
      "scores = (qg @ k_all.transpose(-1, -2)).float()  # BMM1, then fp32", "scores = qg @ k_all.transpose(-1, -2)",
      ["tests/engines/test_fused_attention.py", "tests/engines/test_ort.py", "tests/engines/test_kv_rows.py"],
      "scores / softmax in fp16 (no fp32 cast)"),
    M("openai_size_hxw", "OpenAI front end", "lisa_trt/serve/openai_request.py",
      'return f"{self.width}x{self.height}"', 'return f"{self.height}x{self.width}"',
      ["tests/serve/test_openai.py"], "a bundle's size reported as HxW"),
    M("plan_kv_per_copy", "memory plan", "lisa_trt/deploy/memory_plan.py",
      '"kv_cache": kv, "activations": act if built', '"kv_cache": kv * copies, "activations": act if built',
      ["tests/deploy/test_plan_two_copies.py", "tests/engines/test_plan.py"], "the target's KV once per weight copy"),
    M("choose_attention_inverted", "attention probe", "lisa_trt/deploy/attention_probe.py",
      'return {g: ("unfused" if g in refused else "fused") if kinds[g] == {"pattern"} else',
      'return {g: ("fused" if g in refused else "unfused") if kinds[g] == {"pattern"} else',
      ["tests/engines/test_fused_attention.py", "tests/engines/test_attention_ops.py"],
      "--attention auto with its decision inverted"),
    M("to_sub_any_draft_forced", "forced tokens", "lisa_trt/models/family.py",
      "torch.where((forced >= 0) & (tokens == forced), self.K,", "torch.where(forced >= 0, self.K,",
      ["tests/speculative/test_forced_tokens.py"], "any draft at a forced position counted as the forced token"),
    # -- weak spots named with them
    M("sjd_pac_rejected_sibling_kept", "Jacobi decoders", "lisa_trt/speculative/sjd_pac.py",
      "q = torch.where(live[:, None], q.scatter(1, xc, 0.0), q)", "q = torch.where(acc[:, None], q.scatter(1, xc, 0.0), q)",
      ["tests/speculative/test_sjd_pac.py", "-k", "recursive"], "a rejected sibling left in the draft law"),
    M("grpc_stream_not_cancelled", "OpenAI front end", "lisa_trt/serve/openai_api.py",
      "                responses.cancel()", "                pass",
      ["tests/serve/test_openai_disconnect.py"], "a stream given up before its final response is not cancelled"),
    M("context_memory_summed", "memory plan", "lisa_trt/engines/allocation.py",
      "return max(sizes) if shared else", "return sum(sizes) if shared else",
      ["tests/deploy/test_plan_two_copies.py"], "shared context memory as the sum of the profiles"),
    M("drafter_kv_short", "memory plan", "lisa_trt/deploy/memory_plan.py",
      'dims = {"batch": rows, "draft_heads": heads, "cache_len": L,',
      'dims = {"batch": rows, "draft_heads": heads, "cache_len": L - tree,',
      ["tests/deploy/test_plan_two_copies.py"], "the drafter's cache planned without the tree's slots"),
    M("plan_weights_once", "memory plan", "lisa_trt/deploy/memory_plan.py",
      '"weights": s.target.bytes(prec) * copies,', '"weights": s.target.bytes(prec),',
      ["tests/deploy/test_plan_two_copies.py", "tests/engines/test_plan.py"], "two weight copies counted once"),
    M("plan_io_one_buffer", "memory plan", "lisa_trt/engines/allocation.py",
      "return sum(pool_depth(t.name, spec.graph.value) * cap[t.name]", "return sum(cap[t.name]",
      ["tests/deploy/test_plan_is_the_allocation_list.py"], "engine outputs planned one buffer each"),
    # -- the new-rows KV commit and attention
    M("kv_commit_off_by_one", "KV commit", "lisa_trt/engines/graph.py",
      "slots.to(cache.k[0].device))", "(slots + 1).to(cache.k[0].device))",
      ["tests/engines/test_kv_rows.py"], "new rows committed one slot late"),
    M("rows_attention_stale_slots", "KV attention", "lisa_trt/models/layers.py",
      "m_cache = mask & ~fresh[:, None, None, :]", "m_cache = mask",
      ["tests/engines/test_kv_rows.py", "tests/models/test_with_mask.py"], "stale cache rows at the new slots attended"),
    M("rows_attention_drops_new_rows", "KV attention", "lisa_trt/models/layers.py",
      "v_all = torch.cat([vc, vn], dim=2).to(q.dtype)", "v_all = torch.cat([vc, vn * 0], dim=2).to(q.dtype)",
      ["tests/engines/test_kv_rows.py", "tests/models/test_with_mask.py"], "the new rows' values left out"),
    # -- forced tokens
    M("law_forced_not_one_hot", "forced tokens", "lisa_trt/models/family.py",
      "return torch.where((f >= 0)[..., None], one_hot, logits)", "return logits",
      ["tests/speculative/test_forced_tokens.py", "tests/families/test_emu3_seams.py"], "forced positions sampled"),
    M("from_sub_off_by_one", "forced tokens", "lisa_trt/models/family.py",
      "return torch.where(sub < self.K, ids[", "return torch.where(sub <= self.K, ids[",
      ["tests/speculative/test_forced_tokens.py"], "index K mapped to a code instead of the forced token"),
    # -- seeding
    M("image_seeds_all_equal", "seeding", "lisa_trt/runtime/seeding.py",
      "else int(seed) + int(index)", "else int(seed)",
      ["tests/serve/test_openai.py", "-k", "same_seed"], "every image of a request with the same seed"),
    M("row_generators_shared_seed", "seeding", "lisa_trt/speculative/sampling.py",
      "else [make_generator(int(s), device) for s in seeds]", "else [make_generator(int(seeds[0]), device) for s in seeds]",
      ["tests/serve/test_row_seeds.py"], "every row of a batch drawn with the first row's seed"),
    # -- the OpenAI front end
    M("openai_seed_range_ignores_n", "OpenAI front end", "lisa_trt/serve/openai_request.py",
      "if not 0 <= seed <= _SEED_MAX - n:", "if not 0 <= seed <= _SEED_MAX:",
      ["tests/serve/test_openai.py", "-k", "bad_requests or seed"], "seed + n - 1 may pass the largest seed"),
    M("openai_n_above_max_batch", "OpenAI front end", "lisa_trt/serve/openai_request.py",
      "if not 1 <= n <= info.max_batch:", "if not 1 <= n <= info.max_batch + 1:",
      ["tests/serve/test_openai.py", "-k", "bad_requests"], "n one above --max-batch accepted"),
    M("openai_usage_mal_max", "OpenAI front end", "lisa_trt/serve/openai_images.py",
      '"mal": round(sum(float(s["mal"]) for s in stats) / max(n, 1), 4),',
      '"mal": round(max(float(s["mal"]) for s in stats), 4),',
      ["tests/serve/test_openai.py", "-k", "same_seed"], "usage MAL the best row's, not the mean"),
    # -- parser checks
    M("parser_cast_any_dtype", "parser checks", "lisa_trt/engines/parser_checks.py",
      "return [] if to in TRT_DTYPES else", "return [] if True else",
      ["tests/engines/test_parser_checks.py", "tests/deploy/test_parser_checkers.py"], "Cast to any type passes"),
    M("parser_lp_norm_p3", "parser checks", "lisa_trt/engines/parser_checks.py",
      'return [] if int(a.get("p", 2)) in (1, 2) else', 'return [] if int(a.get("p", 2)) in (1, 2, 3) else',
      ["tests/engines/test_parser_checks.py", "tests/deploy/test_parser_checkers.py"], "LpNormalization p=3 passes"),
    # -- the Jacobi decoders
    M("sjd_accept_no_cumprod", "Jacobi decoders", "lisa_trt/speculative/verify.py",
      "accept_len = (u < a).long().cumprod(-1).sum(-1)", "accept_len = (u < a).long().sum(-1)",
      ["tests/speculative/test_verify.py", "tests/speculative/test_mcsjd.py"], "drafts after a rejection accepted"),
    M("jacobi_residual_abs", "Jacobi decoders", "lisa_trt/speculative/verify.py",
      "resid = (p_now - p_prev).clamp(min=0.0)", "resid = (p_now - p_prev).abs()",
      ["tests/speculative/test_verify.py", "tests/speculative/test_sjd_pac.py"], "residual |p - q| instead of max(0, p - q)"),
    M("ratio_accept_zero_over_zero", "Jacobi decoders", "lisa_trt/speculative/verify.py",
      "(x_now > 0).float())", "(x_now >= 0).float())",
      ["tests/speculative/test_verify.py", "tests/speculative/test_sjd_pac.py"], "0 / 0 accepted"),
    M("zipar_row1_waits_window", "Jacobi decoders", "lisa_trt/speculative/zipar.py",
      "need = length[r - 1] if r == 1 else min(window, length[r - 1])", "need = min(window, length[r - 1])",
      ["tests/speculative/test_zipar.py"], "row 1 starts after `window` tokens of row 0"),
    # -- Emu3
    M("emu3_row_end_column", "Emu3", "lisa_trt/families/emu3/layout.py",
      "rows[:, w] = eol", "rows[:, w - 1] = eol",
      ["tests/families/test_emu3_seams.py", "tests/families/test_emu3.py"], "the row end forced on the last code"),
    M("emu3_null_prompt_first_token", "Emu3", "lisa_trt/families/emu3/cfg.py",
      "return Prompts(p.ids[:, -1:].clone(), torch.ones_like(p.ids[:, -1:], dtype=torch.bool))",
      "return Prompts(p.ids[:, :1].clone(), torch.ones_like(p.ids[:, :1], dtype=torch.bool))",
      ["tests/families/test_emu3.py"], "CFG's unconditional row from the first prompt token"),
    M("sjd_gasv_checks_every_step", "Jacobi decoders", "lisa_trt/speculative/sjd_gasv.py",
      "check_inputs=debug_checks())", "check_inputs=True)",
      ["tests/speculative/test_step_budget_jacobi.py", "-k", "sjd-gasv"],
      "the GASV logits check (3 host reads) back in every Jacobi step"),
    M("zipar_pads_on_a_live_slot", "Jacobi decoders", "lisa_trt/speculative/zipar.py",
      "[(N, 0, -1)] * (S - len(st))", "[(0, 0, -1)] * (S - len(st))",
      ["tests/speculative/test_zipar.py", "-k", "pads"], "ZipAR's pads written over image index 0's K/V"),
    # -- 2-D heads (SSD) and pjd-ssd2d (issue 54)
    M("head2d_reads_next_hidden", "2-D heads", "lisa_trt/train/ssd.py",
      "out.append((j[ok] + 1, dst[ok]))", "out.append((j[ok], dst[ok]))",
      ["tests/train/test_ssd_arch.py"], "a head reads the hidden state of the token before"),
    M("head2d_below_off_by_one", "2-D heads", "lisa_trt/train/ssd.py",
      "dst = j + cfg.delta(k)", "dst = j + cfg.delta(k) - 1",
      ["tests/train/test_ssd_arch.py"], "the below head taught the token left of the one below"),
    M("ssd2d_records_shifted_hidden", "2-D heads", "lisa_trt/speculative/ssd.py",
      "col = n[..., None] - 1 + torch.arange(K1, device=n.device)", "col = n[..., None] + torch.arange(K1, device=n.device)",
      ["tests/speculative/test_ssd.py"], "pjd-ssd2d records each hidden state one column off"),
    # -- issue 49: the steady tree step's glue-op ceiling (c49glue)
    M("draft_round_extra_copy", "Step budget", "lisa_trt/speculative/decode.py",
      'h_in = fr.gather_parents(hist["h"], req.parent_slot)', 'h_in = fr.gather_parents(hist["h"].clone(), req.parent_slot)',
      ["tests/speculative/test_step_budget.py", "-k", "measured"], "one glue op more per expansion round"),
    M("verify_mask_rebuilt_per_step", "Step budget", "lisa_trt/speculative/decode.py",
      "mask = _fresh_rows_mask(tc.visible(), slots, tree.ancestors, G)",
      "mask = tc.attention_mask(slots, guide.dup(tree.ancestors))",
      ["tests/speculative/test_batched_rules.py", "-k", "ceiling"], "the verify mask built as before (zeros, scatter, or, dup)"),
    # -- two dimensions (issue 54)
    M("pjd_gasv_mass_not_lent", "2-D decoders", "lisa_trt/speculative/pjd.py",
      "acc = acc if moved is None else (acc + moved).clamp(max=1.0)", "acc = acc",
      ["tests/speculative/test_twod_pjd_gasv.py"], "pjd-gasv-2d accepts with PJD's plain test (GASV's mass ignored)"),
    M("pjd_mask_sees_the_row_below", "2-D decoders", "lisa_trt/speculative/pjd.py",
      "above = row_i[None, None, :] < q_row[:, :, None]", "above = row_i[None, None, :] <= q_row[:, :, None] + 1",
      ["tests/speculative/test_pjd.py", "tests/speculative/test_twod_pjd_gasv.py"],
      "a query reads the decoded tokens of the row below its own"),
    # -- engine calls per step (issue 49 item 4)
    M("drafter_commit_two_calls", "engine calls", "lisa_trt/engines/graph.py",
      "runner = self._fused if self._fused is not None else self._commit",
      "runner = None  # the commit through project_taps + drafter_fused: one engine call more",
      ["tests/engines/test_engine_calls.py"], "a drafter commit of two engine calls with drafter_fused open"),
]


def check_snippets(muts, root: Path = ROOT) -> list:
    """Problems with the list (empty when every snippet is found exactly once and names are unique)."""
    problems, names = [], set()
    for m in muts:
        if m.name in names:
            problems.append(f"{m.name}: the name is used twice")
        names.add(m.name)
        path = root / m.file
        if not path.is_file():
            problems.append(f"{m.name}: {m.file} does not exist")
            continue
        n = path.read_text().count(m.original)
        if n != 1:
            problems.append(f"{m.name}: the snippet {m.original!r} is found {n} times in {m.file} (must be once: "
                            "update the mutation to the current code)")
        if m.original == m.replacement:
            problems.append(f"{m.name}: the replacement equals the original")
    return problems


def _copy(dst: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dst / name)


def _pytest(tmp: Path, tests, timeout: float) -> tuple:
    """(returncode or 'timeout', seconds, output tail) of the tests in the copy."""
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-x", "-q", *tests]
    env = dict(os.environ, PYTHONPATH=str(tmp), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        return r.returncode, time.monotonic() - t0, (r.stdout + r.stderr)[-1500:]
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        return "timeout", time.monotonic() - t0, (out.decode(errors="replace") if isinstance(out, bytes) else out)[-1500:]


def verdict(rc) -> str:
    """pytest's exit status -> caught (tests failed), missed (they passed), or why neither."""
    return {0: "missed", 1: "caught", 5: "no tests ran", "timeout": "timeout"}.get(rc, f"error (rc {rc})")


def _echo(*a):
    print(*a, flush=True)


def run(muts, timeout: float, baseline: bool = True, echo=_echo) -> dict:
    with tempfile.TemporaryDirectory(prefix="lisa_mut_") as d:
        tmp = Path(d)
        _copy(tmp)
        base = {}
        if baseline:
            for tests in dict.fromkeys(m.tests for m in muts):
                rc, secs, tail = _pytest(tmp, tests, timeout)
                base[tests] = {"result": "pass" if rc == 0 else verdict(rc), "seconds": round(secs, 1)}
                echo(f"baseline {' '.join(tests)}: {base[tests]['result']} ({secs:.0f} s)")
                if rc != 0:
                    echo(tail)
        rows = []
        for m in muts:
            path = tmp / m.file
            text = path.read_text()
            path.write_text(text.replace(m.original, m.replacement, 1))
            try:
                if baseline and base[m.tests]["result"] != "pass":
                    rc, secs, tail = "baseline failed", 0.0, ""
                    result = "not run (baseline failed)"
                else:
                    rc, secs, tail = _pytest(tmp, m.tests, timeout)
                    result = verdict(rc)
            finally:
                path.write_text(text)
            rows.append({**asdict(m), "tests": list(m.tests), "result": result, "seconds": round(secs, 1),
                         "output_tail": tail if result != "caught" else tail[-400:]})
            echo(f"{m.name:34s} {result:10s} {secs:6.0f} s  {m.area}")
    caught = sum(r["result"] == "caught" for r in rows)
    return {"caught": caught, "total": len(rows), "missed": [r["name"] for r in rows if r["result"] == "missed"],
            "other": {r["name"]: r["result"] for r in rows if r["result"] not in ("caught", "missed")},
            "baseline": {" ".join(k): v for k, v in base.items()}, "timeout_s": timeout, "mutations": rows}


def table(report: dict) -> str:
    lines = ["| mutation | area | result | seconds | tests |", "|---|---|---|---|---|"]
    for r in report["mutations"]:
        lines.append(f"| {r['name']} | {r['area']} | {r['result']} | {r['seconds']} | {' '.join(r['tests'])} |")
    lines.append(f"\n{report['caught']} of {report['total']} caught; missed: {', '.join(report['missed']) or 'none'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated mutation names (default: all)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run (default 900)")
    ap.add_argument("--json", type=Path, help="write the report here (e.g. bench/mutations.json)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated runs of each test selection")
    ap.add_argument("--list", action="store_true", help="list the mutations and check their snippets; run nothing")
    args = ap.parse_args(argv)
    muts = MUTATIONS
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(names) - {m.name for m in MUTATIONS})
        if unknown:
            raise SystemExit(f"unknown mutation(s): {', '.join(unknown)}; valid: {', '.join(m.name for m in MUTATIONS)}")
        muts = [m for m in MUTATIONS if m.name in names]
    problems = check_snippets(muts)
    if problems:
        raise SystemExit("refusing to run: " + "; ".join(problems))
    if args.list:
        for m in muts:
            print(f"{m.name:34s} {m.area:18s} {m.file}  ({m.why})")
        return 0
    report = run(muts, args.timeout, baseline=not args.no_baseline)
    report["command"] = "python tests/mutations.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(table(report))
    if args.json:
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(args.json)  # atomic
    return 0


if __name__ == "__main__":
    sys.exit(main())
