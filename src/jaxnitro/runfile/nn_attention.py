"""Where each of `gpt`'s attentions compiles, and the refusal of one that does not
compile on the run's backend ("xla" and "auto" compile everywhere; "flash" on a
TPU, `nn_flash`; "cudnn" on an NVIDIA GPU, `nn_cudnn`).

The fronts ask when they build a model's parameters, before anything compiles.
Asking for the backend starts it, so neither building nor tracing the module asks:
a run file is checked and its programs traced before the run's processes join
(`nitro launch`), when no backend may start.
"""

from __future__ import annotations

from . import nn_cudnn, nn_flash

AUTO_ATTENTION = {"tpu": "flash"}
"""What "auto" compiles to, by JAX platform; "xla" on any other. On a TPU v5e at
GPT-2 small (batch 16 x 1024, bf16) "flash" trained at 1.316x the tokens/s of the
hand-written loop with the written-out attention (`benchmarks/README.md`)."""


def compiled_attention(attention: str, platform: str) -> str:
    """The attention `attention` compiles to on JAX `platform` ("tpu", "cpu",
    "cuda", ...): "auto" resolved by AUTO_ATTENTION, any other name itself.

        >>> compiled_attention("auto", "tpu"), compiled_attention("auto", "cpu")
        ('flash', 'xla')
    """
    if attention != "auto":
        return attention
    return AUTO_ATTENTION.get(platform, "xla")


def _requirement(attention: str) -> tuple[tuple[str, ...], str] | None:
    """The backends `attention` compiles for and its refusal elsewhere; None for
    one that compiles on any backend ("xla"; "auto", which is "xla" wherever it
    is not a kernel). Read from its module at each call (a test may widen the
    backends)."""
    if attention == "flash":
        return nn_flash.FLASH_BACKENDS, nn_flash.FLASH_OFF_TPU
    if attention == "cudnn":
        return nn_cudnn.CUDNN_BACKENDS, nn_cudnn.CUDNN_OFF_GPU
    return None


def attention_unavailable(attention: str) -> str | None:
    """The run's backend (the one `setup_devices` pinned, else JAX's default) when
    `attention` does not compile for it, else None. For "flash" and "cudnn" it
    starts the backend: call it when a model's parameters are built, not while a
    run file is checked."""
    requirement = _requirement(attention)
    return None if requirement is None else _outside(requirement[0])


def _outside(backends: tuple[str, ...]) -> str | None:
    """The run's backend when it is not one of `backends`, else None."""
    # The engine's public face, as everywhere in the run-file package;
    # `setup_devices()` without arguments only reports (joining the run first
    # under a launcher, so even an early call breaks nothing).
    import jaxnitro as nx

    backend = str(nx.setup_devices()["backend"])
    return None if backend in backends else backend


def check_attention_backend(attention: str, owner: str, fix: str) -> None:
    """Refuse an `attention` that does not compile on the run's backend ("flash"
    off a TPU, "cudnn" off a GPU); "xla" passes without asking for the backend.

    Raises:
        ValueError: that attention's message (`nn_flash.FLASH_OFF_TPU`,
            `nn_cudnn.CUDNN_OFF_GPU`), naming `owner`, the backend and `fix`.
    """
    requirement = _requirement(attention)
    if requirement is None:
        return
    backends, message = requirement
    backend = _outside(backends)
    if backend is not None:
        raise ValueError(message.format(owner=owner, backend=backend, fix=fix))
