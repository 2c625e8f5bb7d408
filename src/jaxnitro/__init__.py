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
"""

from ._version import __version__ as __version__
from .checkpoint.averaging import Average as Average
from .checkpoint.checkpointer import Checkpointer as Checkpointer
from .checkpoint.checkpointer import load_checkpoint as load_checkpoint
from .checkpoint.compat import (
    check_record_tree_compatible as check_record_tree_compatible,
)
from .checkpoint.filenames import checkpoint_filename as checkpoint_filename
from .checkpoint.info import checkpoint_info as checkpoint_info
from .checkpoint.io_retry import with_io_retry as with_io_retry
from .checkpoint.lookup import find_latest as find_latest
from .checkpoint.lookup import resolve_checkpoint as resolve_checkpoint
from .checkpoint.lookup import selected_checkpoint as selected_checkpoint
from .checkpoint.manifest import ManifestEntry as ManifestEntry
from .checkpoint.manifest import read_manifest as read_manifest
from .checkpoint.record import CheckpointRecord as CheckpointRecord
from .checkpoint.retention_checks import warn_mixed_metrics as warn_mixed_metrics
from .checkpoint.runs import RunSummary as RunSummary
from .checkpoint.runs import checkpoint_run as checkpoint_run
from .checkpoint.runs import runs as runs
from .checkpoint.selectors import Best as Best
from .checkpoint.selectors import Epochs as Epochs
from .checkpoint.selectors import Every as Every
from .checkpoint.selectors import Last as Last
from .checkpoint.selectors import Selector as Selector
from .checkpoint.source_checks import check_source as check_source
from .checkpoint.sources import average_checkpoints as average_checkpoints
from .checkpoint.sources import resolve_source as resolve_source
from .checkpoint.sources import resolve_weights_source as resolve_weights_source
from .checkpoint.topk import TopKCheckpointer as TopKCheckpointer
from .compile.cache import cache_reset as cache_reset
from .compile.cache import cache_stats as cache_stats
from .data.arrays import ArraySource as ArraySource
from .data.batch_at_check import check_batch_at as check_batch_at
from .data.prefetch import NoPrefetch as NoPrefetch
from .data.prefetch import PrefetchConfig as PrefetchConfig
from .data.prefetch import PrefetchIterator as PrefetchIterator
from .data.prefetch import auto_prefetch as auto_prefetch
from .data.prefetch import batch_stream as batch_stream
from .data.prefetch import default_prefetch_workers as default_prefetch_workers
from .data.prefetch import eval_stream as eval_stream
from .data.prefetch import prefetch_config as prefetch_config
from .data.protocol import BatchSource as BatchSource
from .data.protocol import IndexedSource as IndexedSource
from .data.protocol import epoch_token as epoch_token
from .data.protocol import fanout_capable as fanout_capable
from .data.sources import check_source_options as check_source_options
from .data.stream import PrefetchStream as PrefetchStream
from .devices.distributed import Distributed as Distributed
from .devices.distributed import init_distributed as init_distributed
from .devices.distributed import rank as rank
from .devices.distributed import world_size as world_size
from .devices.process import setup_devices as setup_devices
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
from .experiment.base import Experiment as Experiment
from .experiment.base import field as field
from .experiment.markers import Device as Device
from .experiment.markers import GraphConst as GraphConst
from .experiment.markers import Host as Host
from .experiment.modes import training as training
from .experiment.presets import from_preset as from_preset
from .experiment.presets import presets as presets
from .experiment.rng import step_rng as step_rng
from .experiment.stripped import StrippedHost as StrippedHost
from .experiment.traits import NO_DEFAULT as NO_DEFAULT
from .experiment.traits import FieldMeta as FieldMeta
from .experiment.traits import config_metadata as config_metadata
from .experiment.traits import device_fields as device_fields
from .experiment.traits import dispatch_variant as dispatch_variant
from .experiment.traits import host_fields as host_fields
from .experiment.view import assert_graphconst_hashable as assert_graphconst_hashable
from .experiment.view import compile_view as compile_view
from .export.backend import ExportBackend as ExportBackend
from .export.backend import ExportRequest as ExportRequest
from .export.bundle import StableHLOBundle as StableHLOBundle
from .export.format import BundleChecksumError as BundleChecksumError
from .export.format import BundleError as BundleError
from .export.format import BundleFileMissingError as BundleFileMissingError
from .export.format import BundleManifestError as BundleManifestError
from .export.format import BundlePathError as BundlePathError
from .export.format import BundlePlatformError as BundlePlatformError
from .export.format import BundleProgramError as BundleProgramError
from .export.format import BundleVersionError as BundleVersionError
from .export.loader import LoadedBundle as LoadedBundle
from .export.loader import load_bundle as load_bundle
from .export.provenance import export_provenance as export_provenance
from .export.provenance import git_provenance as git_provenance
from .export.provenance import site_provenance as site_provenance
from .export.sequence import export_model as export_model
from .export.spec import ExportSpec as ExportSpec
from .export.tf_saved_model import TFSavedModel as TFSavedModel
from .export.view import export_view as export_view
from .logging.jsonl import JSONLogger as JSONLogger
from .logging.mlflow import MLflowLogger as MLflowLogger
from .logging.protocol import Logger as Logger
from .logging.protocol import backend as backend
from .logging.protocol import finish as finish
from .logging.protocol import log_confusion as log_confusion
from .logging.protocol import log_metrics as log_metrics
from .logging.protocol import log_other as log_other
from .logging.protocol import log_params as log_params
from .logging.protocol import log_tags as log_tags
from .logging.protocol import logger_info as logger_info
from .logging.protocol import logger_state as logger_state
from .logging.protocol import reattach as reattach
from .logging.protocol import run_id as run_id
from .logging.protocol import run_url as run_url
from .logging.tensorboard import TensorBoardLogger as TensorBoardLogger
from .logging.wandb import WandbLogger as WandbLogger
from .observe.counter import progress_counter as progress_counter
from .observe.entry import work_in_flight as work_in_flight
from .observe.history import MetricHistory as MetricHistory
from .observe.history_plot import history_series as history_series
from .observe.history_plot import plot as plot
from .observe.history_table import history_table as history_table
from .observe.history_table import thin_rows as thin_rows
from .observe.monitors import MonitorHandle as MonitorHandle
from .observe.monitors import PhaseInfo as PhaseInfo
from .observe.monitors import register_phase_monitor as register_phase_monitor
from .observe.monitors import unregister_phase_monitor as unregister_phase_monitor
from .observe.phases import Checkpointing as Checkpointing
from .observe.phases import Compiling as Compiling
from .observe.phases import Done as Done
from .observe.phases import EvalCompiling as EvalCompiling
from .observe.phases import EvalStepping as EvalStepping
from .observe.phases import ExportCompiling as ExportCompiling
from .observe.phases import Failed as Failed
from .observe.phases import GradientCompiling as GradientCompiling
from .observe.phases import Idle as Idle
from .observe.phases import OptimizerCompiling as OptimizerCompiling
from .observe.phases import Phase as Phase
from .observe.phases import Starting as Starting
from .observe.phases import Stepping as Stepping
from .observe.phases import Terminal as Terminal
from .observe.phases import TrainStepping as TrainStepping
from .observe.progress import default_progress_reporter as default_progress_reporter
from .observe.progress import progress_bar_reporter as progress_bar_reporter
from .observe.progress import progress_log_reporter as progress_log_reporter
from .observe.progress import progress_note as progress_note
from .observe.progress import progress_reporter as progress_reporter
from .observe.progress import (
    progress_summary_reporter as progress_summary_reporter,
)
from .observe.progress import with_progress_note as with_progress_note
from .observe.report import set_config_report as set_config_report
from .observe.run_log import RunLog as RunLog
from .observe.run_log import read_run_logs as read_run_logs
from .observe.transitions import publish_phase as publish_phase
from .optim.decay import Decay as Decay
from .optim.ema import EMA as EMA
from .optim.grad_rules import ASAM as ASAM
from .optim.grad_rules import SAM as SAM
from .optim.grad_rules import GradRule as GradRule
from .optim.grad_rules import PerturbRule as PerturbRule
from .optim.grad_rules import SingleGrad as SingleGrad
from .optim.groups import default_no_decay as default_no_decay
from .optim.manual import OptState as OptState
from .optim.manual import backward as backward
from .optim.manual import merge_rules as merge_rules
from .optim.manual import setup_optimizer as setup_optimizer
from .optim.manual import step_optimizer as step_optimizer
from .optim.manual import strip_rules as strip_rules
from .optim.rules import declare_nonschedulable as declare_nonschedulable
from .optim.rules import nonschedulable as nonschedulable
from .optim.schedules import Plateau as Plateau
from .optim.stopping import EarlyStopping as EarlyStopping
from .run.config import RunConfig as RunConfig
from .run.handle import Nitro as Nitro
from .run.handle import train as train
from .run.render import render as render
from .run.setup_checks import check_compile_options as check_compile_options
from .run.summary import GroupSummary as GroupSummary
from .run.summary import ModelSummary as ModelSummary
from .run.summary import ProgramSummary as ProgramSummary
from .watch import check_control_readback as check_control_readback
