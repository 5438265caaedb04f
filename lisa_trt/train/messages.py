"""Human-readable training messages: the resume hint after Ctrl-C and the held-out evaluation."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence


def last_checkpoint_step(out_dir) -> Optional[int]:
    """Step of the latest checkpoint in a run directory (checkpoints/latest.json), or None."""
    latest = Path(out_dir) / "checkpoints" / "latest.json"
    try:
        return int(json.loads(latest.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resume_hint(out_dir, total_steps: Optional[int] = None, argv: Optional[Sequence[str]] = None) -> str:
    """What an interrupted `lisa-trt train` kept and the exact command that resumes it."""
    step = last_checkpoint_step(out_dir)
    cmd = " ".join(shlex.quote(a) for a in (argv if argv is not None else ["lisa-trt", *sys.argv[1:]]))
    of = f" of {total_steps}" if total_steps else ""
    if step is None:
        return (f"training interrupted before the first checkpoint; nothing to resume in {out_dir}. "
                f"Run the same command to start again (use --checkpoint-every N for earlier checkpoints):\n  {cmd}")
    return (f"training interrupted; the last checkpoint is step {step}{of} in {Path(out_dir) / 'checkpoints'}. "
            f"Resume from step {step} with the same command and settings:\n  {cmd}")


def format_eval(ev: dict) -> str:
    """The trainer's held-out MAL-proxy evaluation (evaluate_mal_proxy), or the Medusa heads' per-head
    agreement (train/medusa.evaluate_heads), as one readable paragraph."""
    if not ev or not ev.get("sequences", 1):
        return "held-out evaluation: skipped (no held-out sequences)"
    if "accept_h" in ev:
        acc = " ".join(f"{a:.2f}" for a in ev["accept_h"])
        top = " ".join(f"{a:.2f}" for a in ev.get("top1_h", []))
        return (f"held-out evaluation ({ev['sequences']} sequences, {len(ev['accept_h'])} Medusa heads):\n"
                f"  acceptance of head 1..{len(ev['accept_h'])}: {acc}   (top-1 agreement: {top})")
    acc = " ".join(f"{a:.2f}" for a in ev.get("accept_s", []))
    top = " ".join(f"{a:.2f}" for a in ev.get("top1_s", []))
    return (f"held-out evaluation ({ev.get('sequences', '?')} sequences, draft depth {ev.get('depth', '?')}):\n"
            f"  expected accepted length per step: {ev.get('mal_proxy', float('nan')):.2f} (sampled drafts), "
            f"{ev.get('mal_top1', float('nan')):.2f} (greedy drafts); 1.00 = no speed-up\n"
            f"  acceptance at draft step 1..{len(ev.get('accept_s', []))}: {acc}   (top-1 agreement: {top})")
