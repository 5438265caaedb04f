"""Issue 26: bundle bytes vs distinct weight bytes, export and ONNX Runtime `run` peak RSS.

Measures engine directories that are already exported (by `lisa-trt export`, under
`/usr/bin/time -v` when export peak RSS is wanted) and runs `lisa-trt run --backend ort`
(vanilla decoding, one image, CFG as recorded in the bundle) under `/usr/bin/time -v` on each:

    python bench/memory.py --label gptl --fp32-weights 1371000000 \\
        before-fp32=DIR:EXPORT_TIME_LOG after-fp32=DIR:EXPORT_TIME_LOG ... --json bench/memory.json

`--run LABEL,...` chooses which bundles get an ORT `lisa-trt run` (needs a VQ decoder in the
bundle); `--decode LABEL,LABEL+one-copy` runs the target-only probe instead (load, CFG prefill,
`--steps` sampled tokens through GraphTarget, batch 2), default or one-copy ORT mode; `--src LABEL=PYTHONPATH`
runs the `run` of that bundle with another checkout (e.g. the code before the change, for a
bundle in the old layout). Every row records machine, load and date.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # this checkout's lisa_trt (the subprocesses get it via PYTHONPATH)


def bundle_bytes(d: Path) -> dict:
    """Bytes of every file of an engine directory, by kind."""
    out = {"total": 0, "onnx_data": 0, "onnx": 0, "torch_weights": 0, "other": 0}
    for f in d.rglob("*"):
        if not f.is_file():
            continue
        n = f.stat().st_size
        out["total"] += n
        kind = ("onnx_data" if f.name.endswith(".onnx.data") else "onnx" if f.suffix == ".onnx"
                else "torch_weights" if f.parent.name == "weights" else "other")
        out[kind] += n
    return out


def distinct_weight_bytes(d: Path) -> int:
    """Bytes of the distinct tensors the graphs hold (each (dtype, bytes) counted once), read
    from the graph files themselves, so old and new layouts are measured the same way."""
    import hashlib

    import onnx

    from lisa_trt.export.weights import _tensor_bytes

    seen, total = set(), 0
    for g in sorted(d.glob("*.onnx")):
        m = onnx.load(str(g), load_external_data=False)
        for t in m.graph.initializer:
            b = _tensor_bytes(t, d)
            if b is None:
                continue
            k = hashlib.sha256(t.data_type.to_bytes(4, "little") + b).digest()
            if k not in seen:
                seen.add(k)
                total += len(b)
    return total


def time_v(log: str) -> dict:
    """Peak RSS (bytes) and wall seconds from a `/usr/bin/time -v` log."""
    out = {}
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", log)
    if m:
        out["peak_rss_bytes"] = int(m.group(1)) * 1024
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", log)
    if m:
        parts = [float(x) for x in m.group(1).split(":")]
        out["wall_s"] = round(sum(p * 60 ** i for i, p in enumerate(reversed(parts))), 1)
    return out


def ort_run(d: Path, pythonpath: str, threads: int, env_extra: Optional[dict] = None) -> dict:
    """`lisa-trt run --backend ort --verify vanilla` of one image under /usr/bin/time -v (the
    image's tokens, seconds and forwards from its stats.json; `env_extra` added to the environment)."""
    with tempfile.TemporaryDirectory(prefix="mem-run-") as tmp:
        prompts = Path(tmp) / "p.txt"
        prompts.write_text("1\n")
        cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "lisa_trt", "run", str(d), str(prompts), "--backend", "ort",
               "--verify", "vanilla", "--threads", str(threads), "--out", str(Path(tmp) / "out"), "--seed", "0"]
        env = dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1", **(env_extra or {}))
        load0 = os.getloadavg()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        rec = dict(time_v(p.stderr), rc=p.returncode, loadavg_before=load0, loadavg_after=os.getloadavg(),
                   command=" ".join(cmd[2:]))
        if p.returncode:
            rec["error"] = (p.stderr or p.stdout).strip().splitlines()[-3:]
        tok = Path(tmp) / "out" / "stats.json"
        if tok.is_file():
            rec["stats"] = json.loads(tok.read_text())
        return rec


