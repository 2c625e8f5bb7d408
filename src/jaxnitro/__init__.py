"""jaxnitro: a training framework for JAX that compiles only when the graph changes.

An experiment is a class with marked fields plus hooks; `Nitro(e)` runs setup only, and
`train`, `validate`, `evaluate` and `predict` work on it, trained or not.

    import jaxnitro as nx

    class MyExp(nx.Experiment):
        width: nx.GraphConst[int] = 128       # bakes into the graph
        smoothing: nx.Device[float] = 0.05    # a traced input: sweep it for free
        max_epochs: int = 5                   # unmarked: Host, never traced
        ...

    nitro = nx.Nitro(MyExp())
    nitro.train()

The root holds what the README, the tutorial and the API reference's main entries use;
every other public name is reached through its subpackage (`jaxnitro.checkpoint`,
`jaxnitro.data`, `jaxnitro.export`, ...) and documented there. A name that used to be
at the root still resolves, with a DeprecationWarning naming its new import path.
"""

import warnings as _warnings
from typing import Any as _Any

from ._version import __version__ as __version__
from .checkpoint import Average as Average
from .checkpoint import Best as Best
from .checkpoint import Checkpointer as Checkpointer
from .checkpoint import CheckpointRecord as CheckpointRecord
from .checkpoint import Epochs as Epochs
from .checkpoint import Every as Every
from .checkpoint import Last as Last
from .checkpoint import Selector as Selector
from .checkpoint import TopKCheckpointer as TopKCheckpointer
from .checkpoint import average_checkpoints as average_checkpoints
from .checkpoint import checkpoint_filename as checkpoint_filename
from .checkpoint import checkpoint_info as checkpoint_info
from .checkpoint import checkpoint_run as checkpoint_run
from .checkpoint import load_checkpoint as load_checkpoint
from .checkpoint import read_manifest as read_manifest
from .checkpoint import runs as runs
from .checkpoint import selected_checkpoint as selected_checkpoint
from .compile import cache_stats as cache_stats
from .data import ArraySource as ArraySource
from .devices import Distributed as Distributed
from .devices import init_distributed as init_distributed
from .devices import rank as rank
from .devices import setup_devices as setup_devices
from .devices import world_size as world_size
from .errors import CheckpointError as CheckpointError
from .errors import ConfigError as ConfigError
from .errors import DistributedError as DistributedError
from .errors import DivergenceError as DivergenceError
from .errors import HookError as HookError
from .errors import MissingExtraError as MissingExtraError
from .errors import NitroError as NitroError
from .errors import NitroWarning as NitroWarning
from .errors import NotYetSupportedError as NotYetSupportedError
from .errors import Preempted as Preempted
from .errors import RoutingError as RoutingError
from .errors import RunDirLockedError as RunDirLockedError
from .errors import StaleHandleWarning as StaleHandleWarning
from .errors import StrippedHostError as StrippedHostError
from .experiment import Device as Device
from .experiment import Experiment as Experiment
from .experiment import GraphConst as GraphConst
from .experiment import Host as Host
from .experiment import StrippedHost as StrippedHost
from .experiment import compile_view as compile_view
from .experiment import config_metadata as config_metadata
from .experiment import device_fields as device_fields
from .experiment import dispatch_variant as dispatch_variant
from .experiment import field as field
from .experiment import from_preset as from_preset
from .experiment import host_fields as host_fields
from .experiment import presets as presets
from .experiment import step_rng as step_rng
from .experiment import training as training
from .export import ExportSpec as ExportSpec
from .export import LoadedBundle as LoadedBundle
from .export import StableHLOBundle as StableHLOBundle
from .export import export_model as export_model
from .export import export_provenance as export_provenance
from .export import export_view as export_view
from .export import load_bundle as load_bundle
from .export import site_provenance as site_provenance
from .keys import library_code as _library_code
from .logging import JSONLogger as JSONLogger
from .logging import MLflowLogger as MLflowLogger
from .logging import TensorBoardLogger as TensorBoardLogger
from .logging import WandbLogger as WandbLogger
from .logging import backend as backend
from .logging import finish as finish
from .logging import log_confusion as log_confusion
from .logging import log_metrics as log_metrics
from .logging import log_other as log_other
from .logging import log_params as log_params
from .logging import log_tags as log_tags
from .logging import logger_info as logger_info
from .logging import logger_state as logger_state
from .logging import reattach as reattach
from .logging import run_id as run_id
from .logging import run_url as run_url
from .observe import Checkpointing as Checkpointing
from .observe import Compiling as Compiling
from .observe import Done as Done
from .observe import EvalCompiling as EvalCompiling
from .observe import EvalStepping as EvalStepping
from .observe import ExportCompiling as ExportCompiling
from .observe import Failed as Failed
from .observe import GradientCompiling as GradientCompiling
from .observe import Idle as Idle
from .observe import MetricHistory as MetricHistory
from .observe import OptimizerCompiling as OptimizerCompiling
from .observe import Phase as Phase
from .observe import Starting as Starting
from .observe import Stepping as Stepping
from .observe import Terminal as Terminal
from .observe import TrainStepping as TrainStepping
from .observe import progress_note as progress_note
from .observe import progress_reporter as progress_reporter
from .observe import progress_summary_reporter as progress_summary_reporter
from .observe import register_phase_monitor as register_phase_monitor
from .observe import unregister_phase_monitor as unregister_phase_monitor
from .observe import with_progress_note as with_progress_note
from .optim import ASAM as ASAM
from .optim import EMA as EMA
from .optim import SAM as SAM
from .optim import Decay as Decay
from .optim import EarlyStopping as EarlyStopping
from .optim import GradRule as GradRule
from .optim import OptState as OptState
from .optim import PerturbRule as PerturbRule
from .optim import Plateau as Plateau
from .optim import SingleGrad as SingleGrad
from .optim import backward as backward
from .optim import merge_rules as merge_rules
from .optim import nonschedulable as nonschedulable
from .optim import setup_optimizer as setup_optimizer
from .optim import step_optimizer as step_optimizer
from .optim import strip_rules as strip_rules
from .run import Nitro as Nitro
from .run import RunConfig as RunConfig
from .run import render as render
from .run import train as train

