"""The optimizer: rules and their per-step hyperparameters."""

from .decay import Decay as Decay
from .ema import EMA as EMA
from .grad_rules import ASAM as ASAM
from .grad_rules import SAM as SAM
from .grad_rules import GradRule as GradRule
from .grad_rules import PerturbRule as PerturbRule
from .grad_rules import SingleGrad as SingleGrad
from .groups import default_no_decay as default_no_decay
from .manual import OptState as OptState
from .manual import backward as backward
from .manual import merge_rules as merge_rules
from .manual import setup_optimizer as setup_optimizer
from .manual import step_optimizer as step_optimizer
from .manual import strip_rules as strip_rules
from .rules import declare_nonschedulable as declare_nonschedulable
from .rules import nonschedulable as nonschedulable
from .schedules import Plateau as Plateau
from .stopping import EarlyStopping as EarlyStopping

__all__ = [
    "ASAM",
    "Decay",
    "EMA",
    "EarlyStopping",
    "GradRule",
    "OptState",
    "PerturbRule",
    "Plateau",
    "SAM",
    "SingleGrad",
    "backward",
    "declare_nonschedulable",
    "default_no_decay",
    "merge_rules",
    "nonschedulable",
    "setup_optimizer",
    "step_optimizer",
    "strip_rules",
]
