"""Peak figures of known GPUs: memory bandwidth and dense throughput per kind of arithmetic.

A GPU is found by the device name an evaluation records (``environment["gpu"]``, e.g. "NVIDIA H100 80GB HBM3", or
the pool's model, e.g. Ray's "H100"). Figures are the vendor's datasheet peaks at boost clock, dense (half the
with-sparsity figure where a datasheet gives only that); docs/speed-of-light.md names the datasheet of each row.
They bound what any kernel can reach: a measured time below the floor they give is not plausible.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The kinds of arithmetic a workload's flops can run on. fp16 and bf16 tensor cores have the same peak on every GPU
# below; "fp32" is the CUDA cores' FMA rate (no tensor cores).
COMPUTE_KINDS = ("fp32", "tf32", "fp16", "bf16", "fp8")

T = 1e12


@dataclass(frozen=True)
class GpuSpec:
    name: str  # our name for the model, e.g. "H100 SXM"
    bandwidth: float  # bytes/s of device memory
    flops: dict[str, float]  # compute kind -> flop/s, dense
    source: str  # the datasheet the figures come from
    sms: int | None = None
    l2_mb: float | None = None

    def peak_flops(self, compute: str) -> float:
        """Flop/s of ``compute``; a kind the GPU lacks (FP8 before Hopper) runs at its fastest slower kind."""
        for kind in COMPUTE_KINDS[COMPUTE_KINDS.index(compute)::-1]:
            if kind in self.flops:
                return self.flops[kind]
        return self.flops["fp32"]

    def describe(self) -> str:
        kinds = ", ".join(f"{k.upper()} {self.flops[k] / T:.4g}" for k in ("fp32", "tf32", "bf16", "fp8")
                          if k in self.flops)
        layout = f"; {self.sms} SMs, {self.l2_mb:g} MB L2" if self.sms and self.l2_mb else ""
        return (f"{self.name}: memory bandwidth {self.bandwidth / T:.3g} TB/s; peak dense throughput {kinds} "
                f"TFLOPS (BF16 = FP16){layout}")


def _hopper(name: str, bandwidth: float, fp32: float, bf16: float, sms: int, l2: float, source: str) -> GpuSpec:
    """Hopper-class rows: TF32 is half the 16-bit tensor rate, FP8 twice it."""
    return GpuSpec(name, bandwidth * T, {"fp32": fp32 * T, "tf32": bf16 / 2 * T, "fp16": bf16 * T, "bf16": bf16 * T,
                                         "fp8": 2 * bf16 * T}, source, sms, l2)


_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet"

# (pattern over the lower-cased device name, spec); the first match wins, so variants come before the plain name.
KNOWN_GPUS: list[tuple[str, GpuSpec]] = [
    (r"h100.*nvl", _hopper("H100 NVL", 3.9, 60, 835.5, 132, 50, _H100)),
    (r"h100.*pcie", _hopper("H100 PCIe", 2.0, 51.2, 756.5, 114, 50, _H100)),
    (r"h100", _hopper("H100 SXM", 3.35, 67, 989.4, 132, 50, _H100)),
    (r"h200.*nvl", _hopper("H200 NVL", 4.8, 60, 835.5, 132, 50, _H200)),
    (r"h200", _hopper("H200 SXM", 4.8, 67, 989.4, 132, 50, _H200)),
    (r"b200", GpuSpec("B200", 8.0 * T, {"fp32": 75 * T, "tf32": 1125 * T, "fp16": 2250 * T, "bf16": 2250 * T,
                                        "fp8": 4500 * T}, "NVIDIA HGX B200 datasheet (per GPU)")),
    (r"a100.*pcie.*80|a100.*80.*pcie", GpuSpec("A100 PCIe 80GB", 1.935 * T, {"fp32": 19.5 * T, "tf32": 156 * T,
                                               "fp16": 312 * T, "bf16": 312 * T}, _A100, 108, 40)),
    (r"a100.*pcie", GpuSpec("A100 PCIe 40GB", 1.555 * T, {"fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T,
                                                          "bf16": 312 * T}, _A100, 108, 40)),
    (r"a100.*80", GpuSpec("A100 SXM 80GB", 2.039 * T, {"fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T,
                                                       "bf16": 312 * T}, _A100, 108, 40)),
    (r"a100", GpuSpec("A100 SXM 40GB", 1.555 * T, {"fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T,
                                                   "bf16": 312 * T}, _A100, 108, 40)),
    (r"l40s", GpuSpec("L40S", 0.864 * T, {"fp32": 91.6 * T, "tf32": 183 * T, "fp16": 362.05 * T, "bf16": 362.05 * T,
                                          "fp8": 733 * T}, "NVIDIA L40S datasheet", 142, 96)),
    (r"\bl4\b", GpuSpec("L4", 0.3 * T, {"fp32": 30.3 * T, "tf32": 60 * T, "fp16": 121 * T, "bf16": 121 * T,
                                        "fp8": 242.5 * T}, "NVIDIA L4 datasheet", 58, 48)),
]


def gpu_spec(device_name: str | None) -> GpuSpec | None:
    """The peak figures of the GPU called ``device_name``; None for a CPU or a GPU not in the table."""
    if not device_name or device_name == "cpu":
        return None
    lowered = device_name.lower()
    return next((spec for pattern, spec in KNOWN_GPUS if re.search(pattern, lowered)), None)
