"""Logging: the duck-typed logger protocol and the JSON-lines default."""

from .jsonl import JSONLogger as JSONLogger
from .mlflow import MLflowLogger as MLflowLogger
from .protocol import Logger as Logger
from .protocol import backend as backend
from .protocol import finish as finish
from .protocol import log_confusion as log_confusion
from .protocol import log_metrics as log_metrics
from .protocol import log_other as log_other
from .protocol import log_params as log_params
from .protocol import log_tags as log_tags
from .protocol import logger_info as logger_info
from .protocol import logger_state as logger_state
from .protocol import reattach as reattach
from .protocol import run_id as run_id
from .protocol import run_url as run_url
from .tensorboard import TensorBoardLogger as TensorBoardLogger
from .wandb import WandbLogger as WandbLogger

__all__ = [
    "JSONLogger",
    "Logger",
    "MLflowLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "backend",
    "finish",
    "log_confusion",
    "log_metrics",
    "log_other",
    "log_params",
    "log_tags",
    "logger_info",
    "logger_state",
    "reattach",
    "run_id",
    "run_url",
]
