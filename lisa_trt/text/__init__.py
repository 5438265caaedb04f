"""Text conditioning for LlamaGen t2i targets: captions -> T5 features (+ mask), cached by caption hash.

transformers is an optional extra (`pip install lisa-trt[text]`); it is imported only when a
caption is actually encoded.
"""

from .encoder import (MAX_LENGTH, CaptionEncoder, caption_conds, check_captions_file, load_caption_features,
                      read_captions, save_caption_features)

__all__ = ["MAX_LENGTH", "CaptionEncoder", "caption_conds", "check_captions_file", "load_caption_features",
           "read_captions", "save_caption_features"]
