"""Experiments with export hooks, built on the shared `Tiny`, for tests/export."""

from __future__ import annotations

import jax.numpy as jnp
from experiments import N_FEATURES, Tiny, mlp

import jaxnitro as nx


def quiet(**kw):
    """Keywords for a handle that writes nothing (no logger, no checkpoints)."""
    return {"logger": None, "checkpointer": None, **kw}


class Exportable(Tiny):
    """Tiny with the minimal export hooks: one float input, the logits out."""

    def export_inputs(self):
        return [nx.ExportSpec("x", "float32", (1, N_FEATURES))]

    def export_outputs(self):
        return [nx.ExportSpec("logits")]


class Rich(Tiny):
    """uint8 wire input scaled in export_preprocess, dict outputs, a rename and an
    echo, a postprocess with client outputs."""

    def forward(self, model, params, state, *, x):
        logits = mlp(params, x) / self.temperature
        return {"logits": logits, "top": jnp.argmax(logits, -1)}, state

    def export_inputs(self):
        return [nx.ExportSpec("pixels", "uint8", (1, N_FEATURES), axis_letters="f")]

    def export_preprocess(self, pixels):
        return {"x": pixels.astype(jnp.float32) / 255.0}

    def export_outputs(self):
        return [
            nx.ExportSpec("scores", from_="logits"),
            nx.ExportSpec("top", "int32", (1,)),
            nx.ExportSpec("pixels_echo", from_="pixels"),
        ]

    def export_postprocess(self):
        return "def postprocess(out):\n    return out\n"

    def export_client_outputs(self):
        return [nx.ExportSpec("label", "int32", (1,))]

    def export_provenance_extra(self, *, checkpoint=None):
        return {"model": "Rich", "class_names": ["a", "b", "c"], "seed": -1}
