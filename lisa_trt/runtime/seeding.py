"""The seeding rule of every image lisa-trt makes (`lisa-trt run`, Pipeline.generate, serve and
its OpenAI front end): image i of a request with base seed S draws every random number from a
generator of its own seeded with its prompt's own seed, else S + i (speculative/sampling.py
RowGenerators, the same generator the image gets as a row of any batch). So an image depends on
its prompt, its seed and the decoding settings only, never on the batch it was decoded in.

Torch-free: the OpenAI front end (a process with no model) numbers its rows with it.
"""

from __future__ import annotations

from typing import Optional


def image_seed(seed: int, index: int, own: Optional[int] = None) -> int:
    """The seed of image `index` of a request with base `seed` (its prompt's `own` seed wins)."""
    return int(own) if own is not None else int(seed) + int(index)


def image_seeds(seed: int, n: int) -> tuple:
    """The seeds of a request's n images that set no seed of their own."""
    return tuple(image_seed(seed, i) for i in range(int(n)))


__all__ = ["image_seed", "image_seeds"]
