"""`lisa-trt run`: an exported engine directory (runtime/pipeline.py), PNGs and per-image stats."""

from __future__ import annotations



def run(rc, *, prompts, out_dir, overwrite, threads, encoder_dir, gpu, memory_gib, echo, negative_prompt=None, **_):
    """The memory plan checked, then Pipeline over the bundle's engines, one decode per prompt;
    writes the images and stats. The bundle's Manifest and family are the RunContext's (parsed and
    resolved once by `resolve`), handed to the preflight, the prompts precheck and the Pipeline.
    negative_prompt: Pipeline.generate's, for every prompt."""
    from ...deploy.memory_plan import preflight
    from ...engines.trt_plans import engines_built
    from ...validation import check_out_dir
    from ..conditions import precheck_prompts
    from ..outputs import save_run
    from ..pipeline import Pipeline

    engine_dir, backend, s, man = rc.given["model"], rc.backend, rc.given["sampling"], rc.manifest
    gpu_backend = backend == "trt" or (backend == "auto" and engines_built(engine_dir, man))
    preflight(engine_dir, gpu=gpu, memory_gib=memory_gib, gpu_backend=gpu_backend, batch=1,
              tree=rc.given["tree"]["tree_tokens"], cfg_scale=s["cfg_scale"], manifest=man)  # one prompt per call
    check_out_dir(out_dir, overwrite=overwrite)
    if negative_prompt is not None:  # refused (naming why) before any engine loads
        from ..conditions import run_conditions

        conds = run_conditions(rc.family, man.target_config)
        conds.negatives(negative_prompt, 1)
        conds.precheck_negative(man.target_config, encoder_dir)  # a caption bundle's needs its encoder
    # t2i: prompts + encoder checked before engines load
    precheck_prompts(rc.source, prompts, encoder_dir, manifest=man, family=rc.family)
    pipe = Pipeline.from_dir(rc.source, backend=rc.backend, threads=threads, text_encoder=encoder_dir,
                             manifest=man, family=rc.family)
    ps = pipe.conditions.parse_file(prompts, pipe.class_names)  # the prompts file in its kind's line format
    if rc.method is None:
        echo(f"verify auto: {pipe.resolve_verify(rc.verify)[2]}")
    res = pipe.generate(ps, seed=rc.seed, verify=rc.method or rc.verify, cfg_scale=s["cfg_scale"],
                        temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"], greedy=s["greedy"],
                        progress=True, negative_prompt=negative_prompt, **rc.given["tree"],
                        **rc.given["knobs"])
    verify = res.stats[0]["verify"] if res.stats else rc.verify  # what "auto" ran
    mal = sum(st["mal"] for st in res.stats) / len(res.stats)
    secs = sum(st["seconds"] for st in res.stats)
    out = save_run(out_dir, res, ps, {"family": pipe.family.name, "backend": pipe.backend, "verify": verify,
                                      "mal": mal, "seconds": secs, "images": res.stats}, overwrite=overwrite)
    echo(f"{len(res.images)} images -> {out} ({pipe.backend}, {verify}): mean MAL {mal:.2f}, {secs:.2f} s")
