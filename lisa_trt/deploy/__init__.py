"""Deployment tools over the engines: `lisa-trt build` (TensorRT engines through Polygraphy), the CPU-side
TensorRT lint of exported graphs, the memory plan (`lisa-trt plan`), model shapes and the operator audit.

The runners that execute engines live in engines/; loading a built plan is engines/trt_plans.py.
"""
