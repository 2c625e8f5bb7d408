"""The `nitro_*` tools as plain functions over a `RunRegistry`, rooted at a folder.

`AgentTools` is everything the MCP server does, without the SDK: each method takes
JSON-shaped arguments and returns plain data (dicts, lists, strings, numbers), so the
server only registers them. The verbs (train, validate, evaluate, predict, export)
start a background run and return its id at once; the rest read a run or the process.
A bad argument raises `ConfigError` (the server turns it into a tool error); nothing a
client sends is evaluated, and every path is resolved under the root.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..checkpoint.run_listing import runs
from ..compile.cache import cache_stats
from ..devices.process import setup_devices
from ..errors import ConfigError
from ..export.bundle import StableHLOBundle
from ..export.sequence import export_model
from ..observe.counter import progress_counter
from ..observe.history_text import history_table, render_text
from ..run.config import check_settings
from ..run.handle import Nitro
from .inputs import checked_batch
from .loader import build_experiment, experiment_class, under_root
from .registry import BackgroundRun, RunRegistry

# Run keywords a client may pass: settings that name no path and no object.
CLIENT_KEYWORDS = (
    "max_epochs",
    "max_steps",
    "val_every_n_steps",
    "checkpoint_every_n_steps",
    "precision",
    "n_devs",
    "sharding",
    "seed",
    "accum",
    "resume",
    "log_every_n_steps",
    "check_divergence",
    "gradient_clip_norm",
    "restore_best",
)
PREDICT_ROWS = 8  # rows of each output a predict result shows
# The arguments that build a new handle: meaningless beside run= (an existing one).
NEW_HANDLE_KEYS = ("preset", "overrides", "run_dir", "keywords")
SETUP_NOTE = (
    "Called with no arguments it only reports. backend (cpu, gpu, cuda, rocm, tpu) "
    "chooses among the devices the server process started with, and n_devs pins "
    "the device count every later run shards its batch over (an n_devs run keyword "
    "still wins); to choose which GPUs the server sees, set CUDA_VISIBLE_DEVICES "
    "before starting `nitro mcp`."
)


class AgentTools:
    """The tool functions of `nitro mcp`, over one root folder and one registry.

    Args:
        root: the folder experiments are read from and runs write under.
        max_runs: how many background runs may be active at once.

    Raises:
        ConfigError: `root` is not a directory, or `max_runs` is not an int >= 1.
    """

    def __init__(self, root: str | os.PathLike[str], *, max_runs: int = 2) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ConfigError(
                f"the agent server's root {str(root)!r} is not a directory. Pass "
                f"--root DIR naming the folder that holds the experiment files."
            )
        if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
            raise ConfigError(
                f"max_runs (nitro mcp --max-runs) must be an int >= 1, got "
                f"{max_runs!r}: how many background runs may be active at once."
            )
        self.registry = RunRegistry(max_active=max_runs)

    # ------------------------------------------------------------ process -------
    def setup(
        self, backend: str | None = None, n_devs: int | None = None
    ) -> dict[str, Any]:
        """`setup_devices(backend, n_devs)`: the process's backend and n_devs pin
        for every later run, and the report of what is in effect."""
        return {**setup_devices(backend, n_devs), "note": SETUP_NOTE}

    def cache(self) -> dict[str, int]:
        """The compile cache counters: hits, misses, entries."""
        return cache_stats()

    def runs(self, run_dir: str) -> list[dict[str, Any]]:
        """The runs a run directory under the root holds, most recent first."""
        path = under_root(self.root, run_dir)
        if path.exists() and not path.is_dir():
            raise ConfigError(
                f"runs: run_dir={run_dir!r} is a file ({path}), not a run directory. "
                f"Pass the folder a run wrote into, such as 'runs/ClassName' "
                f"(nitro_status shows a run's run_dir)."
            )
        return [_summary_data(s) for s in runs(path)]

    # ------------------------------------------------------------ verbs ---------
    def train(
        self,
        experiment: str,
        preset: str | None = None,
        overrides: dict[str, Any] | None = None,
        run_dir: str | None = None,
        keywords: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Start training `experiment` in the background; return its run id."""
        cls, e, kwargs = self._prepare(experiment, preset, overrides, run_dir, keywords)
        run = self.registry.start(
            "train",
            experiment,
            build=lambda run: Nitro(e, **kwargs),
            work=lambda run: _train(run),
        )
        return _started(run)

    def validate(self, **source: Any) -> dict[str, Any]:
        """Start `validate()` on a run's handle or a new one; return its run id."""
        return self._eval_verb("validate", lambda run: run.handle.validate(), source)

    def evaluate(self, split: str = "test", **source: Any) -> dict[str, Any]:
        """Start `evaluate(split)` on a run's handle or a new one."""
        if not isinstance(split, str):
            raise ConfigError(
                f"evaluate split={split!r} must be a split name (a string) such as "
                f"'test'."
            )
        if "run" in source:
            _check_split("evaluate", split, self._handle(source["run"]))
        return self._eval_verb(
            "evaluate", lambda run: run.handle.evaluate(split), source
        )

    def predict(
        self,
        split: str | None = "test",
        inputs: dict[str, Any] | None = None,
        **source: Any,
    ) -> dict[str, Any]:
        """Start `predict` on a split of the handle's data, or on `inputs` (field ->
        nested lists, batch axis first); the result shows each output's shape and
        first rows."""
        if inputs is not None:
            batch = {k: _array(k, v) for k, v in _checked_inputs(inputs).items()}
            if "run" in source:
                batch = checked_batch(batch, self._handle(source["run"]))

            def predict_inputs(run: BackgroundRun) -> dict[str, Any]:
                checked = checked_batch(batch, run.handle)
                return _predicted([run.handle.predict(checked)])

            return self._eval_verb("predict", predict_inputs, source)
        if not isinstance(split, str):
            raise ConfigError(
                f"predict split={split!r} must be a split name (a string) such as "
                f"'test', or pass inputs={{field: rows}}."
            )
        if "run" in source:
            _check_split("predict", split, self._handle(source["run"]))

        def work(run: BackgroundRun) -> dict[str, Any]:
            data = run.handle.data
            if split not in data:
                raise ConfigError(
                    f"predict: the handle has no split {split!r}; its splits: "
                    f"{', '.join(sorted(data)) or 'none'}. Pass split= one of them, "
                    f"or inputs={{field: rows}}."
                )
            return _predicted(run.handle.predict(data[split]))

        return self._eval_verb("predict", work, source)

    def export(
        self,
        name: str,
        dir: str = "export",
        batch_sizes: list[int] | None = None,
        **source: Any,
    ) -> dict[str, Any]:
        """Start exporting the handle's model as a StableHLO bundle `dir/name`."""
        target = under_root(self.root, dir)
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise ConfigError(
                f"export name={name!r} must be a non-empty folder name without a "
                f"slash, such as 'my_model_v1'."
            )
        bundle = under_root(self.root, target / name)
        if bundle.exists():
            raise ConfigError(
                f"export: {bundle} exists already. A bundle is never overwritten: "
                f"pass another name (e.g. a version suffix)."
            )
        sizes = _checked_batch_sizes(batch_sizes)
        return self._eval_verb(
            "export",
            lambda run: {
                "path": export_model(
                    run.handle,
                    StableHLOBundle(),
                    dir=target,
                    name=name,
                    batch_sizes=sizes,
                )
            },
            source,
        )

    # ------------------------------------------------------------ runs ----------
    def status(self, run_id: str | None = None) -> dict[str, Any]:
        """One run's status, or every run's when `run_id` is None."""
        if run_id is None:
            return {
                "runs": [_status(r) for r in self.registry.all()],
                "max_runs": self.registry.max_active,
                "progress_counter": progress_counter(),
                "cache": cache_stats(),
            }
        return _status(self.registry.get(run_id))

    def stop(self, run_id: str) -> dict[str, Any]:
        """Ask a run to stop at its next step boundary; returns at once."""
        run = self.registry.get(run_id)
        if not run.active:
            return {"run": run.id, "state": run.state, "stopping": False}
        run.request_stop()
        return {"run": run.id, "state": run.state, "stopping": True}

    def logger(self, run_id: str) -> dict[str, Any]:
        """Where a run's logger writes (`logger_info`)."""
        handle = self._handle(run_id)
        return _plain(handle.logger_info)

    def history(self, run_id: str) -> dict[str, Any]:
        """A run's history: the table as text and the rows as data."""
        h = self._handle(run_id).history
        text = render_text(history_table(h, height=60, width=120))
        return {
            "text": text,
            "columns": list(h.columns),
            "rows": [_plain(row) for row in h],
            "best_epoch": h.best_epoch,
        }

    def shutdown(self, timeout: float = 60.0) -> list[str]:
        """Stop every active run gracefully; the ids still active after `timeout`."""
        return self.registry.shutdown(timeout)

    # ------------------------------------------------------------ helpers -------
    def _handle(self, run_id: str) -> Any:
        run = self.registry.get(run_id)
        if run.handle is None:
            raise ConfigError(
                f"run {run_id} has no handle yet ({run.state}"
                + (f": {run.error}" if run.error else "")
                + "). Poll nitro_status until it is running."
            )
        return run.handle

    def _prepare(
        self,
        experiment: str,
        preset: str | None,
        overrides: dict[str, Any] | None,
        run_dir: str | None,
        keywords: dict[str, Any] | None,
    ) -> tuple[type, Any, dict[str, Any]]:
        """Everything a new handle needs, checked before any thread starts."""
        if not isinstance(experiment, str):
            raise ConfigError(
                f"experiment={experiment!r} must be a string "
                f"`path/to/file.py:ClassName`."
            )
        if preset is not None and not isinstance(preset, str):
            raise ConfigError(
                f"preset={preset!r} must be a preset name (a string) or null."
            )
        if overrides is not None and not isinstance(overrides, dict):
            raise ConfigError(
                f"overrides={overrides!r} must be an object of field name -> JSON "
                f"scalar, such as {{'width': 16}}."
            )
        if run_dir is not None and not isinstance(run_dir, str):
            raise ConfigError(
                f"run_dir={run_dir!r} must be a folder under the server's root (a "
                f"string), such as 'runs/MyExperiment'."
            )
        cls = experiment_class(self.root, experiment)
        e = build_experiment(cls, preset, overrides)
        kwargs = _checked_keywords(keywords)
        where = run_dir if run_dir is not None else f"runs/{cls.__name__}"
        kwargs["run_dir"] = str(under_root(self.root, where))
        # Everything Nitro checks of its settings first, here, before any thread:
        # a keyword or field value it would refuse minutes later is refused now.
        check_settings(e, kwargs)
        return cls, e, kwargs

    def _eval_verb(
        self, verb: str, work: Any, source: dict[str, Any]
    ) -> dict[str, Any]:
        """Start `work` on the handle of run `source["run"]`, or on a new handle
        built from `source["experiment"]` (with preset, overrides, run_dir and
        keywords, as for train)."""
        run_id = source.pop("run", None)
        experiment = source.get("experiment")
        if (run_id is None) == (experiment is None) or not isinstance(
            run_id or experiment, str
        ):
            raise ConfigError(
                f"nitro_{verb} takes either run (the id of a run whose handle to use) "
                f"or experiment (`file.py:ClassName`, for a new handle), not "
                f"{'both' if run_id else 'neither'}."
            )
        if run_id is not None:
            extra = [k for k in NEW_HANDLE_KEYS if source.get(k) is not None]
            if extra:
                raise ConfigError(
                    f"nitro_{verb}: run={run_id!r} uses that run's handle as it was "
                    f"built, so {', '.join(extra)} would have no effect. Drop "
                    f"{', '.join(extra)}, or pass experiment= instead of run= for a "
                    f"new handle built with them."
                )
            handle = self._handle(run_id)
            run = self.registry.start(
                verb, run_id, build=lambda run: handle, work=work, uses=handle
            )
            return _started(run)
        assert isinstance(experiment, str)  # checked above
        _, e, kwargs = self._prepare(
            experiment,
            source.get("preset"),
            source.get("overrides"),
            source.get("run_dir"),
            source.get("keywords"),
        )
        run = self.registry.start(
            verb, experiment, build=lambda run: Nitro(e, **kwargs), work=work
        )
        return _started(run)


