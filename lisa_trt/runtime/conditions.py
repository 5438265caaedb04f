"""A run's conditions: one adapter per conditioning kind, chosen once from the family's answer.

The family says what its targets are conditioned on (models/conditioning.py); the adapter turns
what a user gives (class ids or names, captions, text prompts) into the target's conditions for
every command and the Pipeline, so none of them asks which kind it runs:

    conds = run_conditions(family, cfg)          # ClassConditions / CaptionConditions / PromptConditions
    cond, overrides, labels = conds.parse(prompts, cfg, class_names, encoder)   # Pipeline.generate
    negative = conds.negatives(negative_prompt, n)   # one text or None per prompt; InputError where none
    cond = conds.guided(cond, negative, encoder)     # captions: the negatives' features as CFG's null rows
    cond, request = conds.given(rc, prompts=..., classes=..., captions=..., encoder_dir=...)  # generate
    conds.rollouts(rc, n, ...), conds.images(rc, n, ...), conds.sub_vocab(rc)   # calibrate, bench, export
    conds.parse_file(path, class_names)          # `lisa-trt run`'s prompts file, in this kind's line format
    conds.served(value, class_names, encoder)    # one served prompt -> (class id, None) or (None, text)
    conds.class_names(bundle_names), conds.num_classes   # what a class prompt may name (0 / None: no classes)
    conds.training_captions(...), conds.training_rollouts(...)   # `lisa-trt train`'s data of this kind

Floors: runtime (imports models, export.manifest, text/ (a floor below) and runtime.prompts).
"""

from __future__ import annotations

import torch

from ..errors import InputError
from ..models.captions import encoder_fix, encoder_hint
from ..models.conditioning import CaptionFeatures, ClassLabels, TextPrompts, for_kind
from .class_names import bundle_class_names
from .prompts import Prompt, class_names_of, parse_classes, parse_prompts


class RunConditions:
    """The conditions of one kind; the defaults are those of conditions the command passes as is."""

    def __init__(self, family, kind):
        self.family, self.kind = family, kind

    num_classes = 0  # class ids a prompt may give (ClassConditions: the kind's count)

    def class_names(self, bundle_names):
        """The names a class prompt may use: the bundle's own, else ImageNet's for a 1000-class
        target (runtime/class_names.py); None where prompts are not classes."""
        return bundle_class_names(bundle_names, self.num_classes)

    def parse_file(self, path, class_names=None) -> list:
        """`lisa-trt run`'s prompts file, every line checked (runtime/prompts.parse_prompts): plain
        lines are one caption each (JSONL: caption or caption_features lines)."""
        return parse_prompts(path, captions="lines")

    def served(self, value, class_names, encoder) -> tuple:
        """One served prompt -> (class id, None) or (None, its text): text here, non-empty."""
        caption = str(value).strip()
        if not caption:
            raise InputError("input 'prompt' must be non-empty text for this engine")
        return None, caption

    def training_captions(self, tcfg, captions, encoder_dir, out_dir, source):
        """`lisa-trt train`: the caption feature table encoded before any data work (None: this kind
        trains on no captions)."""
        return None

    def training_rollouts(self, rc, out_dir, o: dict):
        """`lisa-trt train`: (DataConfig, Request, held-out Request | None) when this kind trains on
        rollouts of its prompter's requests; None when it trains on a DataConfig source (class ids,
        caption features: token files, self-distillation, images)."""
        return None

    def precheck(self, prompts, captions, encoder_dir) -> None:
        """Cheap checks before any model loads (captions files and their encoder; missing prompts).
        prompts: the texts a command was given (None: it takes none)."""
        from ..text.train import precheck_captions

        precheck_captions(self.family, captions, encoder_dir)

    def precheck_file(self, prompts_path, tcfg, encoder_dir) -> None:
        """`lisa-trt run`: checks of its prompts file that must run before the engines load (none
        here: the file is parsed when the run reads it)."""

    def no_negative(self):
        """Why this kind takes no negative prompt (an InputError's message), or None when it does."""
        return (f"negative_prompt is not supported by the {self.family.name} family (its prompter builds the "
                "unconditional rows of classifier-free guidance itself and takes no negative text); leave it out")

    def negatives(self, negative, n: int):
        """A request's negative prompt -> one text or None per prompt (models/prompts.negative_texts),
        None when none is set; InputError (no_negative) when this kind takes none."""
        from ..models.prompts import negative_texts

        rows = negative_texts(negative, n)
        if rows is not None and self.no_negative() is not None:
            raise InputError(self.no_negative())
        return rows

    def guided(self, cond, negative, encoder):
        """A parsed condition with the request's negative texts (negatives(): one text or None per
        prompt, or None) -> the condition to decode. Here unchanged: a prompter's negatives are
        encoded per call, by `rows`' encode (a kind that takes none refused them in negatives)."""
        return cond

    def precheck_negative(self, tcfg, encoder_dir) -> None:
        """`lisa-trt run --negative-prompt`: what a negative text needs, checked before any engine
        loads (nothing here: a prompter encodes it)."""

    def encoder(self, text_encoder, tcfg):
        """The Pipeline's text encoder, checked against the target (None: the kind needs none)."""
        return None

    def rows(self, cond, a: int, b: int, encode) -> tuple:
        """Rows a:b of a parsed condition -> (the target's condition rows, the Request or None);
        `encode(texts)` is the pipeline's prompter call (with rows a:b's negative texts)."""
        from ..text.prompts import cond_rows

        return cond_rows(cond, a, b), None

    def sub_vocab(self, rc):
        """The sub-vocabulary tables and relaxed rules bind to (None: the head is the codebook)."""
        return None

    def rollouts(self, rc, n: int, *, captions, captions_file, encoder_dir) -> dict:
        """Keyword arguments of run_calibration for `n` rollouts ({}: it draws its own)."""
        return {}


