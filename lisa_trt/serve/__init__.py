"""Serving on NVIDIA Triton Inference Server: `lisa-trt serve` (PyTriton, CPU or GPU) and
`lisa-trt triton-repo` (a model repository for the Triton container on GPU servers).

model.py holds the framework-free request handling both share; server.py the PyTriton
process; repo.py the repository writer; client.py a small tritonclient helper; openai_api.py the OpenAI
Images API in front of Triton (`serve --openai-port`, `lisa-trt openai-api`), with openai_request.py
(its request checks) and openai_images.py (its response bodies and streaming events).
PyTriton is optional (`pip install 'lisa-trt[serve]'`); importing this package does not need it.
"""
