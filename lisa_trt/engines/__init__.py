"""Backends behind one protocol (engines/base.py): torch eager, ONNX Runtime, TensorRT."""
