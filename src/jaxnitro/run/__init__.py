"""One run: its configuration, setup, state, restore, the handle and its reports."""

from .config import RunConfig as RunConfig
from .handle import Nitro as Nitro
from .rendering import render as render
from .setup_checks import check_compile_options as check_compile_options
from .summary import GroupSummary as GroupSummary
from .summary import ModelSummary as ModelSummary
from .summary import ProgramSummary as ProgramSummary
from .train_entry import train as train

__all__ = [
    "GroupSummary",
    "ModelSummary",
    "Nitro",
    "ProgramSummary",
    "RunConfig",
    "check_compile_options",
    "render",
    "train",
]
