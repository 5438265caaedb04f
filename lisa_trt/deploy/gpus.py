"""The devices `lisa-trt plan` knows: memory as CUDA reports it, what the system keeps, peak memory
bandwidth, and whether host and GPU share the memory (Jetson); or any device given by its memory."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ..errors import InputError

MIB, GIB = 1 << 20, 1 << 30
DEFAULT_GPU = "rtx4090"  # the project's target GPU


@dataclass(frozen=True)
class GPU:
    """A device: total memory as CUDA reports it, less what the system keeps, and its peak memory
    bandwidth (GB/s, 1e9 bytes; 0: unknown)."""

    name: str
    label: str
    total: int
    reserved: int = 0  # Jetson: unified memory the OS and the CPU side of the process keep
    bandwidth: float = 0.0
    unified: bool = False  # host and GPU share the memory (Jetson): a plan read into host memory costs it too
    fp16_tflops: float = 0.0  # dense tensor-core peak, fp16 inputs with fp32 accumulate (0: unknown)
    fp8_tflops: float = 0.0  # dense fp8 (fp32 accumulate); 0: no fp8 tensor cores / unknown
    int8_tops: float = 0.0  # dense int8

    def peak_tflops(self, precision: str) -> float:
        """Dense tensor-core peak for a plan precision's matmuls (fp32 / bf16 / fp16 / int4: the fp16 figure,
        int4 weights being dequantised to fp16; int8 / fp8 their own, the fp16 one where unknown)."""
        if precision == "int8" and self.int8_tops:
            return self.int8_tops
        if precision == "fp8" and self.fp8_tflops:
            return self.fp8_tflops
        return self.fp16_tflops

    @property
    def usable(self) -> int:
        return self.total - self.reserved


# totals: nvidia-smi's "MiB" of each board (desktop / data-centre); Jetson AGX Orin: the module's
# unified LPDDR5, of which an estimated 4 GiB stays with the OS and the CPU side of the process.
# bandwidths: NVIDIA's product specifications / datasheets (peak): RTX 4090 1008 GB/s (GeForce RTX 4090
# specs: 21 Gbps GDDR6X, 384-bit); L4 300 GB/s (L4 datasheet); A10 600 GB/s (A10 datasheet); A100 40 GB
# 1555 GB/s, A100 80 GB SXM 2039 GB/s (A100 datasheet; 80 GB PCIe: 1935); H100 SXM 3.35 TB/s (H100
# datasheet; PCIe: 2.0); H200 4.8 TB/s (H200 datasheet); Jetson AGX Orin 32 / 64 GB 204.8 GB/s
# (Jetson AGX Orin series datasheet: 256-bit LPDDR5).
# dense tensor-core peaks (TFLOPS / TOPS, no sparsity: half of the datasheets' "with sparsity" figures):
# RTX 4090 fp16 with fp32 accumulate 165.2, fp8 (fp32 accumulate) 330.3, int8 660.6 (NVIDIA Ada GPU
# architecture whitepaper, GeForce RTX 4090 column; GeForce boards run fp16-with-fp32-accumulate at half
# the fp16-accumulate rate); L4 fp16 121, fp8 242.5, int8 242.5 (L4 datasheet); A10 fp16 125, int8 250
# (A10 datasheet, no fp8); A100 fp16 312, int8 624 (A100 datasheet, no fp8); H100 SXM fp16 989.4, fp8
# 1978.9, int8 1978.9 (H100 datasheet; H200: the same GH100 peaks, H200 datasheet). Jetson: unknown (0).
GPUS = {g.name: g for g in (
    GPU("rtx4090", "GeForce RTX 4090 24 GB", 24564 * MIB, bandwidth=1008.0, fp16_tflops=165.2, fp8_tflops=330.3,
        int8_tops=660.6),
    GPU("l4", "NVIDIA L4 24 GB", 23034 * MIB, bandwidth=300.0, fp16_tflops=121.0, fp8_tflops=242.5, int8_tops=242.5),
    GPU("a10", "NVIDIA A10 24 GB", 23028 * MIB, bandwidth=600.0, fp16_tflops=125.0, int8_tops=250.0),
    GPU("a100-40", "NVIDIA A100 40 GB", 40960 * MIB, bandwidth=1555.0, fp16_tflops=312.0, int8_tops=624.0),
    GPU("a100-80", "NVIDIA A100 80 GB", 81920 * MIB, bandwidth=2039.0, fp16_tflops=312.0, int8_tops=624.0),
    GPU("h100", "NVIDIA H100 80 GB", 81559 * MIB, bandwidth=3350.0, fp16_tflops=989.4, fp8_tflops=1978.9,
        int8_tops=1978.9),
    GPU("h200", "NVIDIA H200 141 GB", 143771 * MIB, bandwidth=4800.0, fp16_tflops=989.4, fp8_tflops=1978.9,
        int8_tops=1978.9),
    GPU("orin-32", "Jetson AGX Orin 32 GB", 32 * GIB, 4 * GIB, bandwidth=204.8, unified=True),
    GPU("orin-64", "Jetson AGX Orin 64 GB", 64 * GIB, 4 * GIB, bandwidth=204.8, unified=True),
)}


def gpu_name(gpu: str) -> str:
    """The GPUS key of a GPU name in any case; InputError naming --memory-gib for an unknown one."""
    key = str(gpu).lower()
    if key not in GPUS:
        raise InputError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}. For another device give its memory "
                         "instead: --memory-gib N (e.g. --memory-gib 32)")
    return key


def resolve_gpu(gpu=None, memory_gib: Optional[float] = None) -> GPU:
    """A named GPU (or a GPU itself), or a device of `memory_gib` GiB (not both; neither: DEFAULT_GPU)."""
    if gpu is not None and memory_gib is not None:
        raise InputError("give either --gpu NAME or --memory-gib N, not both")
    if isinstance(gpu, GPU):
        return gpu
    if gpu is None and memory_gib is None:
        gpu = DEFAULT_GPU
    if gpu is not None:
        return GPUS[gpu_name(gpu)]
    if not memory_gib > 0:
        raise InputError(f"--memory-gib must be a positive number of GiB, got {memory_gib}")
    return GPU(f"{memory_gib:g}GiB", f"a device with {memory_gib:g} GiB", int(memory_gib * GIB))


# torch.cuda.get_device_name patterns -> GPUS keys ("{mem}": the size decides, A100 40 / 80 GB, Orin 32 / 64
# GB). H100 PCIe is left out: its bandwidth and peaks are below the SXM board's the table holds.
_CUDA_NAMES = ((r"RTX 4090", "rtx4090"), (r"\bH200\b", "h200"), (r"\bH100\b(?!.*PCIe)", "h100"),
               (r"\bA100\b", "a100-{mem}"), (r"\bL4\b", "l4"), (r"\bA10\b", "a10"), (r"Orin", "orin-{mem}"))


def gpu_from_cuda_name(name: str, total_bytes: int) -> Optional[str]:
    """The GPUS key of a CUDA device (its torch.cuda.get_device_name and total memory); None for a
    device the table does not know (its peaks unknown: plan it with --memory-gib)."""
    for pattern, key in _CUDA_NAMES:
        if re.search(pattern, name, re.IGNORECASE):
            if key == "a100-{mem}":
                return "a100-80" if total_bytes > 48 * GIB else "a100-40"
            if key == "orin-{mem}":
                return "orin-64" if total_bytes > 40 * GIB else "orin-32"
            return key
    return None


def visible_gpu() -> Optional[GPU]:
    """The GPUS entry of the visible CUDA device 0; None without CUDA or for a device not in the table."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
    except Exception:  # noqa: BLE001 - a broken CUDA setup is the backend's to report
        return None
    key = gpu_from_cuda_name(props.name, props.total_memory)
    return GPUS.get(key) if key else None


__all__ = ["DEFAULT_GPU", "GPU", "GPUS", "gpu_from_cuda_name", "gpu_name", "resolve_gpu", "visible_gpu"]