DECODE = r"""
import resource, sys, time, torch
from lisa_trt.engines.graph import load_engines
d, steps, one = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
opts = dict(one_copy=True) if one else {}
t0 = time.perf_counter()
e = load_engines(d, "ort", threads=2, **opts)
t = e.target
g = torch.Generator().manual_seed(0)
cache = t.new_cache(2, extra=8)
out = t.prefill(torch.tensor([3, t.config.num_classes]), cache)  # CFG: cond + uncond rows
T, toks = t.config.cls_token_num, []
t1 = time.perf_counter()
for i in range(steps):
    lg = out.logits[:, -1].float()
    tok = torch.multinomial(torch.softmax(lg[1] + 4.0 * (lg[0] - lg[1]), -1), 1, generator=g)
    toks.append(int(tok))
    pos = torch.full((2, 1), T + i)
    mask = torch.zeros(2, 1, t.max_cache_len, dtype=torch.bool)
    mask[:, :, :T + i + 1] = True
    out = t.forward_tokens(tok.expand(2, 1).contiguous(), pos, pos.clone(), mask, cache)
dt = (time.perf_counter() - t1) / steps
print("RESULT", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, round(dt, 4), toks[:16])
"""


def ort_decode(d: Path, pythonpath: str, steps: int, one_copy: bool) -> dict:
    """The target through ORT: load, CFG prefill, `steps` sampled tokens (batch 2); peak RSS of
    that process, s/token, the first tokens (equal across modes for the same seed)."""
    env = dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1")
    load0 = os.getloadavg()
    p = subprocess.run([sys.executable, "-c", DECODE, str(d), str(steps), "1" if one_copy else "0"],
                       capture_output=True, text=True, env=env)
    rec = dict(rc=p.returncode, loadavg_before=load0, loadavg_after=os.getloadavg(), steps=steps, one_copy=one_copy,
               pythonpath=pythonpath)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT"):
            _, rss, dt, toks = line.split(" ", 3)
            rec.update(peak_rss_bytes=int(rss), s_per_token=float(dt), first_tokens=json.loads(toks))
    if p.returncode:
        rec["error"] = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return rec


# ----------------------------------------------------------------------------- one run: checkpoints -> bundles -> figures

SHAPES = {
    # lisa-trt random-checkpoint --config GPT-XL --image-size 384 (775M parameters) + a random VQ-16
    "gptxl": dict(label="random GPT-XL c2i 384 (775M)", kind="llamagen"),
    # a Chameleon-family shape of about 1.5B parameters (HF directory, 2 GB shards + index json)
    "chameleon-1.5b": dict(label="random Chameleon-family 1.5B (hidden 2048, 24 layers, vocab 65536)",
                           kind="chameleon", hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                           num_attention_heads=16, vocab_size=65536),
}


