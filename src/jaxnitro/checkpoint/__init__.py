"""Checkpoints: the record format, the checkpointer and its manifest."""

from ..experiment.record_name import checkpoint_filename as checkpoint_filename
from .averaging import Average as Average
from .checkpointer import Checkpointer as Checkpointer
from .compat import check_record_tree_compatible as check_record_tree_compatible
from .info import checkpoint_info as checkpoint_info
from .io_retry import with_io_retry as with_io_retry
from .loading import load_checkpoint as load_checkpoint
from .lookup import find_latest as find_latest
from .lookup import resolve_checkpoint as resolve_checkpoint
from .lookup import selected_checkpoint as selected_checkpoint
from .manifest import ManifestEntry as ManifestEntry
from .manifest import read_manifest as read_manifest
from .record import CheckpointRecord as CheckpointRecord
from .retention_checks import warn_mixed_metrics as warn_mixed_metrics
from .run_listing import RunSummary as RunSummary
from .run_listing import checkpoint_run as checkpoint_run
from .run_listing import runs as runs
from .selectors import Best as Best
from .selectors import Epochs as Epochs
from .selectors import Every as Every
from .selectors import Last as Last
from .selectors import Selector as Selector
from .source_checks import check_source as check_source
from .sources import average_checkpoints as average_checkpoints
from .sources import resolve_source as resolve_source
from .sources import resolve_weights_source as resolve_weights_source
from .topk import TopKCheckpointer as TopKCheckpointer

__all__ = [
    "Average",
    "Best",
    "CheckpointRecord",
    "Checkpointer",
    "Epochs",
    "Every",
    "Last",
    "ManifestEntry",
    "RunSummary",
    "Selector",
    "TopKCheckpointer",
    "average_checkpoints",
    "check_record_tree_compatible",
    "check_source",
    "checkpoint_filename",
    "checkpoint_info",
    "checkpoint_run",
    "find_latest",
    "load_checkpoint",
    "read_manifest",
    "resolve_checkpoint",
    "resolve_source",
    "resolve_weights_source",
    "runs",
    "selected_checkpoint",
    "warn_mixed_metrics",
    "with_io_retry",
]
