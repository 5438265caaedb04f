"""`lisa-trt run`: an exported engine directory (runtime/pipeline.py), PNGs and per-image stats."""

from __future__ import annotations



def run(rc, *, prompts, out_dir, overwrite, threads, encoder_dir, gpu, memory_gib, echo, negative_prompt=None,
        resume=False, **_):
    """The memory plan checked, then Pipeline over the bundle's engines, one decode per prompt under
    one plan (`RunContext.settle`: resolved once, handed to every Pipeline.generate call); each image
    written as it finishes (runtime/run_progress.py: an interrupted run keeps them, `resume` skips
    them), then the stats. The bundle's Manifest, family and conditions adapter are the RunContext's
    (parsed, looked up and built once by `resolve`), handed to the preflight, the prompts precheck
    and the Pipeline. negative_prompt: Pipeline.generate's, for every prompt."""
    from ...deploy.memory_plan import preflight
    from ...engines.trt_plans import engines_built
    from ...validation import probe_writable_dir
    from ..pipeline import Pipeline
    from ..run_progress import check_run_out

    engine_dir, backend, s, man = rc.given["model"], rc.backend, rc.given["sampling"], rc.manifest
    if man is None:  # not a readable bundle: the reader says why, before any work
        from pathlib import Path

        from ...export.manifest import read_manifest

        read_manifest(Path(rc.source))
    gpu_backend = backend == "trt" or (backend == "auto" and engines_built(engine_dir, man))
    preflight(engine_dir, gpu=gpu, memory_gib=memory_gib, gpu_backend=gpu_backend, batch=1,
              tree=rc.given["tree"]["tree_tokens"], cfg_scale=s["cfg_scale"], manifest=man)  # one prompt per call
    probe_writable_dir(out_dir, "--out directory")
    check_run_out(out_dir, resume=resume, overwrite=overwrite)  # before any work
    conds = rc.conditions  # the bundle's kind, built once by resolve; the Pipeline takes it
    if negative_prompt is not None:  # refused (naming why) before any engine loads
        conds.negatives(negative_prompt, 1)
        conds.precheck_negative(man.target_config, encoder_dir)  # a caption bundle's needs its encoder
    conds.precheck_file(prompts, man.target_config, encoder_dir)  # t2i: prompts + encoder before engines load
    pipe = Pipeline.from_dir(rc.source, backend=rc.backend, threads=threads, text_encoder=encoder_dir,
                             manifest=man, family=rc.family, conditions=conds)
    ps = _seeded(pipe.conditions.parse_file(prompts, pipe.class_names), rc.seed)  # the prompts file, its kind's format
    prog = _progress(rc, prompts, out_dir, resume=resume, overwrite=overwrite, negative_prompt=negative_prompt)
    plan = rc.settle(pipe)  # the one plan of every prompt: "auto" settled, the bundle's sampling and tree
    if rc.method is None:
        echo(f"verify auto: {plan.why}")
    todo = [i for i in range(len(ps)) if i not in prog.done]
    if prog.done:
        echo(f"resuming: {len(prog.done)} of {len(ps)} images already in {out_dir}; decoding {len(todo)}")
    _decode_each(pipe, ps, todo, prog, plan, negative_prompt, echo, out_dir)
    images = prog.image_stats(len(ps))
    verify = images[0]["verify"] if images else plan.method.name  # what "auto" ran
    mal = sum(st["mal"] for st in images) / len(images)
    secs = sum(st["seconds"] for st in images)
    prog.finish(len(ps), {"family": pipe.family.name, "backend": pipe.backend, "verify": verify, "mal": mal,
                          "seconds": secs})
    echo(f"{len(ps)} images -> {out_dir} ({pipe.backend}, {verify}): mean MAL {mal:.2f}, {secs:.2f} s")


def _progress(rc, prompts, out_dir, **kw):
    from ..run_progress import RunProgress, run_key

    settings = {"verify": rc.verify, "sampling": rc.given["sampling"], "tree": rc.given["tree"],
                "knobs": rc.given["knobs"], "negative_prompt": kw.pop("negative_prompt")}
    return RunProgress(out_dir, run_key(rc.given["model"], prompts, rc.seed, settings), **kw)


def _seeded(prompts, seed: int) -> list:
    """Every prompt with its own seed (runtime/seeding.py), so each decodes alone as in one request."""
    import dataclasses

    from ..seeding import image_seed

    return [dataclasses.replace(p, seed=image_seed(seed, i, p.seed)) for i, p in enumerate(prompts)]


def _decode_each(pipe, ps, todo, prog, plan, negative_prompt, echo, out_dir) -> None:
    """Decode the prompts `todo` one by one under the run's one `plan`, each saved as it finishes;
    Ctrl-C keeps those."""
    from ...progress import progress_bar

    bar = progress_bar(len(todo), True, unit="image")
    try:
        for i in todo:
            res = pipe.generate([ps[i]], plan=plan, negative_prompt=negative_prompt)
            prog.save(i, ps[i], res)
            bar.update(1)
    except KeyboardInterrupt:
        bar.close()
        import sys

        print(f"interrupted: {len(prog.done)} of {len(ps)} images kept in {out_dir}; the same command with "
              "--resume decodes the rest", file=sys.stderr)  # shown at every log level
        raise
    bar.close()
