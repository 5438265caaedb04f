"""GPU plugins: the GASV Triton kernel (gasv_triton.py) and the TensorRT plugin (trt_plugin.py).

Nothing heavy is imported here: triton and tensorrt load only when their modules are imported.
"""