# The table of installed libraries the code fingerprint reads (which code is the
# user's), read on a thread while the user's script goes on (JAX starting its
# backend): on a TPU v5e host it was 0.13 s of the first Nitro's setup.
_library_code.read_installed_in_background()

# Names that were at the root and now live only in their subpackage (issue 29):
# `jaxnitro.<name>` still works, with a DeprecationWarning naming the new path.
_MOVED: dict[str, str] = {
    "ManifestEntry": "checkpoint",
    "RunSummary": "checkpoint",
    "check_record_tree_compatible": "checkpoint",
    "check_source": "checkpoint",
    "find_latest": "checkpoint",
    "resolve_checkpoint": "checkpoint",
    "resolve_source": "checkpoint",
    "resolve_weights_source": "checkpoint",
    "warn_mixed_metrics": "checkpoint",
    "with_io_retry": "checkpoint",
    "cache_reset": "compile",
    "BatchSource": "data",
    "IndexedSource": "data",
    "NoPrefetch": "data",
    "PrefetchConfig": "data",
    "PrefetchIterator": "data",
    "PrefetchStream": "data",
    "auto_prefetch": "data",
    "batch_stream": "data",
    "check_batch_at": "data",
    "check_source_options": "data",
    "default_prefetch_workers": "data",
    "epoch_token": "data",
    "eval_stream": "data",
    "fanout_capable": "data",
    "prefetch_config": "data",
    "FieldMeta": "experiment",
    "NO_DEFAULT": "experiment",
    "assert_graphconst_hashable": "experiment",
    "BundleChecksumError": "export",
    "BundleError": "export",
    "BundleFileMissingError": "export",
    "BundleManifestError": "export",
    "BundlePathError": "export",
    "BundlePlatformError": "export",
    "BundleProgramError": "export",
    "BundleVersionError": "export",
    "ExportBackend": "export",
    "ExportRequest": "export",
    "TFSavedModel": "export",
    "git_provenance": "export",
    "Logger": "logging",
    "MonitorHandle": "observe",
    "PhaseInfo": "observe",
    "RunLog": "observe",
    "default_progress_reporter": "observe",
    "history_series": "observe",
    "history_table": "observe",
    "plot": "observe",
    "progress_bar_reporter": "observe",
    "progress_counter": "observe",
    "progress_log_reporter": "observe",
    "publish_phase": "observe",
    "read_run_logs": "observe",
    "set_config_report": "observe",
    "thin_rows": "observe",
    "work_in_flight": "observe",
    "declare_nonschedulable": "optim",
    "default_no_decay": "optim",
    "GroupSummary": "run",
    "ModelSummary": "run",
    "ProgramSummary": "run",
    "check_compile_options": "run",
    "check_control_readback": "watch",
}