def _train(run: BackgroundRun) -> dict[str, Any]:
    run.handle.train()
    return {"stop_reason": run.handle.stop_reason}


def _started(run: BackgroundRun) -> dict[str, Any]:
    return {
        "run": run.id,
        "verb": run.verb,
        "target": run.target,
        "state": run.state,
        "note": "started in the background; poll nitro_status with this run id",
    }


def _status(run: BackgroundRun) -> dict[str, Any]:
    handle = run.handle
    now = cache_stats()
    status: dict[str, Any] = {
        "run": run.id,
        "verb": run.verb,
        "target": run.target,
        "state": run.state,
        # The handle's recorded phase (Done, not the Idle published after it).
        "phase": type(handle.phase).__name__
        if handle is not None
        else (run.phases[-1] if run.phases else None),
        "phases": list(run.phases),
        "progress_counter": progress_counter(),
        "cache": {
            "hits": now["hits"] - run.cache_at_start["hits"],
            "misses": now["misses"] - run.cache_at_start["misses"],
        },
        "stop_requested": run.stop_requested,
        "error": run.error,
        "traceback": run.traceback,
        "result": _plain(run.result),
        # Every key from the first poll on: None while the handle is being built.
        "step": None,
        "epoch": None,
        "stop_reason": None,
        "last_metrics": None,
        "run_dir": None,
    }
    if handle is not None:
        rows = handle.status.history
        status.update(
            step=handle.current_step,
            epoch=handle.current_epoch,
            stop_reason=handle.stop_reason,
            last_metrics=_plain(rows[-1]) if rows else None,
            run_dir=handle.run_dir,
        )
    return status


