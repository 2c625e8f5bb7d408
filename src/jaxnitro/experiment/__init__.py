"""The experiment: the user's class, its marked fields and what they mean, its hooks."""

from .base import Experiment as Experiment
from .base import field as field
from .markers import Device as Device
from .markers import GraphConst as GraphConst
from .markers import Host as Host
from .modes import training as training
from .named_presets import from_preset as from_preset
from .named_presets import presets as presets
from .rng import step_rng as step_rng
from .stripped import StrippedHost as StrippedHost
from .traits import NO_DEFAULT as NO_DEFAULT
from .traits import FieldMeta as FieldMeta
from .traits import config_metadata as config_metadata
from .traits import device_fields as device_fields
from .traits import dispatch_variant as dispatch_variant
from .traits import host_fields as host_fields
from .view import assert_graphconst_hashable as assert_graphconst_hashable
from .view import compile_view as compile_view

__all__ = [
    "Device",
    "Experiment",
    "FieldMeta",
    "GraphConst",
    "Host",
    "NO_DEFAULT",
    "StrippedHost",
    "assert_graphconst_hashable",
    "compile_view",
    "config_metadata",
    "device_fields",
    "dispatch_variant",
    "field",
    "from_preset",
    "host_fields",
    "presets",
    "step_rng",
    "training",
]
