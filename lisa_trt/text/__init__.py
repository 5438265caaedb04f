"""Caption conditioning, one floor below the runtime (runtime/conditions.py calls it): caption
prompts of the Pipeline and `lisa-trt run` (prompts.py), the caption inputs of train / calibrate / bench / generate (train.py) and
`lisa-trt encode-captions` (cli.py), for every family conditioned on caption features.

The caption and feature files are models/captions.py; each family's own text encoder is a
plug-in of its package (LlamaGen's FLAN-T5: families/llamagen/captions.py), reached through
models/captions.caption_encoder. transformers is an optional extra (`pip install lisa-trt[text]`);
it is imported only when a caption is actually encoded.
"""