def _checked_keywords(keywords: dict[str, Any] | None) -> dict[str, Any]:
    if keywords is not None and not isinstance(keywords, dict):
        raise ConfigError(
            f"keywords={keywords!r} must be an object of run keyword -> JSON "
            f"scalar, such as {{'max_epochs': 3}}."
        )
    values = dict(keywords or {})
    for key, value in values.items():
        if key not in CLIENT_KEYWORDS:
            raise ConfigError(
                f"run keyword {key!r} is not one a client may pass. Allowed: "
                f"{', '.join(CLIENT_KEYWORDS)} (run_dir is its own argument; "
                f"keywords that name objects or other paths stay in the experiment "
                f"file)."
            )
        if not isinstance(value, bool | int | float | str | None):
            raise ConfigError(
                f"run keyword {key}={value!r} is a {type(value).__name__}; pass a "
                f"JSON scalar (a number, a string, true/false or null)."
            )
        if key == "resume" and value not in (True, False, "auto"):
            raise ConfigError(
                f"run keyword resume={value!r}: a client may pass true, false or "
                f'"auto" (resume from this run_dir); a checkpoint path is not '
                f"accepted, as it could name a file outside the root."
            )
    return values


def _checked_inputs(inputs: Any) -> dict[str, Any]:
    if not isinstance(inputs, dict) or not inputs:
        raise ConfigError(
            f"predict inputs must be an object of field name -> rows (nested lists "
            f"of numbers, batch axis first), got {inputs!r}."
        )
    for key, rows in inputs.items():
        if not isinstance(rows, list):
            raise ConfigError(
                f"predict inputs[{key!r}] must be a list of rows (batch axis first), "
                f"got a {type(rows).__name__}."
            )
    return inputs


