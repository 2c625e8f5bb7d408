"""The public API's shape: the root namespace, the subpackages, the moved names.

The root holds what the README, the tutorial and the spec's main (exported) entries
use; every other public name is reached through its subpackage's `__all__`, and a
name that moved off the root still resolves there with a DeprecationWarning. The
site's build (scripts/docs/hooks.py) checks that each of these names has a docstring
and an entry on its reference page.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

import jaxnitro

REPO = Path(__file__).resolve().parents[2]

# The root namespace, as docs/reference/index.md lists it.
ROOT = {
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
}

DOCUMENTED = (
    "checkpoint",
    "compile",
    "data",
    "devices",
    "experiment",
    "export",
    "logging",
    "loop",
    "observe",
    "optim",
    "run",
    "errors",
    "watch",
)


def test_the_root_holds_the_documented_names():
    assert set(jaxnitro.__all__) == ROOT
    assert len(jaxnitro.__all__) == len(ROOT)
    for name in ROOT:
        assert getattr(jaxnitro, name) is not None
    assert set(dir(jaxnitro)) == ROOT


def test_every_root_name_is_documented_in_a_subpackage():
    exported = {
        n
        for sub in DOCUMENTED
        for n in importlib.import_module(f"jaxnitro.{sub}").__all__
    }
    assert ROOT - {"__version__"} <= exported


@pytest.mark.parametrize("name, home", sorted(jaxnitro._MOVED.items()))
def test_a_moved_name_resolves_with_a_warning_naming_its_new_path(name, home):
    module = importlib.import_module(f"jaxnitro.{home}")
    assert name in module.__all__ and name not in ROOT
    message = (
        f"jaxnitro.{name} moved to jaxnitro.{home}.{name}; the root name goes in 1.0"
    )
    with pytest.warns(DeprecationWarning, match=re.escape(message)):
        old = getattr(jaxnitro, name)
    assert old is getattr(module, name)


def test_an_unknown_root_name_is_an_attribute_error():
    with pytest.raises(
        AttributeError, match="module 'jaxnitro' has no attribute 'nope'"
    ):
        jaxnitro.nope  # noqa: B018


def test_every_public_class_and_function_has_its_own_docstring():
    missing = []
    for sub in DOCUMENTED:
        module = importlib.import_module(f"jaxnitro.{sub}")
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                doc = obj.__dict__.get("__doc__")
            elif callable(obj):
                doc = getattr(obj, "__doc__", None)
            else:
                continue  # a constant: its docstring is checked by the site's build
            if not (doc and doc.strip()):
                missing.append(f"jaxnitro.{sub}.{name}")
    assert missing == []


# Dotted names that are no public attribute: the `jaxnitro.progress` logging logger,
# and `python -m jaxnitro.cli`.
NOT_ATTRIBUTES = {"cli", "progress"}


def root_uses(text: str) -> set[str]:
    return set(re.findall(r"\b(?:nx|jaxnitro)\.([A-Za-z_]\w*)\b", text))


def test_the_readme_tutorial_and_guides_use_root_names_or_subpackages():
    texts = [REPO / "README.md", REPO / "examples" / "mnist_tutorial.py"]
    texts += sorted((REPO / "docs" / "guides").glob("*.md"))
    stray = []
    for path in texts:
        for name in root_uses(path.read_text()):
            if name not in ROOT | set(DOCUMENTED) | NOT_ATTRIBUTES:
                stray.append(f"{path.name}: {name}")
    assert stray == []
