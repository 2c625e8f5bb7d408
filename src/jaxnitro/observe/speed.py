"""An epoch's training speed: steps and samples a second, and model FLOPs
utilisation (MFU) where the device's peak is known.

MFU is the share of the device's peak matrix throughput the step's own FLOPs
(XLA's cost analysis of the train program, per device) fill over the measured step
time: `flops / step_seconds / peak`. The peak is the bf16 dense figure of the
device (`devices/peaks.py`); a device the table does not know has no MFU.

    >>> epoch_speed(0.01, 128, 1e12, 197e12)
    {'steps_per_sec': 100.0, 'samples_per_sec': 12800.0, 'mfu': 0.5076...}
    >>> epoch_speed(0.01, 128, 1e12, None)
    {'steps_per_sec': 100.0, 'samples_per_sec': 12800.0}
"""

from __future__ import annotations

from ..devices.peaks import peak_flops


def epoch_speed(
    step_seconds: float,
    samples_per_step: int,
    flops_per_step: float | None,
    peak: float | None,
) -> dict[str, float]:
    """The speed figures of an epoch whose optimizer steps took `step_seconds`
    each and took `samples_per_step` samples each (the global batch, every
    micro-batch of it): `mfu` only where both the step's FLOPs and the peak are
    known."""
    speed = {
        "steps_per_sec": 1.0 / step_seconds,
        "samples_per_sec": samples_per_step / step_seconds,
    }
    if flops_per_step is not None and peak is not None and flops_per_step > 0:
        speed["mfu"] = flops_per_step / step_seconds / peak
    return speed


def device_peak(device: object) -> float | None:
    """The bf16 dense peak of `device` (a `jax.Device`), or None when unknown."""
    return peak_flops(str(getattr(device, "device_kind", "")))
