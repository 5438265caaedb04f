"""One caption through a real `lisa-trt serve ENGINE_DIR` (Triton on 127.0.0.1, bounded waits, the
server always stopped), for the prompted families' bundle tests; skips without the serve extra."""

import numpy as np
import pytest


def serve_one_caption(engine_dir, log_path, caption: str, seed: int):
    """(image, stats) the server returns for `caption`, and the Pipeline's image for the same
    prompt and seed (uint8 arrays). The served stats are checked here to be that decode's own: the
    same target forwards and MAL as the Pipeline's."""
    try:
        import pytriton.triton  # noqa: F401
        import tritonclient.http  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError, or pytriton broken by the numpy in this env
        pytest.skip(f"serving needs the serve extra (nvidia-pytriton, tritonclient): {e}")
    from lisa_trt.runtime.pipeline import Pipeline
    from lisa_trt.runtime.prompts import Prompt
    from lisa_trt.serve.client import LisaClient
    from lisa_trt.serve.process import ServerProcess

    with ServerProcess(engine_dir, log_path, backend="ort", threads=1, max_batch=2, stop_timeout=60) as server:
        client = LisaClient(server.url, timeout=300)
        try:
            img, st = client.generate(caption, seed=seed)
        finally:
            client.close()
    with Pipeline.from_dir(engine_dir, backend="ort", threads=1) as pipe:
        ref = pipe.generate([Prompt(0, caption=caption, seed=seed)], verify="auto", batch=True)
    want = ref.stats[0]
    assert st["forwards"] == want["forwards"] and st["mal"] == pytest.approx(want["mal"], rel=1e-6), (st, want)
    return img, st, np.asarray(ref.images[0])