def _sh(cmd: list, log: Path, env_extra: Optional[dict] = None) -> dict:
    """Run `cmd` under /usr/bin/time -v (OMP_NUM_THREADS=1, this checkout first on PYTHONPATH);
    its log; peak RSS and wall seconds."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **(env_extra or {}))
    load0 = os.getloadavg()
    with open(log, "w") as f:
        p = subprocess.run(["/usr/bin/time", "-v", *cmd], stdout=f, stderr=subprocess.STDOUT, env=env)
    text = log.read_text(errors="replace")
    rec = dict(time_v(text), rc=p.returncode, loadavg_before=[round(x, 2) for x in load0],
               loadavg_after=[round(x, 2) for x in os.getloadavg()], command=" ".join(str(c) for c in cmd), log=str(log))
    if p.returncode:
        rec["error"] = text.strip().splitlines()[-25:-22] if "Command being timed" in text else text.strip().splitlines()[-3:]
    return rec


def make_llamagen(work: Path) -> tuple[Path, Path]:
    ck, vq = work / "gptxl.pt", work / "vq16.pt"
    lt = [sys.executable, "-m", "lisa_trt", "random-checkpoint"]
    if not ck.is_file():
        subprocess.run(lt + ["--config", "GPT-XL", "--image-size", "384", str(ck)], check=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    if not vq.is_file():
        subprocess.run(lt + ["--config", "VQ-16", str(vq)], check=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    return ck, vq


def make_chameleon(work: Path, shape: dict, shard_bytes: int = 2 << 30) -> Path:
    """A random HF Chameleon directory of `shape`, written shard by shard (never the whole model in
    memory): config.json, model-0000x-of-0000y.safetensors + model.safetensors.index.json, a
    word-level tokenizer over the vocabulary, no VQGAN (tokens only)."""
    import torch
    from safetensors.torch import save_file

    from lisa_trt.families.chameleon.model import ChameleonConfig, ChameleonTarget

    d = work / "chameleon"
    have_weights = (d / "model.safetensors.index.json").is_file()  # the tokenizer and config are rewritten
    d.mkdir(parents=True, exist_ok=True)
    V, n_codes = shape["vocab_size"], 8192
    vmap = {"<pad>": 0, "<s>": 1, "</s>": 2, "<image>": 3}
    vmap.update({"IMGIMG" + "".join(chr(ord("A") + int(c)) for c in str(i)) + "Z": 4 + i for i in range(n_codes)})
    # Lumina-mGPT's span tokens: start, end, row end, turn separator, and one size token per grid
    # height (`<reserved{8800 + rows}>`, families/chameleon/lumina.py) for every grid up to 64 rows
    specials = (["<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"]
                + [f"<reserved{8800 + k:05d}>" for k in range(1, 65)] + ["<unk>"])
    for i, n in enumerate(specials):
        vmap[n] = 4 + n_codes + i
    nxt = 4 + n_codes + len(specials)
    for i in range(nxt, V):
        vmap[f"tok{i}"] = i
    cfg = dict(model_type="chameleon", vocab_size=V, hidden_size=shape["hidden_size"],
               intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_hidden_layers"],
               num_attention_heads=shape["num_attention_heads"], num_key_value_heads=shape["num_attention_heads"],
               max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
               swin_norm=False, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
               vocabulary_map=vmap, torch_dtype="bfloat16")
    ours = {k: v for k, v in cfg.items() if k not in ("model_type", "hidden_act", "torch_dtype")}
    ours = {k: v for k, v in ours.items() if k in ChameleonConfig.__dataclass_fields__}
    with torch.device("meta"):
        shapes = {k: (tuple(t.shape), t.dtype) for k, t in ChameleonTarget(ChameleonConfig(**ours)).state_dict().items()}
    g = torch.Generator().manual_seed(0)
    shards, cur, cur_bytes = [], {}, 0
    for k, (shp, dt) in ({} if have_weights else shapes).items():
        if k.endswith("norm.weight") or k.endswith("layernorm.weight"):
            t = torch.ones(shp)
        else:
            t = torch.randn(shp, generator=g) * 0.02
        cur[k] = t.to(torch.bfloat16)  # bf16, as Lumina-mGPT ships
        cur_bytes += cur[k].numel() * 2
        if cur_bytes >= shard_bytes:
            shards.append(cur)
            save_file(cur, str(d / f"shard-{len(shards)}.tmp"))
            cur, cur_bytes = {}, 0
    if cur:
        shards.append(cur)
        save_file(cur, str(d / f"shard-{len(shards)}.tmp"))
    if not have_weights:
        n, wmap = len(shards), {}
        for i, sh in enumerate(shards, 1):
            name = f"model-{i:05d}-of-{n:05d}.safetensors"
            os.replace(d / f"shard-{i}.tmp", d / name)
            wmap.update({k: name for k in sh})
        shards.clear()
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    (d / "config.json").write_text(json.dumps(cfg))
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=vmap, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials + ["<s>", "</s>"])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return d


def _manifest_export(d: Path) -> dict:
    try:
        m = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"manifest_export": m.get("export") or {},
            "graph_peak_rss_bytes": {k: g.get("peak_rss_bytes") for k, g in (m.get("graphs") or {}).items()}}


def measure(a) -> int:
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    out = json.loads(a.json.read_text()) if a.json.is_file() else {}
    prior = {b.get("shape"): b for b in out.get("blocks", []) if b.get("run") == "measure"}
    blocks = [b for b in out.get("blocks", []) if b.get("run") != "measure" or b.get("shape") not in a.shape]
    lt = [sys.executable, "-m", "lisa_trt"]
    for key in a.shape:
        shape = SHAPES[key]
        t0 = time.time()
        if shape["kind"] == "llamagen":
            ck, vq = make_llamagen(work)
            model = ["--model", str(ck), "--config", "GPT-XL", "--image-size", "384", "--vq", str(vq)]
            fp32_bytes = ck.stat().st_size + vq.stat().st_size  # the official .pt files: fp32 state dicts
        else:
            ck = make_chameleon(work, shape)
            model = ["--model", str(ck), "--image-size", "512"]
            idx = json.loads((ck / "model.safetensors.index.json").read_text())
            fp32_bytes = 2 * sum((ck / f).stat().st_size for f in set(idx["weight_map"].values()))  # bf16 files
        block = {"run": "measure", "shape": key, "label": shape["label"], "fp32_weight_bytes": fp32_bytes,
                 "commit": _commit(), "rows": {}, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "command": "python bench/memory.py measure " + " ".join(a.argv)}
        old = prior.get(key)
        if a.resume and old:  # rows an interrupted run finished (each row records its commit)
            rows = {k: dict(r, commit=r.get("commit", old.get("commit"))) for k, r in old["rows"].items()}
            block.update(rows=rows, date=old["date"], command=old["command"],
                         resumed=old.get("resumed", []) + [{"command": " ".join(a.argv), "commit": block["commit"]}])
        for prec in a.precisions:
            if prec in block["rows"]:
                print(key, prec, "measured already (--resume)", flush=True)
                continue
            d = work / f"{key}_{prec}"
            flags = {"fp16": ["--fp16"], "fp32": [], "int8": ["--quantize", "int8"]}[prec]
            if prec != "fp16" and not a.validate_all:
                flags = flags + ["--no-validate"]
            log = work / f"{key}_{prec}_export.log"
            if a.reuse_exports and (d / "manifest.json").is_file() and log.is_file():  # measured by an earlier run
                row = {"export": dict(time_v(log.read_text(errors="replace")), rc=0, log=str(log), reused=True),
                       "validated": "--no-validate" not in flags}
            else:
                row = {"export": _sh(lt + ["export", *model, "--out", str(d), *flags], log),
                       "validated": "--no-validate" not in flags}
            if row["export"]["rc"] == 0:
                row["bytes"] = bundle_bytes(d)
                row["distinct_weight_bytes"] = distinct_weight_bytes(d)
                row["bundle_over_distinct"] = round(row["bytes"]["total"] / row["distinct_weight_bytes"], 3)
                row["export"].update(_manifest_export(d))
                if "peak_rss_bytes" in row["export"]:
                    row["export"]["peak_rss_over_fp32_weights"] = round(row["export"]["peak_rss_bytes"] / fp32_bytes, 3)
                if prec in a.run and shape["kind"] == "llamagen":
                    # a full one-image `lisa-trt run` (CFG, vanilla: every image token); the default
                    # sessions (one target session), and for the fp32 bundle also the prefill graph
                    # opened beside it as before issue 26's one target graph (LISA_TRT_ORT_PREFILL_GRAPH=1)
                    modes = {"default": {}}
                    if prec in a.before_modes:
                        modes["prefill-graph"] = {"LISA_TRT_ORT_PREFILL_GRAPH": "1"}
                    for mode, env in modes.items():
                        r = ort_run(d, str(REPO), a.threads, env)
                        r.update(loaded=True, env=env)
                        if "peak_rss_bytes" in r:
                            r["peak_rss_over_fp32_weights"] = round(r["peak_rss_bytes"] / fp32_bytes, 3)
                            r["target_bytes"] = 1.5 * fp32_bytes + 1e9
                            r["meets_1p5x_plus_1GB"] = r["peak_rss_bytes"] <= r["target_bytes"]
                        img = ((r.get("stats") or {}).get("images") or [{}])[0]
                        if img.get("seconds") and img.get("target_forwards"):
                            r["s_per_token"] = round(img["seconds"] / max(1, img["target_forwards"] - 1), 4)
                        row.setdefault("ort_run", {})[mode] = r
                        print(key, prec, mode, {k: r.get(k) for k in ("rc", "peak_rss_bytes", "wall_s", "s_per_token")},
                              flush=True)
                if not a.keep:
                    subprocess.run(["rm", "-rf", str(d)])
            row["commit"] = block["commit"]
            block["rows"][prec] = row
            print(key, prec, json.dumps(row)[:600], flush=True)
            _write(a.json, out, blocks + [block])
        block["seconds"] = round(time.time() - t0)
        block["machine"] = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                            "loadavg_end": os.getloadavg(), "loaded": True}
        _write(a.json, out, blocks + [block])
        blocks.append(block)
        plot(argparse.Namespace(json=a.json, png=a.json.with_suffix(".png")))
    return 0


def _commit() -> str:
    if os.environ.get("LISA_BENCH_COMMIT"):  # a snapshot of a commit (no .git)
        return os.environ["LISA_BENCH_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() + (" (+ uncommitted)" if subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
            text=True).stdout.strip() else "")
    except OSError:
        return "?"


def _write(path: Path, old: dict, blocks: list) -> None:
    """bench/memory.json, atomically (the other keys of the file kept)."""
    rec = dict(old)
    rec.update(issue=26, blocks=blocks)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    os.replace(tmp, path)


# the issue's own measurement of the old layout (main before ba3a035: one .onnx.data per graph plus
# weights/target.safetensors), random GPT-XL c2i 384 fp16 bundle, this machine: not re-measured
BEFORE_GPTXL = {"commit": "before ba3a035 (issue 26 report)", "fp16_bundle_bytes": 6.2e9,
                "fp16_distinct_weight_bytes": 1.55e9, "export_peak_rss_bytes": 10.1e9,
                "ort_run_fp16_peak_rss_bytes": 7.7e9, "fp32_weight_bytes": 3.1e9}


def plot(a) -> int:
    """bench/memory.png: each ratio of each measured shape against the issue's target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = json.loads(a.json.read_text())
    blocks = [b for b in rec.get("blocks", []) if b.get("run") == "measure"]
    # stop 34's GPT-XL block: the before of the lint subprocess and the int8 bundle's fp32 copy
    prev = {b.get("shape"): b["rows"] for b in rec.get("blocks", []) if b.get("run", "").startswith("measure (stop 34")}
    panels = [("bundle / distinct weights", 1.1), ("export peak RSS / fp32 weights", 2.5),
              ("ORT run peak RSS / fp32 weights", None)]
    fig, axes = plt.subplots(1, 3, figsize=(18, 6))
    for ax, (title, target) in zip(axes, panels):
        bars, labels, colors, targets = [], [], [], []
        for b in blocks:
            rows, w = b["rows"], b["fp32_weight_bytes"]
            tag = b["shape"]
            if title.startswith("bundle"):
                if tag == "gptxl":  # before: the issue's figures
                    bars.append(BEFORE_GPTXL["fp16_bundle_bytes"] / BEFORE_GPTXL["fp16_distinct_weight_bytes"])
                    labels.append(f"{tag} fp16\nbefore")
                    colors.append("#bbbbbb")
                for prec in ("fp16", "fp32", "int8"):
                    old = prev.get(tag, {}).get(prec, {}).get("bundle_over_distinct")
                    if prec == "int8" and old:  # stop 34: the torch backend's fp32 copy beside the int8 graphs
                        bars.append(old)
                        labels.append(f"{tag} {prec}\nstop 34")
                        colors.append("#bbbbbb")
                    if "bundle_over_distinct" in rows.get(prec, {}):
                        bars.append(rows[prec]["bundle_over_distinct"])
                        labels.append(f"{tag} {prec}\nafter")
                        colors.append("#2b7bb9" if rows[prec]["bundle_over_distinct"] <= target else "#d9534f")
            elif title.startswith("export"):
                if tag == "gptxl":
                    bars.append(BEFORE_GPTXL["export_peak_rss_bytes"] / BEFORE_GPTXL["fp32_weight_bytes"])
                    labels.append(f"{tag} fp16\nbefore")
                    colors.append("#bbbbbb")
                for prec in ("fp16", "fp32", "int8"):
                    e = rows.get(prec, {}).get("export", {})
                    old = prev.get(tag, {}).get(prec, {}).get("export", {}).get("peak_rss_over_fp32_weights")
                    if old:  # stop 34: the command's largest process (the lint subprocess loaded the weights)
                        bars.append(old)
                        labels.append(f"{tag} {prec}\nstop 34 largest")
                        colors.append("#bbbbbb")
                    proc = (e.get("manifest_export") or {}).get("peak_rss_bytes")
                    if proc:  # the exporting process (the manifest's record)
                        bars.append(proc / w)
                        labels.append(f"{tag} {prec}\nexporter")
                        colors.append("#2b7bb9" if proc / w <= target else "#d9534f")
                    if "peak_rss_over_fp32_weights" in e:  # the command's largest process (a lint subprocess)
                        bars.append(e["peak_rss_over_fp32_weights"])
                        labels.append(f"{tag} {prec}\nlargest proc.")
                        colors.append("#9ecae1" if e["peak_rss_over_fp32_weights"] <= target else "#f2a6a4")
            else:
                lim = (1.5 * w + 1e9) / w
                if tag == "gptxl":  # (the issue's figure: an fp16 bundle's run, before the shared weights file)
                    bars.append(BEFORE_GPTXL["ort_run_fp16_peak_rss_bytes"] / BEFORE_GPTXL["fp32_weight_bytes"])
                    labels.append(f"{tag} fp16 run\nbefore")
                    colors.append("#bbbbbb")
                    targets.append((len(bars) - 1, lim))
                for prec in ("fp16", "fp32", "int8"):
                    for mode, r in rows.get(prec, {}).get("ort_run", {}).items():
                        if "peak_rss_over_fp32_weights" in r:
                            bars.append(r["peak_rss_over_fp32_weights"])
                            labels.append(f"{tag} {prec}\n{mode}")
                            colors.append("#2b7bb9" if r["peak_rss_bytes"] <= 1.5 * w + 1e9 else "#d9534f")
                            targets.append((len(bars) - 1, lim))
        x = range(len(bars))
        ax.bar(x, bars, color=colors)
        for i, v in enumerate(bars):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(x), [lab.replace("\n", " ") for lab in labels], fontsize=7, rotation=55, ha="right")
        if target is not None:
            ax.axhline(target, color="k", ls="--", lw=1, label=f"target {target}x")
        for i, lim in targets:
            ax.hlines(lim, i - 0.4, i + 0.4, colors="k", linestyles="--", lw=1)
        if targets:
            ax.plot([], [], "k--", lw=1, label="target 1.5x + 1 GB")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle("issue 26 memory (grey: before: the issue report, or stop 34; blue: after, measured; red: misses target; "
                 "export: the exporting process, and paler the command's largest process (lint "
                 "subprocesses included). 2-core CPU VM, loaded", fontsize=8)
    fig.tight_layout()
    tmp = a.png.with_name(a.png.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, a.png)
    return 0


