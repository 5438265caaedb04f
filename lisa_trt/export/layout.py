"""An engine directory's fixed names and the export defaults (no imports: every export module reads them).

Layout: the ONNX graphs and manifest.json, `weights.onnx.data` (the shared weights,
export/weights.py), `tables.safetensors` (LANTERN neighbours and the GASV constants), and
`weights/` for what no graph carries (`rest.safetensors`, Medusa heads) and, with
`--torch-weights`, the fp32 PyTorch weights.
"""

DEFAULT_OPSET = 23  # ONNX Attention (SDPA with a mask) needs opset >= 23
DEFAULT_MAX_TREE = 64
WEIGHT_FILES = {"target_weights": "weights/target.safetensors", "drafter_weights": "weights/drafter.safetensors",
                "vq_weights": "weights/vq.safetensors", "tables": "tables.safetensors"}
MEDUSA_WEIGHTS = "weights/medusa.safetensors"  # a Medusa bundle's "drafter_weights" (models/medusa.py format)
