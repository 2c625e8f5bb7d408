"""`export_model`: the export sequence, from a handle to a bundle on disk.

In order: check the hooks against each other and the batch rule, build example wire
arrays, check that nothing traced is device-resident, run the program eagerly once
to verify the output shapes, merge the provenance, and call the backend's
`write_export` under the `ExportCompiling` phase. The bundle is written into a
temporary folder beside its destination and renamed into place, so an interrupted
export never leaves a partial bundle.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ..checkpoint.modes import follow_umask
from ..errors import ConfigError, HookError
from ..observe import phases
from .backend import ExportBackend, ExportRequest
from .contract import ExportContract, check_outputs, read_contract
from .program import ExportProgram
from .provenance import export_facts, export_provenance, merge_provenance
from .provenance import site_provenance as default_site_provenance
from .view import check_host_resident, export_view

PROBE_FAILED = (
    "export_model: the program failed on example wire inputs ({inputs}) in an eager "
    "probe: {error}. The wire dtypes and shapes come from export_inputs; when "
    "forward cannot take them as they are, convert them in export_preprocess (e.g. "
    "`return {{'x': x.astype(jnp.float32) / 255}}`) or fix the declared dtype."
)


def export_model(
    nitro: Any,
    backend: ExportBackend,
    *,
    dir: str | os.PathLike[str],
    name: str,
    batch_sizes: Sequence[int] = (1,),
    provenance_root: str | os.PathLike[str] | None = None,
    provenance: Mapping[str, Any] | None = None,
) -> str:
    """Export a handle's model and weights to `backend`; return the path written.

    The weights are those `predict` reads: the EMA (or the averaged weights a
    `weights=Average(...)` restore loaded) when the handle evaluates with them.
    Device fields are baked into the program at their current values.

    Args:
        nitro: the `Nitro` to export (trained or restored; one device).
        backend: the format, such as `StableHLOBundle()`.
        dir: the folder the bundle is created in (made if missing).
        name: the bundle's folder name inside `dir`; it must not exist yet.
        batch_sizes: the batch sizes to compile a program for, each >= 1.
        provenance_root: a folder inside the git work tree of the code that
            produced the model; None records no repository state.
        provenance: entries that override every other provenance layer.

    Returns:
        str: the bundle's path, `dir/name`.

    Raises:
        HookError: the export hooks disagree with each other or with forward (an
            output naming nothing, an echo without `from_`, a dtype forward cannot
            take, ...), before anything is written.
        ConfigError: a bad name or batch size, an existing bundle at `dir/name`,
            a backend without `write_export`, or a traced value that is
            device-resident.

    Example::

        nitro = nx.Nitro(MyExp(), weights=("latest", "best"), data={})
        path = nx.export_model(nitro, nx.StableHLOBundle(), dir="export", name="v1")
        model = nx.load_bundle(path)
        model(x=images)["logits"]
    """
    if isinstance(backend, type) or not isinstance(backend, ExportBackend):
        raise ConfigError(
            f"export_model: backend={backend!r} is not an export backend (an object "
            "with write_export). Pass an instance, such as StableHLOBundle()."
        )
    sizes = _checked_sizes(batch_sizes)
    target = _checked_target(dir, name)
    e = nitro.experiment
    contract = read_contract(e)
    prepared = nitro.prepared
    cls = type(e)
    preprocess = getattr(cls, "export_preprocess", None)
    program = ExportProgram(
        view=export_view(e),
        model=prepared.model,
        forward=prepared.hooks["forward"],
        preprocess=preprocess,
        fields=prepared.routing.fields["forward"],
        inputs=contract.inputs,
        outputs_spec=contract.outputs,
    )
    examples = tuple(
        np.zeros((sizes[0], *spec.shape[1:]), spec.dtype)  # type: ignore[index]
        for spec in contract.inputs
    )
    params = jax.device_get(nitro.train_state.eval_params(nitro.config.eval_weights))
    state = jax.device_get(nitro.states)
    check_host_resident(f"export_view({cls.__name__})", program.view)
    check_host_resident("the weights", (params, state))
    outputs = _probe_outputs(program, contract, params, state, examples)
    completed = check_outputs(
        contract, outputs, lambda out: program.select(out, examples), sizes[0]
    )
    contract = type(contract)(
        inputs=contract.inputs,
        outputs=completed,
        client_inputs=contract.client_inputs,
        client_outputs=contract.client_outputs,
        postprocess=contract.postprocess,
    )
    merged = merge_provenance(
        export_facts(name=name, batch_sizes=sizes),
        export_provenance(nitro),
        default_site_provenance(backend, provenance_root),
        e.export_provenance_extra(checkpoint=nitro.checkpoint_source),
        dict(provenance or {}),
    )
    os.makedirs(target.parent, exist_ok=True)
    temporary = tempfile.mkdtemp(
        prefix=f".{name}.", suffix=".partial", dir=target.parent
    )
    request = ExportRequest(
        dir=temporary,
        name=name,
        contract=contract,
        batch_sizes=sizes,
        provenance=merged,
    )
    _write_bundle(
        nitro, backend, program, params, state, examples, request=request, target=target
    )
    return target.path


def _probe_outputs(
    program: ExportProgram,
    contract: ExportContract,
    params: Any,
    state: Any,
    examples: tuple[np.ndarray, ...],
) -> Any:
    """The program's outputs on the example wire inputs, run eagerly once; a
    failure that is not already a hook or configuration error is reported as the
    wire contract's (`PROBE_FAILED`)."""
    try:
        return program.outputs(params, state, *examples)
    except (HookError, ConfigError):
        raise
    except Exception as error:
        shown = ", ".join(
            f"{s.name}: {s.dtype}{list(s.shape or ())}" for s in contract.inputs
        )
        raise HookError(PROBE_FAILED.format(inputs=shown, error=error)) from error


