"""Backends behind one graph-runner protocol (engines/base.py); `engines.graph.load_engines(dir, backend)`
opens any of them (ort, trt, torch, or one registered with `engines.base.register_backend`)."""
