"""`render`: one figure per sample of real batches, via `visualize` and `save_figure`.

    paths = nitro.render(split="val")                 # the data gate: nothing compiled
    paths = nitro.render(split="val", predictions=True)
    paths = nitro.render({"img": images}, predictions=True)   # a batch in hand

The experiment's `visualize(self, outputs, *, <fields>)` draws ONE sample: it is called
with the batch dimension dropped from every declared field (a rank-1 field yields its
element) and from every output leaf; `outputs` is None in data mode. `save_figure(self,
fig, stem)` writes what it returned and returns the path; a matplotlib Figure needs no
method (it is saved as `<stem>.png`). Figures go to `out_dir` (default
`<run_dir>/viz`) under the stem `<tag>_<i>`, where i is the sample's index zero-padded
to three digits and counted across batches.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ..data.sources import batch_size, epoch_batches
from ..errors import ConfigError, HookError
from ..experiment.hooks import has_hook
from ..experiment.routing import as_batch, hook_fields

if TYPE_CHECKING:
    from .handle import Nitro


def _sample(value: Any, index: int) -> Any:
    """Sample `index` of a field: an array loses its batch dimension (a rank-1 field
    yields its element), as does a list or tuple of per-sample values."""
    if isinstance(value, np.ndarray | jax.Array | list | tuple):
        item = value[index]
        return item.item() if isinstance(item, np.generic) else item
    return value


def _save(nitro: Nitro, figure: Any, stem: str) -> str:
    cls: Any = nitro.prepared.cls
    if has_hook(cls, "save_figure"):
        path = cls.save_figure(nitro.experiment, figure, stem)
        return os.fspath(path)
    savefig = getattr(figure, "savefig", None)
    if callable(savefig):  # a matplotlib Figure
        path = stem + ".png"
        savefig(path, dpi=100)
        return path
    raise HookError(
        f"visualize returned a {type(figure).__name__}, which {cls.__name__} has no "
        f"save_figure for. Define save_figure(self, fig, stem) -> path, or return a "
        f"matplotlib Figure (saved as <stem>.png)."
    )


def render_batches(
    nitro: Nitro,
    batches: list[Mapping[str, Any]],
    *,
    predictions: bool,
    out_dir: str,
    tag: str,
) -> list[str]:
    """Draw and save one figure per sample of `batches`; the paths written."""
    cls: Any = nitro.prepared.cls
    mode = "prediction" if predictions else "data"
    if not has_hook(cls, "visualize"):
        raise HookError(
            f"{cls.__name__} has no visualize hook, which render needs in {mode} mode: "
            f"define visualize(self, outputs, *, <fields>) drawing one sample "
            f"(outputs is None in data mode) and returning a figure."
        )
    visualize = cls.visualize
    wanted = hook_fields("metrics", visualize)  # the same shape: (self, outputs, ...)
    os.makedirs(out_dir, exist_ok=True)
    paths: list[str] = []
    counter = 0
    for batch in batches:
        names = wanted.select(tuple(batch))
        outputs = nitro.predict(batch) if predictions else None
        for i in range(batch_size(batch, names or None)):
            fields = {k: _sample(batch[k], i) for k in names}
            sample_out = (
                None if outputs is None else jax.tree.map(lambda o, i=i: o[i], outputs)
            )
            figure = visualize(nitro.experiment, sample_out, **fields)
            name = f"{tag}_{counter:03d}" if tag else f"{counter:03d}"
            stem = os.path.join(out_dir, name)
            paths.append(_save(nitro, figure, stem))
            counter += 1
            _close(figure)
    return paths


def _close(figure: Any) -> None:
    """Free a matplotlib figure's memory once it is written: pyplot keeps every
    figure it made alive until it is closed, so a figure per sample would pile up."""
    if not type(figure).__module__.startswith("matplotlib"):
        return
    figure.clear()
    import sys

    pyplot = sys.modules.get("matplotlib.pyplot")  # only pyplot can hold it
    if pyplot is not None:
        pyplot.close(figure)


def render(
    nitro: Nitro,
    batch: Any = None,
    *,
    split: str = "val",
    batches: int = 1,
    predictions: bool = False,
    out_dir: str | None = None,
    tag: str | None = None,
) -> list[str]:
    """Write one figure per sample; see the module docstring. Returns the paths."""
    out_dir = out_dir if out_dir is not None else os.path.join(nitro.run_dir, "viz")
    if batch is not None:
        chosen = [as_batch(batch, "render takes a batch dict such as {'img': ...}.")]
        return render_batches(
            nitro, chosen, predictions=predictions, out_dir=out_dir, tag=tag or ""
        )
    if split not in nitro.data:
        raise ConfigError(
            f"render(split={split!r}): the data has no split {split!r}. The splits "
            f"are: {', '.join(nitro.data) or 'none'}."
        )
    if not isinstance(batches, int) or batches < 1:
        raise ConfigError(f"render(batches={batches!r}) must be an int >= 1.")
    chosen = list(itertools.islice(epoch_batches(nitro.data[split], 0), batches))
    return render_batches(
        nitro,
        chosen,
        predictions=predictions,
        out_dir=out_dir,
        tag=split if tag is None else tag,
    )