def _array(key: str, rows: list[Any]) -> np.ndarray:
    """JSON rows as an array in JAX's default widths: float32 for real numbers,
    int32 for integers (JSON carries no dtype, and NumPy would pick 64 bits).

    Raises:
        ConfigError: the rows are ragged (rows of different lengths), or hold
            something other than numbers and booleans.
    """
    try:
        array = np.asarray(rows)
    except (ValueError, TypeError) as error:
        raise ConfigError(
            f"predict inputs[{key!r}] is ragged: its rows do not all have the same "
            f"shape ({error}). Pass rows of equal length, batch axis first, such "
            f"as [[0.1, 0.2], [0.3, 0.4]]."
        ) from None
    if array.dtype.kind == "f":
        return array.astype(np.float32)
    if array.dtype.kind in "iu":
        return array.astype(np.int32)
    if array.dtype.kind != "b" or array.ndim == 0:
        raise ConfigError(
            f"predict inputs[{key!r}] must hold numbers (nested lists, batch axis "
            f"first), got {_short(rows)} ({array.dtype.kind!r} values). Pass "
            f"numbers such as [[0.1, 0.2]]."
        )
    return array


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_split(verb: str, split: str, handle: Any) -> None:
    """Refuse a split the handle's data does not hold, naming the ones it does."""
    data = handle.data
    if split not in data:
        raise ConfigError(
            f"{verb}: the handle has no split {split!r}; its splits: "
            f"{', '.join(sorted(data)) or 'none'}. Pass split= one of them."
        )


