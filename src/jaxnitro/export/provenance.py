"""Provenance: where a bundle's weights and code came from.

Merged from five layers, lowest precedence first: the export's own facts (time,
versions, name, batch sizes), the framework's entries for the handle's weights
(`export_provenance`), the repository state (`site_provenance`), the model's own
entries (`export_provenance_extra`), and `export_model`'s `provenance` argument.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import warnings
from collections.abc import Mapping
from typing import Any

import jax

from .._version import __version__
from ..checkpoint.info import checkpoint_info
from ..errors import NitroWarning


def export_provenance(nitro: Any) -> dict[str, Any]:
    """The framework's provenance entries for the handle's weights.

    Args:
        nitro: the `Nitro` whose weights are exported.

    Returns:
        dict[str, Any]: `framework`, `jaxnitro_version`, `experiment` (module and
        qualname), `seed`, `run_dir`, `config` (the flat hyperparameters), `preset`
        when there is one; `checkpoint` (the file a restore read), `averaged_from`,
        `weights_from`, `trained_run_id` and `trained_run_url` (from the restored
        record), each only when known. Repository state is `site_provenance`'s job.
    """
    cls = type(nitro.experiment)
    prov: dict[str, Any] = {
        "framework": "jaxnitro",
        "jaxnitro_version": __version__,
        "experiment": f"{cls.__module__}.{cls.__qualname__}",
        "seed": nitro.config.seed,
        "run_dir": os.path.abspath(nitro.run_dir),
        "config": dict(nitro.params_to_log()),
    }
    if nitro.config.preset is not None:
        prov["preset"] = nitro.config.preset
    source = nitro.checkpoint_source
    if source is not None:
        prov["checkpoint"] = os.path.abspath(source)
        info = checkpoint_info(source)
        for key in ("run_id", "run_url"):
            if info.get(key) is not None:
                prov[f"trained_{key}"] = info[key]
    if nitro.averaged_from is not None:
        prov["averaged_from"] = nitro.averaged_from
    if nitro.weights_from is not None:
        prov["weights_from"] = nitro.weights_from
    return prov


def export_facts(*, name: str, batch_sizes: tuple[int, ...]) -> dict[str, Any]:
    """The export's own entries: the lowest provenance layer."""
    return {
        "name": name,
        "batch_sizes": list(batch_sizes),
        "exported_at": datetime.datetime.now(datetime.UTC).isoformat(),
        "python_version": platform.python_version(),
        "jax_version": jax.__version__,
    }


def _git(root: str, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", root, *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def git_provenance(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Repository state at `root`, read with the `git` command.

    Args:
        root: a folder inside a git work tree.

    Returns:
        dict[str, Any]: `git_commit`, `git_tree_sha1`, `git_branch`, `git_dirty`,
        `repo_remote` (origin's URL), and on a dirty tree `git_diff`, the full
        `git diff --binary HEAD` (untracked files are not captured), which a
        backend writes as a file beside the artifact. A field git cannot answer
        is omitted. Outside a work tree (or without git) it warns and returns {}.

    Examples:
        >>> import tempfile, warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     git_provenance(tempfile.gettempdir())
        {}
    """
    root = os.fspath(root)
    inside = _git(root, "rev-parse", "--is-inside-work-tree")
    if inside is None or inside.strip() != "true":
        warnings.warn(
            f"git_provenance: {root!r} is not inside a git work tree (or git is not "
            "installed); the bundle records no commit, tree hash or patch. Pass "
            "provenance_root=<your repository> to record them.",
            NitroWarning,
            stacklevel=2,
        )
        return {}
    prov: dict[str, Any] = {}
    fields = {
        "git_commit": ("rev-parse", "HEAD"),
        "git_tree_sha1": ("rev-parse", "HEAD^{tree}"),
        "git_branch": ("rev-parse", "--abbrev-ref", "HEAD"),
        "repo_remote": ("remote", "get-url", "origin"),
    }
    for key, args in fields.items():
        out = _git(root, *args)
        if out is not None and out.strip():
            prov[key] = out.strip()
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    if status is not None:
        prov["git_dirty"] = bool(status.strip())
        if prov["git_dirty"] and "git_commit" in prov:
            diff = _git(root, "diff", "--binary", "HEAD")
            if diff is not None:
                prov["git_diff"] = diff
    return prov


def site_provenance(
    backend: Any, root: str | os.PathLike[str] | None
) -> dict[str, Any]:
    """Repository state for a bundle's provenance, collected at `root`.

    A backend with its own collector defines `collect_provenance(root)`; the
    default is `git_provenance(root)`. Without a root nothing is collected.

    Args:
        backend: the export backend (`StableHLOBundle()`).
        root: `export_model`'s `provenance_root`, or None.

    Returns:
        dict[str, Any]: the entries; a `git_diff` entry is a full patch, written
        beside the artifact rather than into its metadata.
    """
    if root is None:
        return {}
    collect = getattr(backend, "collect_provenance", None)
    if callable(collect):
        return dict(collect(root))
    return git_provenance(root)


def merge_provenance(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """The layers merged key by key, a later layer overriding an earlier one."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)
    return merged
