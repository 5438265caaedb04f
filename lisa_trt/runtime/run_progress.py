"""`lisa-trt run`'s images written as each finishes, so an interrupted run keeps them and
`--resume` finishes the rest.

    OUT/img_NNNN_lineL.png      each image as soon as it is decoded (atomic)
    OUT/.partial/run.json       what the run is (bundle, prompts file, seeds, settings): a resume
                                must be the same run, else it is refused naming what differs
    OUT/.partial/NNNN.json/.npy the image's stats and tokens until the run completes
    OUT/tokens.npy, stats.json  written when every image is there; .partial/ is then removed

Every prompt carries its own seed (runtime/seeding.py: its own, else base + its index), so an
image decoded on resume is the one the uninterrupted run would have made.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from ..errors import InputError
from ..io import atomic_write, write_json

PARTIAL = ".partial"


def run_key(engine_dir, prompts_file, seed: int, settings: dict) -> dict:
    """What makes two `run`s the same run: the bundle, the prompts file's bytes, seed and settings."""
    data = Path(prompts_file).read_bytes()
    return {"engine_dir": str(Path(engine_dir).resolve()), "prompts_sha256": hashlib.sha256(data).hexdigest(),
            "seed": int(seed), "settings": json.loads(json.dumps(settings, default=str))}


def check_run_out(out, *, resume: bool, overwrite: bool) -> None:
    """OUT's checks before any work: new or empty (or --overwrite), or with --resume a partial run
    (or nothing yet); a finished run is not resumed."""
    from ..validation import check_out_dir

    out = Path(out)
    if resume and (out / PARTIAL / "run.json").is_file():
        return
    if resume and (out / "stats.json").is_file():
        raise InputError(f"--resume: {out} holds a finished run (stats.json); nothing to resume")
    check_out_dir(out, overwrite=overwrite)


class RunProgress:
    """The finished images of one `run` in `out` (see the module docstring)."""

    def __init__(self, out, key: dict, *, resume: bool, overwrite: bool):
        from ..validation import clear_previous_outputs

        self.out, self.part = Path(out), Path(out) / PARTIAL
        check_run_out(out, resume=resume, overwrite=overwrite)
        if resume and (self.part / "run.json").is_file():
            self._check_same(json.loads((self.part / "run.json").read_text()), key)
        else:
            if overwrite:
                clear_previous_outputs(self.out)
                shutil.rmtree(self.part, ignore_errors=True)
            self.part.mkdir(parents=True, exist_ok=True)
            write_json(self.part / "run.json", key)
        self.done = {int(p.stem) for p in self.part.glob("[0-9]*.json")}

    def _check_same(self, had: dict, key: dict) -> None:
        diff = [k for k in key if had.get(k) != key[k]]
        if diff:
            raise InputError(f"--resume: {self.out} holds a run with another {', '.join(diff)} "
                             f"({', '.join(f'{k}: {had.get(k)!r}' for k in diff)}); resume it with the same bundle, "
                             "prompts file, seed and settings, or choose a new --out")

    def save(self, i: int, prompt, result) -> None:
        """Image i (a one-image GenerationResult) as soon as it is decoded: PNG, stats, tokens."""
        import numpy as np

        from ..imaging import save_png

        save_png(np.asarray(result.images[0]), self.out / f"img_{i:04d}_line{prompt.line}.png")
        toks = result.codes if getattr(result, "codes", None) is not None else result.tokens
        with atomic_write(self.part / f"{i:04d}.npy") as tmp:
            with open(tmp, "wb") as f:
                np.save(f, toks.cpu().numpy())
        write_json(self.part / f"{i:04d}.json", result.stats[0])  # last: it marks the image done
        self.done.add(i)

    def image_stats(self, n: int) -> list:
        """Every image's stats, in prompt order."""
        return [json.loads((self.part / f"{i:04d}.json").read_text()) for i in range(n)]

    def finish(self, n: int, record: dict) -> Path:
        """tokens.npy and stats.json (`record` + every image's stats, in prompt order); .partial removed."""
        import numpy as np

        stats = self.image_stats(n)
        toks = np.concatenate([np.load(self.part / f"{i:04d}.npy") for i in range(n)])
        with atomic_write(self.out / "tokens.npy") as tmp:
            with open(tmp, "wb") as f:
                np.save(f, toks)
        write_json(self.out / "stats.json", {**record, "images": stats})
        shutil.rmtree(self.part, ignore_errors=True)
        return self.out