class ClassConditions(RunConditions):
    """Class ids (or names from the bundle's label list)."""

    @property
    def num_classes(self) -> int:
        return int(self.kind.num_classes or 0)

    def parse_file(self, path, class_names=None) -> list:
        """Plain lines: one class id or name each; JSONL: {"class": ...} lines."""
        return parse_prompts(path, num_classes=self.num_classes, class_names=class_names)

    def served(self, value, class_names, encoder) -> tuple:
        from .prompts import _class_id

        cid, err = _class_id(value, self.kind.num_classes, class_names)
        if err:
            raise InputError(err)
        return cid, None

    def no_negative(self):
        return (f"negative_prompt is not supported by the {self.family.name} family (class-conditional: "
                "classifier-free guidance runs against the null class, there is no text to negate); leave it out")

    def parse(self, prompts, tcfg, class_names, encoder) -> tuple:
        from .prompts import _class_id

        ids, overrides = [], []
        for p in prompts:
            if isinstance(p, Prompt):
                ids.append(p.class_id)
                overrides.append(dict(seed=p.seed, cfg=p.cfg))
                continue
            cid, err = _class_id(p, self.kind.num_classes, class_names)
            if err:
                raise InputError(err)
            ids.append(cid)
            overrides.append({})
        if not ids:
            raise InputError("no prompts given")
        return torch.tensor(ids, dtype=torch.long), overrides, [{"class": i} for i in ids]

    def given(self, rc, *, prompts, classes, captions, encoder_dir) -> tuple:
        if classes is None:
            raise InputError("c2i models need --classes (e.g. --classes 0,1,2)")
        return torch.tensor(parse_classes(classes, self.kind.num_classes, class_names_of(rc.source))), None

    def images(self, rc, n: int, *, classes, captions, encoder_dir, image_size=None) -> tuple:
        """(n conditions, caption texts or None, Requests or None) for `lisa-trt bench`: the classes
        cycled over the images (image_size: a Request's size, text prompts only)."""
        k = self.kind.num_classes
        cl = parse_classes(classes, k, class_names_of(rc.source)) if classes else list(range(k))
        return [cl[i % len(cl)] for i in range(n)], None, None


