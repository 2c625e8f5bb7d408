"""`ExportHooks`: the export hooks' defaults, which `Experiment` inherits.

`jaxnitro.export_model` reads them: `export_inputs` and `export_outputs` raise,
naming the fix, since an export needs them; the others default to "nothing more"
(the wire inputs are the batch, no postprocess, no extra provenance).
"""

from __future__ import annotations

from typing import Any

from ..errors import HookError


class ExportHooks:
    """The export hooks (`jaxnitro.export_model`) with their defaults."""

    def export_inputs(self) -> list[Any]:
        """The tensors a client sends, in order: a list of `ExportSpec`. Required
        for `export_model`; the default raises.

        The order fixes the positional order the program is traced with and the
        tensor names in the bundle. Each spec needs a dtype and a shape whose first
        axis is the batch (its size a placeholder for each exported batch size).

        Raises:
            HookError: always, naming the fix: define the method.
        """
        raise HookError(
            f"export_model needs {type(self).__name__}.export_inputs: the tensors a "
            "client sends. Define it, e.g. `def export_inputs(self): return "
            "[ExportSpec('x', 'float32', (1, 8))]` (batch axis first)."
        )

    def export_outputs(self) -> list[Any]:
        """Which leaves of `forward`'s outputs ship, and under what names: a list of
        `ExportSpec`. Required for `export_model`; the default raises.

        Each spec's source (`from_`, else its name) is a key of the dict `forward`
        returns, or a wire input (an echo, which must declare `from_`); a bare
        array output takes exactly one spec. dtype and shape come from the trace;
        when given they are checked against it, the batch axis excluded.

        Raises:
            HookError: always, naming the fix: define the method.
        """
        raise HookError(
            f"export_model needs {type(self).__name__}.export_outputs: which outputs "
            "of forward ship. Define it, e.g. `def export_outputs(self): return "
            "[ExportSpec('logits')]`."
        )

    def export_preprocess(self, *wire: Any) -> Any:
        """Convert the wire inputs into the batch `forward` takes; traced into the
        exported program, and also called eagerly on host arrays by the probe.

        Args:
            *wire: one array per `export_inputs` spec, in order, batch axis first.

        Returns:
            dict[str, Any] | None: the batch forward routes its keywords from. The
            default, None, makes each wire input the batch field of its own name.
        """
        del wire
        return None

    def export_postprocess(self) -> str | None:
        """Python source that ships in the bundle as `postprocess.py`, for work
        that does not belong in the compiled graph (a softmax, a decode). The
        framework never runs it. The default, None, ships none."""
        return None

    def export_client_inputs(self) -> list[Any] | None:
        """What a client sends before the postprocess's counterpart runs, when it
        differs from the wire inputs: a list of `ExportSpec` with dtype and shape
        (axis letters and -1 axes allowed). Refused without `export_postprocess`.
        The default, None, means the wire inputs."""
        return None

    def export_client_outputs(self) -> list[Any] | None:
        """What a client receives after `export_postprocess` has run, when it
        differs from what the program emits: a list of `ExportSpec` with dtype and
        shape. Refused without `export_postprocess`. The default is None."""
        return None

    def export_provenance_extra(
        self, *, checkpoint: str | None = None
    ) -> dict[str, Any]:
        """The model's own provenance entries, merged over the framework's and the
        site's (and under `export_model`'s `provenance` argument).

        Args:
            checkpoint: the file the weights came from (`nitro.checkpoint_source`),
                or None for fresh weights.

        Returns:
            dict[str, Any]: JSON-serializable entries; the default is empty.
        """
        del checkpoint
        return {}
