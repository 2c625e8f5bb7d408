"""Observability: phases, reports."""

from .counter import progress_counter as progress_counter
from .entry import work_in_flight as work_in_flight
from .history import MetricHistory as MetricHistory
from .history_plot import history_series as history_series
from .history_plot import plot as plot
from .history_text import history_table as history_table
from .history_text import thin_rows as thin_rows
from .monitors import MonitorHandle as MonitorHandle
from .monitors import PhaseInfo as PhaseInfo
from .monitors import register_phase_monitor as register_phase_monitor
from .monitors import unregister_phase_monitor as unregister_phase_monitor
from .phases import Checkpointing as Checkpointing
from .phases import Compiling as Compiling
from .phases import Done as Done
from .phases import EvalCompiling as EvalCompiling
from .phases import EvalStepping as EvalStepping
from .phases import ExportCompiling as ExportCompiling
from .phases import Failed as Failed
from .phases import GradientCompiling as GradientCompiling
from .phases import Idle as Idle
from .phases import OptimizerCompiling as OptimizerCompiling
from .phases import Phase as Phase
from .phases import Starting as Starting
from .phases import Stepping as Stepping
from .phases import Terminal as Terminal
from .phases import TrainStepping as TrainStepping
from .progress import default_progress_reporter as default_progress_reporter
from .progress import progress_bar_reporter as progress_bar_reporter
from .progress import progress_log_reporter as progress_log_reporter
from .progress import progress_note as progress_note
from .progress import progress_reporter as progress_reporter
from .progress import progress_summary_reporter as progress_summary_reporter
from .progress import with_progress_note as with_progress_note
from .report import set_config_report as set_config_report
from .run_log import RunLog as RunLog
from .run_log import read_run_logs as read_run_logs
from .transitions import publish_phase as publish_phase

__all__ = [
    "Checkpointing",
    "Compiling",
    "Done",
    "EvalCompiling",
    "EvalStepping",
    "ExportCompiling",
    "Failed",
    "GradientCompiling",
    "Idle",
    "MetricHistory",
    "MonitorHandle",
    "OptimizerCompiling",
    "Phase",
    "PhaseInfo",
    "RunLog",
    "Starting",
    "Stepping",
    "Terminal",
    "TrainStepping",
    "default_progress_reporter",
    "history_series",
    "history_table",
    "plot",
    "progress_bar_reporter",
    "progress_counter",
    "progress_log_reporter",
    "progress_note",
    "progress_reporter",
    "progress_summary_reporter",
    "publish_phase",
    "read_run_logs",
    "register_phase_monitor",
    "set_config_report",
    "thin_rows",
    "unregister_phase_monitor",
    "with_progress_note",
    "work_in_flight",
]