class CaptionConditions(RunConditions):
    """Caption features of a text encoder: captions encoded with it, or feature files."""

    @property
    def _features(self) -> str:
        """What the family's caption features are called in messages (its plug-in's, e.g. "T5")."""
        return encoder_hint(self.family)["name"]

    def no_negative(self):
        """None: a negative text is encoded by the caption encoder, its features CFG's null rows (guided)."""
        return None

    def guided(self, cond, negative, encoder):
        """The rows with a negative text get its caption features as CFG's unconditional rows in place
        of the learned null caption (text/prompts.with_negative_captions); without one, `cond` as is."""
        from ..text.prompts import with_negative_captions

        return with_negative_captions(cond, negative, encoder, self.family)

    def rows(self, cond, a: int, b: int, encode) -> tuple:
        from ..text.prompts import caption_rows

        return caption_rows(cond, a, b), None

    def precheck_negative(self, tcfg, encoder_dir) -> None:
        """A negative text is encoded by the caption encoder: one must be given (or configured)."""
        from ..text.prompts import make_encoder

        if make_encoder(encoder_dir, tcfg, self.family) is None:
            raise InputError(f"--negative-prompt on a {self._features}-caption bundle is encoded by its caption "
                             f"encoder: {encoder_fix(self.family)}")

    def encoder(self, text_encoder, tcfg):
        from ..text.prompts import make_encoder

        return make_encoder(text_encoder, tcfg, self.family)

    def precheck_file(self, prompts_path, tcfg, encoder_dir) -> None:
        """A prompts file holding captions needs the family's caption encoder: checked before any
        engine loads (feature-file lines need none)."""
        from ..text.prompts import make_encoder

        ps = self.parse_file(prompts_path)
        if any(p.caption is not None for p in ps) and make_encoder(encoder_dir, tcfg, self.family) is None:
            raise InputError(f"{prompts_path} holds captions; encoding them needs a {self._features} encoder: "
                             f"{encoder_fix(self.family)}, or use "
                             '{"caption_features": FILE} lines from `lisa-trt encode-captions`')

    def parse_file(self, path, class_names=None) -> list:
        """Plain lines: every line one caption, encoded by the family's caption encoder (an empty
        line is an error); JSONL: caption or caption_features lines."""
        return parse_prompts(path, captions="every-line")

    def served(self, value, class_names, encoder) -> tuple:
        if encoder is None:
            h = encoder_hint(self.family)
            start = f"start it with {h['env']}=DIR ({h['dir']})" if h["env"] else "give the pipeline its text_encoder"
            raise InputError(f"this engine is conditioned on {h['name']} caption features and the server has no text "
                             f"encoder: {start} to serve captions")
        return super().served(value, class_names, encoder)

    def training_captions(self, tcfg, captions, encoder_dir, out_dir, source):
        from ..text.train import training_caption_file

        return training_caption_file(tcfg, captions, encoder_dir, out_dir, source)

    def parse(self, prompts, tcfg, class_names, encoder) -> tuple:
        """Caption strings or Prompt lines (a caption, or a caption_features file) -> their features."""
        from ..text.prompts import t2i_conds

        items, overrides = [], []
        for i, p in enumerate(prompts):
            if isinstance(p, Prompt):
                overrides.append(dict(seed=p.seed, cfg=p.cfg))
                if p.caption is not None:
                    items.append(("caption", p.caption))
                elif p.caption_features is not None:
                    items.append(("file", p.caption_features))
                else:
                    raise InputError(f"prompt on line {p.line} has no caption (t2i model)")
            elif isinstance(p, str):
                if not p.strip():
                    raise InputError(f"prompt {i} is an empty caption")
                items.append(("caption", p.strip()))
                overrides.append({})
            else:
                raise InputError(f"t2i prompts are caption strings or Prompt objects, got {type(p).__name__} "
                                 "(for precomputed features pass a Prompt(caption_features=FILE))")
        cond, labels = t2i_conds(items, tcfg, encoder, self.family)
        return cond, overrides, labels

    def given(self, rc, *, prompts, classes, captions, encoder_dir) -> tuple:
        from ..text.train import prompt_conds

        return prompt_conds(rc.target.config, captions, encoder_dir, what="generate")[0], None

    def images(self, rc, n: int, *, classes, captions, encoder_dir, image_size=None) -> tuple:
        from ..text.train import prompt_conds

        conds, texts = prompt_conds(rc.target.config, captions, encoder_dir, n=n, what="bench")
        return conds, texts, None

    def rollouts(self, rc, n: int, *, captions, captions_file, encoder_dir) -> dict:
        from ..text.train import prompt_conds

        conds, _ = prompt_conds(rc.target.config, captions, encoder_dir, n=n, what="calibration rollouts")
        return {"conds": conds}


