"""The bundled demo model: data, quality scorer and the `demo` name registry.

Importing this package registers the `demo` target config (see registry.py).
"""

from .data import CLASS_NAMES, NUM_CLASSES  # noqa: F401
