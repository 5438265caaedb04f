"""The package version (core floor: importable without the rest of lisa_trt)."""

__version__ = "0.1.0"
