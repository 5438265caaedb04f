"""The bundled demo model: data, quality scorer and the `demo` name registry.

Importing this package registers the `demo` target and VQ configs (see registry.py).
"""

from .data import CLASS_NAMES, NUM_CLASSES  # noqa: F401
from . import registry  # noqa: F401,E402  (registers "demo")