PROBE_INIT = r"""
import numpy as np, onnx, onnxruntime as ort, os, sys
from onnx import helper, TensorProto, numpy_helper
d, op, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
N, D = 100000, 1024  # a 400 MB fp32 table / weight
path = os.path.join(d, op + ".onnx")
if not os.path.exists(path):
    W = numpy_helper.from_array(np.random.default_rng(0).random((N, D), dtype=np.float32), "W")
    if op == "Gather":
        node, x = helper.make_node("Gather", ["W", "x"], ["y"]), helper.make_tensor_value_info("x", TensorProto.INT64, ["n"])
    else:
        node, x = helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", N])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", D])
    m = helper.make_model(helper.make_graph([node], "g", [x], [y], [W]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path, save_as_external_data=True, location=op + ".data", size_threshold=0)
    sys.exit(0)
rss = lambda: int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024
r0, ss = rss(), []
for i in range(n):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ss.append(ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]))
print("RESULT", rss() - r0)
"""


def probe(a) -> int:
    """Where ONNX Runtime keeps an initializer read from external data: a 400 MB fp32 table behind a
    Gather and the same tensor behind a MatMul, 1 and 2 sessions each (RSS growth of the process);
    and, on a demo bundle, drafter_commit (one call) vs drafter_project + drafter_step (two) per
    commit: seconds of the same generations, interleaved, and whether the tokens are identical."""
    rec = {"run": "probe", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _commit(),
           "command": "python bench/memory.py " + " ".join(a.argv), "loaded": True, "initializers": {}}
    with tempfile.TemporaryDirectory(prefix="mem-probe-") as tmp:
        for op in (("Gather", "MatMul") if a.initializers else ()):
            subprocess.run([sys.executable, "-c", PROBE_INIT, tmp, op, "0"], check=True)
            for n in (1, 2):
                p = subprocess.run([sys.executable, "-c", PROBE_INIT, tmp, op, str(n)], capture_output=True, text=True,
                                   check=True)
                grow = int(p.stdout.split("RESULT")[1])
                rec["initializers"][f"{op} x{n} sessions"] = {"tensor_bytes": 100000 * 1024 * 4, "rss_growth_bytes": grow}
                print(op, n, grow, flush=True)
    if a.demo:
        code = r"""
import sys, time, json, torch, lisa_trt
d = sys.argv[1]
p = lisa_trt.Pipeline.from_dir(d, backend="ort", threads=1)  # drafter_commit: LISA_TRT_ORT_FUSED_COMMIT
t0 = time.perf_counter()
r = p.generate([0, 3, 5, 7], verify="exact", seed=1, decode=False)
print("RESULT", json.dumps(dict(seconds=time.perf_counter() - t0, fused=p._e.drafter.fused_commit,
                                tokens=torch.as_tensor(r.tokens).tolist())))
"""
        runs = {"commit": [], "project+step": []}
        toks = {}
        for rep in range(a.repeats):
            for mode in runs:
                env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
                           LISA_TRT_ORT_FUSED_COMMIT="1" if mode == "commit" else "0")
                p = subprocess.run([sys.executable, "-c", code, str(a.demo)], capture_output=True, text=True, env=env)
                if p.returncode:
                    raise SystemExit(p.stderr[-2000:])
                r = json.loads(p.stdout.split("RESULT", 1)[1])
                assert r["fused"] == (mode == "commit"), r["fused"]
                runs[mode].append(round(r["seconds"], 3))
                toks[mode] = r["tokens"]
                print(mode, r["seconds"], flush=True)
        med = {m: sorted(v)[len(v) // 2] for m, v in runs.items()}
        rec["drafter_commit"] = {"bundle": str(a.demo), "images": 4, "verify": "exact", "seconds": runs,
                                 "median_ratio_project_step_over_commit": round(med["project+step"] / med["commit"], 3),
                                 "tokens_identical": toks["commit"] == toks["project+step"]}
    if a.sessions:  # the target's sessions: one (default), prefill graph beside it, one at a time (one-copy)
        modes = {"one session (default)": {}, "prefill graph (before)": {"LISA_TRT_ORT_PREFILL_GRAPH": "1"},
                 "one-copy (ExclusiveSessions)": {"LISA_TRT_ORT_PREFILL_GRAPH": "1", "LISA_TRT_ORT_ONE_COPY": "1"}}
        res = {m: [] for m in modes}
        toks = {}
        with tempfile.TemporaryDirectory(prefix="mem-sess-") as tmp:
            prompts = Path(tmp) / "p.txt"
            prompts.write_text("0\n3\n5\n7\n")
            for rep in range(a.repeats):
                for i, (mode, env) in enumerate(modes.items()):
                    o = Path(tmp) / f"o{rep}_{i}"
                    cmd = [sys.executable, "-m", "lisa_trt", "run", str(a.sessions), str(prompts), "--backend", "ort",
                           "--verify", "vanilla", "--threads", "1", "--out", str(o), "--seed", "1"]
                    p = subprocess.run(cmd, capture_output=True, text=True,
                                       env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **env))
                    if p.returncode:
                        raise SystemExit(p.stderr[-2000:])
                    st = json.loads((o / "stats.json").read_text())
                    fw = sum(im["target_forwards"] for im in st["images"])
                    res[mode].append(round(sum(im["seconds"] for im in st["images"]) / fw, 6))
                    import numpy as np

                    toks[mode] = np.load(o / "tokens.npy").tolist()
                    print(mode, res[mode][-1], flush=True)
        med = {m: sorted(v)[len(v) // 2] for m, v in res.items()}
        base = med["one session (default)"]
        rec["target_sessions"] = {"bundle": str(a.sessions), "images": 4, "verify": "vanilla",
                                  "s_per_target_forward": res,
                                  "median_ratio_to_default": {m: round(v / base, 3) for m, v in med.items()},
                                  "tokens_identical": all(t == toks["one session (default)"] for t in toks.values())}
    out = json.loads(a.json.read_text()) if a.json.is_file() else {}
    blocks = [b for b in out.get("blocks", []) if b.get("run") != "probe"] + [rec]
    _write(a.json, out, blocks)
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plot"]:
        ap = argparse.ArgumentParser(prog="bench/memory.py plot")
        ap.add_argument("--json", type=Path, default=REPO / "bench" / "memory.json")
        ap.add_argument("--png", type=Path, default=REPO / "bench" / "memory.png")
        return plot(ap.parse_args(argv[1:]))
    if argv[:1] == ["probe"]:
        ap = argparse.ArgumentParser(prog="bench/memory.py probe")
        ap.add_argument("--demo", type=Path, help="an exported demo engine directory (drafter_commit timing)")
        ap.add_argument("--no-initializers", dest="initializers", action="store_false",
                        help="skip the 400 MB Gather / MatMul initializer probe")
        ap.add_argument("--sessions", type=Path,
                        help="an exported demo engine directory: per-step seconds of the target session modes")
        ap.add_argument("--repeats", type=int, default=3)
        ap.add_argument("--json", type=Path, default=REPO / "bench" / "memory.json")
        ns = ap.parse_args(argv[1:])
        ns.argv = argv
        return probe(ns)
    if argv[:1] == ["measure"]:
        ap = argparse.ArgumentParser(prog="bench/memory.py measure")
        ap.add_argument("--shape", action="append", choices=sorted(SHAPES), required=True)
        ap.add_argument("--precisions", type=lambda s: s.split(","), default=["fp16", "fp32", "int8"])
        ap.add_argument("--run", type=lambda s: s.split(","), default=["fp16", "fp32", "int8"],
                        help="bundles to run through ONNX Runtime (a full one-image `lisa-trt run`, vanilla)")
        ap.add_argument("--before-modes", type=lambda s: [x for x in s.split(",") if x], default=["fp32"],
                        help="bundles also run with the prefill graph opened (the sessions before issue 26)")
        ap.add_argument("--threads", type=int, default=2)
        ap.add_argument("--validate-all", action="store_true", help="validate fp32 / int8 exports too (fp16 always)")
        ap.add_argument("--keep", action="store_true", help="keep the bundles (default: deleted once measured)")
        ap.add_argument("--reuse-exports", action="store_true",
                        help="measure a bundle already in --work (and its export log) instead of exporting again")
        ap.add_argument("--resume", action="store_true",
                        help="keep the rows of this shape's block that an interrupted run measured (each row keeps its commit)")
        ap.add_argument("--work", default="/tmp/size_mem")
        ap.add_argument("--json", type=Path, default=REPO / "bench" / "memory.json")
        ns = ap.parse_args(argv[1:])
        ns.argv = argv[1:]
        return measure(ns)
    return legacy_main(argv)


def legacy_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", nargs="+", help="LABEL=ENGINE_DIR[:EXPORT_TIME_V_LOG]")
    ap.add_argument("--label", required=True, help="the model shape measured (e.g. random GPT-L c2i 256)")
    ap.add_argument("--fp32-weights", type=int, required=True, help="fp32 bytes of the target (+ drafter, VQ)")
    ap.add_argument("--run", default="", help="comma-separated labels to run through ORT")
    ap.add_argument("--src", action="append", default=[], help="LABEL=PYTHONPATH for that bundle's ORT run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", default="", help="comma-separated LABEL[+one-copy] to run the target decode probe on")
    ap.add_argument("--steps", type=int, default=16, help="decode probe: sampled tokens")
    ap.add_argument("--json", type=Path, required=True, help="results file (a list of labelled blocks is extended)")
    a = ap.parse_args(argv)
    src = dict(s.split("=", 1) for s in a.src)
    rows = {}
    for spec in a.bundles:
        label, rest = spec.split("=", 1)
        d, _, log = rest.partition(":")
        d = Path(d)
        row = {"dir": str(d), "bytes": bundle_bytes(d), "distinct_weight_bytes": distinct_weight_bytes(d)}
        row["bundle_over_distinct"] = round(row["bytes"]["total"] / row["distinct_weight_bytes"], 3)
        if log and Path(log).is_file():
            row["export"] = time_v(Path(log).read_text())
            if "peak_rss_bytes" in row["export"]:
                row["export"]["peak_rss_over_fp32_weights"] = round(row["export"]["peak_rss_bytes"] / a.fp32_weights, 3)
        if label in a.run.split(","):
            r = ort_run(d, src.get(label, str(REPO)), a.threads)
            if "peak_rss_bytes" in r:
                r["peak_rss_over_fp32_weights"] = round(r["peak_rss_bytes"] / a.fp32_weights, 3)
                r["target_1p5x_plus_1GB"] = 1.5 * a.fp32_weights + 1e9
                r["meets_target"] = r["peak_rss_bytes"] <= r["target_1p5x_plus_1GB"]
            row["ort_run"] = r
        for want in a.decode.split(","):
            lab, _, mode = want.partition("+")
            if lab == label:
                # one-copy is this checkout's mode (engines/ort.ExclusiveSessions): always run it with REPO
                r = ort_decode(d, str(REPO) if mode == "one-copy" else src.get(label, str(REPO)), a.steps,
                               mode == "one-copy")
                if "peak_rss_bytes" in r:
                    r["peak_rss_over_fp32_weights"] = round(r["peak_rss_bytes"] / a.fp32_weights, 3)
                    r["meets_1p5x_plus_1GB"] = r["peak_rss_bytes"] <= 1.5 * a.fp32_weights + 1e9
                row.setdefault("ort_decode", {})["one-copy" if mode == "one-copy" else "default"] = r
        rows[label] = row
        print(label, json.dumps(row)[:400], flush=True)
    block = {"label": a.label, "fp32_weight_bytes": a.fp32_weights, "rows": rows,
             "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                         "loadavg_end": os.getloadavg()},
             "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "command": "python bench/memory.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    old = json.loads(a.json.read_text()) if a.json.is_file() else {}
    blocks = [b for b in old.get("blocks", []) if b.get("label") != a.label]
    a.json.write_text(json.dumps({"issue": 26, "what": "bundle bytes / distinct weight bytes, export and ORT run peak "
                                  "RSS, before (81e7d15) and after the shared weights file", "blocks": blocks + [block]},
                                 indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