def _checked_batch_sizes(sizes: Any) -> tuple[int, ...]:
    """`batch_sizes` of an export: a non-empty list of ints >= 1 (default [1])."""
    if sizes is None:
        return (1,)
    if (
        not isinstance(sizes, list | tuple)
        or not sizes
        or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes
        )
    ):
        raise ConfigError(
            f"export batch_sizes={sizes!r} must be a non-empty list of integers "
            f">= 1, the batch sizes the bundle serves, such as [1, 8]."
        )
    return tuple(sizes)


def _predicted(outputs: Any) -> dict[str, Any]:
    """How many batches ran, and each output leaf's shape, dtype and first rows."""
    batches = 0
    leaves: dict[str, dict[str, Any]] = {}
    for tree in outputs:
        batches += 1
        flat, _ = jax.tree_util.tree_flatten_with_path(tree)
        for path, leaf in flat:
            key = jax.tree_util.keystr(path) or "output"
            array = np.asarray(leaf)
            seen = leaves.setdefault(
                key,
                {"dtype": str(array.dtype), "rows": 0, "first": []},
            )
            seen["rows"] += array.shape[0] if array.ndim else 1
            seen["shape"] = list(array.shape[1:])
            room = PREDICT_ROWS - len(seen["first"])
            if room > 0:
                seen["first"] += _plain(array[:room].tolist())
    return {"batches": batches, "outputs": leaves}


def _summary_data(summary: Any) -> dict[str, Any]:
    return {
        "id": summary.id,
        "checkpoints": summary.checkpoints,
        "epochs": list(summary.epochs),
        "metric": summary.metric,
        "mode": summary.mode,
        "best": _plain(summary.best),
        "written": summary.written,
        "parent": summary.parent,
    }


def _plain(value: Any) -> Any:
    """`value` as JSON data: arrays to lists, NumPy scalars to numbers, non-finite
    floats to strings ("nan", "inf"), anything else to its repr."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray | jax.Array):
        return _plain(np.asarray(value).tolist())
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return repr(value)
