"""Issue 27's decoders on a prompted family's ORT bundle (Chameleon, Janus): one check both
families' tests call, so the two stay the same."""

import numpy as np
import pytest
import torch

NEW_DECODERS = ("sjd", "mcsjd", "sjd-pac", "gsd", "zipar", "coupled", "sjd-gasv")


def check_new_decoders_run_and_serve_on_ort(eng_dir, captions, n_codes: int) -> None:
    """Pipeline one call per prompt and batch=True (the serve path: equal tokens for every rule but
    `coupled`), then the serve model with the knobs as inputs; the stats say what ran."""
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.serve.model import ServeModel

    caps = list(captions)
    knobs = dict(sjd_window=3, sjd_pac_tree_width=2, zipar_window=2)  # the window tree fits --max-tree 16
    with Pipeline.from_dir(eng_dir, backend="ort", threads=1) as pipe:
        for v in NEW_DECODERS:
            alone = pipe.generate(caps, verify=v, seed=3, decode=False, **knobs)
            both = pipe.generate(caps, verify=v, seed=3, decode=False, batch=True, **knobs)
            assert [s["verify"] for s in both.stats] == [v] * len(caps), v
            if v != "coupled":  # the same decodes (per-row generators): the same steps per prompt
                assert [s["mal"] for s in both.stats] == pytest.approx([s["mal"] for s in alone.stats]), v
            assert both.codes.shape == alone.codes.shape and int(both.codes.max()) < n_codes
            if v != "coupled":  # a tree method: batch=True draws from per-row generators
                assert torch.equal(both.codes, alone.codes), v
        model = ServeModel(pipe, max_batch=4)
        prompt = np.array([[c.encode()] for c in caps], dtype=object)
        n = len(caps)
        for v in ("mcsjd", "sjd-gasv", "coupled"):
            (err, out), = model.infer_each([{"prompt": prompt, "seed": np.arange(3, 3 + n).reshape(n, 1),
                                              "verify": np.array([[v.encode()]] * n, dtype=object),
                                              **{k: np.array([[x]] * n, np.int32) for k, x in knobs.items()}}])
            assert err is None and out["image"].shape[0] == n and (out["error"] == b"").all(), (v, err)
