"""TensorRT operator audit of lisa-trt bundles (lisa_trt/deploy/op_audit.py).

    python scripts/trt_op_audit.py demo=DIR fp16=DIR int8=DIR ... --json bench/trt_op_audit.json

Exit status 1 when a graph uses an op outside TensorRT's ONNX parser support table.
"""

import sys

from lisa_trt.deploy.op_audit import main

if __name__ == "__main__":
    sys.exit(main())
