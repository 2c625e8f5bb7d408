"""The peak dense matrix throughput of known accelerators, for model FLOPs
utilisation (MFU).

MFU is the FLOPs a step does by XLA's cost analysis of the compiled program,
divided by the step's time and the device's peak. The peaks below are the vendors'
dense (not sparse) bfloat16 matrix-unit figures per chip (per GPU), the figure MFU
is quoted against by nanoGPT, llm.c, MaxText and Levanter. A device not in the table
(a CPU, an unlisted GPU) has no peak: MFU is then reported as unknown, never guessed.

    >>> peak_flops("TPU v5 lite")
    197000000000000.0
    >>> peak_flops("cpu") is None
    True
"""

from __future__ import annotations

# (device_kind prefix, bf16 dense FLOP/s per chip), the longer prefix of two that
# share a start listed first: the first match wins.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("TPU v6 lite", 918e12),  # v6e (Trillium)
    ("TPU v5 lite", 197e12),  # v5e
    ("TPU v5p", 459e12),
    ("TPU v5", 459e12),  # v5p reports "TPU v5"
    ("TPU v4", 275e12),
    ("TPU v3", 123e12),
    ("TPU v2", 45e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H100", 989e12),  # SXM
    ("NVIDIA H200", 989e12),
    ("NVIDIA GH200", 989e12),
    ("NVIDIA A100", 312e12),
    ("Tesla V100", 125e12),
    ("NVIDIA L4", 121e12),
)


def peak_flops(device_kind: str) -> float | None:
    """The bf16 dense peak of one device of `device_kind` (JAX's
    `Device.device_kind`), in FLOP/s; None for a device the table does not know.

    >>> peak_flops("NVIDIA H100 80GB HBM3"), peak_flops("NVIDIA H100 PCIe")
    (989000000000000.0, 756000000000000.0)
    """
    for prefix, flops in PEAK_BF16_FLOPS:
        if device_kind.startswith(prefix):
            return flops
    return None