def __getattr__(name: str) -> _Any:
    """A moved root name: warn with its new path, then return it from there."""
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'jaxnitro' has no attribute {name!r}")
    import importlib

    _warnings.warn(
        f"jaxnitro.{name} moved to jaxnitro.{home}.{name}; the root name goes in 1.0",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "__version__",
    "ArraySource",
    "ASAM",
    "Average",
    "average_checkpoints",
    "backend",
    "backward",
    "Best",
    "cache_stats",
    "checkpoint_filename",
    "checkpoint_info",
    "checkpoint_run",
    "Checkpointer",
    "CheckpointError",
    "Checkpointing",
    "CheckpointRecord",
    "compile_view",
    "Compiling",
    "config_metadata",
    "ConfigError",
    "Decay",
    "Device",
    "device_fields",
    "dispatch_variant",
    "Distributed",
    "DistributedError",
    "DivergenceError",
    "Done",
    "EarlyStopping",
    "EMA",
    "Epochs",
    "EvalCompiling",
    "EvalStepping",
    "Every",
    "Experiment",
    "export_model",
    "export_provenance",
    "export_view",
    "ExportCompiling",
    "ExportSpec",
    "Failed",
    "field",
    "finish",
    "from_preset",
    "GradientCompiling",
    "GradRule",
    "GraphConst",
    "HookError",
    "Host",
    "host_fields",
    "Idle",
    "init_distributed",
    "JSONLogger",
    "Last",
    "load_bundle",
    "load_checkpoint",
    "LoadedBundle",
    "log_confusion",
    "log_metrics",
    "log_other",
    "log_params",
    "log_tags",
    "logger_info",
    "logger_state",
    "merge_rules",
    "MetricHistory",
    "MissingExtraError",
    "MLflowLogger",
    "Nitro",
    "NitroError",
    "NitroWarning",
    "nonschedulable",
    "NotYetSupportedError",
    "OptimizerCompiling",
    "OptState",
    "PerturbRule",
    "Phase",
    "Plateau",
    "Preempted",
    "presets",
    "progress_note",
    "progress_reporter",
    "progress_summary_reporter",
    "rank",
    "read_manifest",
    "reattach",
    "register_phase_monitor",
    "render",
    "RoutingError",
    "run_id",
    "run_url",
    "RunConfig",
    "RunDirLockedError",
    "runs",
    "SAM",
    "selected_checkpoint",
    "Selector",
    "setup_devices",
    "setup_optimizer",
    "SingleGrad",
    "site_provenance",
    "StableHLOBundle",
    "StaleHandleWarning",
    "Starting",
    "step_optimizer",
    "step_rng",
    "Stepping",
    "strip_rules",
    "StrippedHost",
    "StrippedHostError",
    "TensorBoardLogger",
    "WandbLogger",
    "Terminal",
    "TopKCheckpointer",
    "train",
    "training",
    "TrainStepping",
    "unregister_phase_monitor",
    "with_progress_note",
    "world_size",
]