def _write_bundle(
    nitro: Any,
    backend: ExportBackend,
    program: ExportProgram,
    params: Any,
    state: Any,
    examples: tuple[np.ndarray, ...],
    *,
    request: ExportRequest,
    target: _Target,
) -> None:
    """Have `backend` write the bundle into `request.dir` (a temporary folder) and
    rename it to `target.path`, under the ExportCompiling phase; on any failure
    the temporary folder is removed and the phase restored."""
    temporary = request.dir
    recorder = nitro.phase_recorder  # the phase the handle's monitors see
    previous = recorder.phase
    recorder.set(phases.ExportCompiling(), name=request.name)
    try:
        backend.write_export(program, params, state, examples, request)
        # mkdtemp's folder is drwx------ and a writer may leave -rw------- files
        # (safetensors does): a bundle follows the process umask like any output.
        follow_umask(temporary)
        os.rename(temporary, target.path)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        recorder.restore(previous)
        raise
    recorder.restore(previous)


class _Target:
    def __init__(self, parent: str, path: str) -> None:
        self.parent = parent
        self.path = path


def _checked_target(dir: str | os.PathLike[str], name: str) -> _Target:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name:
        raise ConfigError(
            f"export_model: name={name!r} must be a non-empty folder name without a "
            "slash, such as 'my_model_v1'."
        )
    parent = os.path.abspath(os.fspath(dir))
    path = os.path.join(parent, name)
    if os.path.exists(path):
        raise ConfigError(
            f"export_model: {path} exists already. A bundle is never overwritten: "
            "pass another name (e.g. a version suffix) or remove the old bundle."
        )
    return _Target(parent, path)


def _checked_sizes(batch_sizes: Sequence[int]) -> tuple[int, ...]:
    sizes = tuple(batch_sizes)
    if (
        not sizes
        or not all(
            isinstance(n, int | np.integer) and not isinstance(n, bool) for n in sizes
        )
        or any(n < 1 for n in sizes)
        or len(set(sizes)) != len(sizes)
    ):
        raise ConfigError(
            f"export_model: batch_sizes={list(sizes)} must be a non-empty list of "
            "distinct whole numbers >= 1, such as [1, 8, 32]."
        )
    return tuple(int(n) for n in sizes)