class PromptConditions(RunConditions):
    """Text prompts the family's prompter encodes into Requests (their layout, sub-vocabulary, grid)."""

    def no_negative(self):
        """None when the family's prompter takes negative texts (TextPrompts.negative)."""
        return None if self.kind.negative else super().no_negative()

    def precheck(self, prompts, captions, encoder_dir) -> None:
        """An empty prompt list (given, but empty) is refused; texts need no encoder here."""
        if prompts is not None and not prompts:
            raise missing_prompts(self.family)

    def parse(self, prompts, tcfg, class_names, encoder) -> tuple:
        """Texts stay texts: each call's rows are encoded by `rows` (their own left padding)."""
        texts = [p.caption if isinstance(p, Prompt) else p for p in prompts]
        if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
            raise InputError(f"{self.family.name} pipelines take caption strings (or Prompt(caption=...)); "
                             f"got {list(prompts)!r}")
        overrides = [dict(seed=p.seed, cfg=p.cfg) if isinstance(p, Prompt) else {} for p in prompts]
        return texts, overrides, [{"caption": t} for t in texts]

    def rows(self, cond, a: int, b: int, encode) -> tuple:
        req = encode(cond[a:b])
        return req.cond, req

    def given(self, rc, *, prompts, classes, captions, encoder_dir) -> tuple:
        req = rc.request(prompts)
        return req.cond, req

    def images(self, rc, n: int, *, classes, captions, encoder_dir, image_size=None) -> tuple:
        """Text prompts (--captions: one per line; else the family's list) cycled, one Request per image."""
        from .prompts import caption_list

        texts = caption_list(self.family, captions, n)
        return None, texts, [rc.request([t], image_size=image_size) for t in texts]

    def rollouts(self, rc, n: int, *, captions, captions_file, encoder_dir) -> dict:
        """One rollout per caption (cycled to n) of the prompter's requests, at the family's size."""
        from .prompts import caption_list

        req = rc.request(caption_list(self.family, captions_file, n))
        size = rc.image_size(self.family.default_image_size)
        return dict(conds=req.cond, layout=req.layout, settings=dict(width=size, height=size))

    def sub_vocab(self, rc):
        return rc.request(["x"], cfg=False).layout.sub_vocab

    def training_rollouts(self, rc, out_dir, o: dict):
        """The family's self-distillation defaults, the given values, and (when OUT already holds a
        run) the rollout settings of its first start. The held-out request: `--eval-images` of the
        held-out captions (the list's last `eval_samples`, cycled), for decoding MAL with seeds the
        rollouts never used."""
        import json
        from pathlib import Path

        from ..train.data import DataConfig
        from .prompts import caption_list

        d = self.family.train_defaults
        n = o["num_samples"] if o["num_samples"] is not None else d.get("num_samples", DataConfig.num_samples)
        data = dict(num_samples=n, cfg_scale=rc.sampling.cfg_scale, top_k=rc.sampling.top_k, features=o["features"],
                    gen_batch=d.get("gen_batch", DataConfig.gen_batch), eval_samples=n // 8)
        saved = Path(out_dir) / "train_config.json"
        if saved.is_file():  # a run keeps the rollouts of its first start
            first = json.loads(saved.read_text()).get("data", {})
            data.update({k: first[k] for k in data if k in first})
        texts = caption_list(self.family, o["captions_file"], data["num_samples"] + data["eval_samples"])
        request = rc.request(texts, cfg=True)
        held = texts[data["num_samples"]:] or texts
        k = o["eval_images"]
        held_out = rc.request((held * (k // len(held) + 1))[:k], cfg=True) if k else None
        return DataConfig(**data), request, held_out


_ADAPTERS = {ClassLabels: ClassConditions, CaptionFeatures: CaptionConditions, TextPrompts: PromptConditions}


def run_conditions(family, cfg_or_type=None) -> RunConditions:
    """The adapter of `family`'s conditioning for `cfg` (a TargetConfig, a model_type, or None
    before the model loads: then the family's default kind, which only `precheck` may use)."""
    kind = family.conditioning(cfg_or_type)
    return for_kind(kind, _ADAPTERS, f"the {family.name} family's runs")(family, kind)



def missing_prompts(family) -> InputError:
    """The error for a text-prompt family given no prompt."""
    return InputError(f"{family.name} models take text prompts: pass --prompt TEXT (repeat it for a batch) "
                      "or a captions file")
