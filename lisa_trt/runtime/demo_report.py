"""What `lisa-trt demo` shows: a labelled grid, quality with uncertainty, a speed line that explains.

* `labelled_grid`: rows = method, columns = class, tiles enlarged to a readable size, with the
  method names on the left and the class names on top.
* `quality_with_error`: class accuracy with a 95 % Wilson interval and FD-demo with a bootstrap
  standard error; below `INDICATIVE_BELOW` images the numbers are marked "indicative".
* `speed_explanation`: the measured speed-up decomposed into what ran (backend, threads, tree)
  and why it came out that way (accepted tokens per step vs the cost of one verification step).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch

TILE = 128  # px per generated image in the grid (the demo model makes 64 px images)


def labelled_grid(rows: dict, col_labels: Sequence[str], tile: int = TILE, pad: int = 4) -> np.ndarray:
    """rows: {row label: [uint8 (H, W, 3) images, one per column]} -> labelled uint8 (H, W, 3) grid."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default()
    left = 12 + max(int(ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength(r, font=font)) for r in rows)
    top = 22
    ncol = len(col_labels)
    W = left + ncol * (tile + pad) + pad
    H = top + len(rows) * (tile + pad) + pad
    canvas = Image.new("RGB", (W, H), "white")
    draw = ImageDraw.Draw(canvas)
    for c, name in enumerate(col_labels):
        x = left + pad + c * (tile + pad)
        label = name if draw.textlength(name, font=font) <= tile else name[: max(1, tile // 7)] + "."
        draw.text((x + 2, 5), label, fill="black", font=font)
    for r, (label, images) in enumerate(rows.items()):
        y = top + pad + r * (tile + pad)
        draw.text((6, y + tile // 2 - 6), label, fill="black", font=font)
        for c, im in enumerate(images[:ncol]):
            x = left + pad + c * (tile + pad)
            canvas.paste(Image.fromarray(np.asarray(im)).resize((tile, tile), Image.LANCZOS), (x, y))
    return np.asarray(canvas)


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion k / n (sensible for small n and 0 or n hits)."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, centre - half), min(1.0, centre + half))


def quality_with_error(images: torch.Tensor, labels: torch.Tensor, scorer=None, n_boot: int = 100,
                       seed: int = 0) -> dict:
    """Class accuracy (+ Wilson 95 % interval) and FD-demo (+ bootstrap standard error).

    images: (B, 3, H, W) float in [-1, 1] or uint8. FD needs >= MIN_FD_IMAGES images (else NaN).
    """
    from ..demo.scorer import (INDICATIVE_BELOW, MIN_FD_IMAGES, extract, feature_stats, frechet_distance,
                               quality_label, reference_stats)

    if scorer is None:
        from ..demo.registry import load_demo_scorer

        scorer = load_demo_scorer()
    n = int(images.shape[0])
    feats, logits = extract(scorer, images)
    hits = int((logits.argmax(-1) == labels).sum())
    lo, hi = wilson_interval(hits, n)
    out = {"n": n, "class_acc": hits / n, "class_acc_ci95": [lo, hi], "fd_demo": float("nan"), "fd_demo_se": None,
           "indicative": n < INDICATIVE_BELOW, "label": quality_label(n)}
    if n >= MIN_FD_IMAGES:
        mu_r, sig_r = reference_stats(scorer)
        out["fd_demo"] = frechet_distance(*feature_stats(feats), mu_r, sig_r)
        g = np.random.default_rng(seed)
        boots = []
        for _ in range(n_boot):
            idx = torch.from_numpy(g.integers(0, n, n))
            if len(set(idx.tolist())) < 2:
                continue
            try:
                boots.append(frechet_distance(*feature_stats(feats[idx]), mu_r, sig_r))
            except np.linalg.LinAlgError:
                continue
        if len(boots) >= 10:
            out["fd_demo_se"] = float(np.std(boots, ddof=1))
    return out


def format_quality(q: dict) -> str:
    """'class acc 0.88 [0.53, 0.98], FD-demo 41.2 +/- 6.3 (indicative: 8 images ...)'."""
    lo, hi = q["class_acc_ci95"]
    fd = "FD-demo n/a" if math.isnan(q["fd_demo"]) else (
        f"FD-demo {q['fd_demo']:.1f}" + (f" +/- {q['fd_demo_se']:.1f}" if q["fd_demo_se"] is not None else ""))
    return f"class acc {q['class_acc']:.2f} [95% CI {lo:.2f}-{hi:.2f}], {fd} ({q['label']})"


def speed_explanation(vanilla: dict, lisa: dict, *, verify: str, backend: str, threads: int,
                      tree: Optional[dict] = None, tokens_per_image: int = 256) -> list[str]:
    """Lines that say what ran and why the speed-up is what it is.

    vanilla / lisa: {"seconds_per_image", "mal", "target_forwards" (per image)}. One LISA step
    verifies a draft tree and accepts MAL tokens on average; speed-up = MAL / (cost of a LISA
    step relative to one vanilla token step), which is how the two numbers are decomposed here.
    """
    sv, sl = vanilla["seconds_per_image"], lisa["seconds_per_image"]
    speedup = sv / sl if sl > 0 else float("nan")
    mal = lisa.get("mal", float("nan"))
    steps = lisa.get("target_forwards") or (tokens_per_image / mal if mal and mal > 0 else float("nan"))
    step_cost = (sl / steps) / (sv / tokens_per_image) if steps and sv > 0 else float("nan")
    t = tree or {}
    tree_txt = (f"draft tree: top-k {t.get('top_k')}, depth {t.get('depth')}, {t.get('total_tokens')} nodes "
                "(the budget recorded at export for this backend)") if t else "draft tree: the export's default"
    lines = [f"what ran: vanilla and LISA ({verify}) on the same prompts and seeds, through {backend.upper()} "
             f"with {threads} CPU thread(s); vanilla = one target forward per token, LISA = drafter proposes a "
             f"tree, the target verifies it in one forward, GASV accepts tokens; {tree_txt}",
             f"speed: vanilla {sv:.2f} s/image, LISA {sl:.2f} s/image -> speed-up {speedup:.2f}x "
             f"= {mal:.2f} tokens accepted per step / {step_cost:.2f}x the time of a vanilla step"]
    if speedup < 1.0:
        lines.append("why slower: on this CPU one LISA step (drafting + verifying the tree + host work) costs "
                     f"{step_cost:.2f}x a single-token step, more than the {mal:.2f} tokens it accepts; on a GPU "
                     "verifying a small tree costs about one token step, which is where LISA pays off")
    else:
        lines.append(f"why faster: each step accepts {mal:.2f} tokens for {step_cost:.2f}x the cost of one")
    return lines
