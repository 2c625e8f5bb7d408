"""A resume against changed inputs: the hooks' code warns naming the hooks, the
data's shape (split sizes, batch size, field shapes and dtypes) is refused naming
each change unless resume_changed_data=True; an older record is not compared."""

import dataclasses
import logging
import os
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from experiments import Tiny, make_batches

import jaxnitro as nx
from jaxnitro.checkpoint.manifest import load_manifest, write_manifest
from jaxnitro.checkpoint.record import read_header, rewrite_header


def trained_run(tmp_path) -> str:
    """A one-epoch Tiny run in tmp_path; its record's path."""
    nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None).train()
    return latest_path(tmp_path)


def latest_path(tmp_path) -> str:
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    return os.path.join(tmp_path, files[-1])


def resume(tmp_path, e, **kw):
    return nx.Nitro(e, run_dir=str(tmp_path), resume="auto", logger=None, **kw)


class WiderBatches(Tiny):
    """Tiny's data in batches of 32: 2 train batches, not 4."""

    def build_data(self, dist):
        return {
            "train": make_batches(self.n_train, 32),
            "val": make_batches(24, 16, seed=1),
        }


class HalfPrecision(Tiny):
    """Tiny's data with x in float16."""

    def build_data(self, dist):
        data = super().build_data(dist)
        data["train"] = [{**b, "x": b["x"].astype(np.float16)} for b in data["train"]]
        return data


class NewLoss(Tiny):
    """Tiny with another loss (the record's run trained with Tiny.loss)."""

    def loss(self, logits, *, y):
        return jnp.mean((logits - y) ** 2)


def test_the_record_keeps_the_hook_fingerprints_and_the_data_signature(tmp_path):
    header = read_header(trained_run(tmp_path))
    assert header.data_signature == {
        "splits": {"train": 4, "val": 2},
        "batch_size": 16,
        "fields": {
            "x": {"shape": [8], "dtype": "float32"},
            "y": {"shape": [3], "dtype": "float32"},
        },
    }
    assert header.hook_fingerprints is not None
    assert {"forward", "loss", "build_model", "build_data"} <= set(
        header.hook_fingerprints
    )


def test_an_unchanged_resume_is_silent(tmp_path):
    trained_run(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nitro = resume(tmp_path, Tiny(max_epochs=2))
    assert nitro.current_epoch == 1


def test_a_changed_batch_size_is_refused_naming_each_change(tmp_path):
    path = trained_run(tmp_path)
    with pytest.raises(nx.CheckpointError) as caught:
        resume(tmp_path, WiderBatches(max_epochs=2))
    text = str(caught.value)
    assert text.startswith(f"Cannot resume from {path}: the data differs")
    assert "train split: 4 batches in the record, 2 batches now" in text
    assert "batch size: 16 in the record, 32 now" in text
    assert "resume_changed_data=True" in text and "weights=" in text


def test_a_changed_split_size_and_dtype_are_refused(tmp_path):
    trained_run(tmp_path)
    with pytest.raises(nx.CheckpointError, match=r"train split: 4 batches in the "):
        resume(tmp_path, Tiny(max_epochs=2, n_train=128))
    with pytest.raises(
        nx.CheckpointError,
        match=r"train field `x`: float32\[8\] in the record, float16\[8\] now",
    ):
        resume(tmp_path, HalfPrecision(max_epochs=2))


def test_resume_changed_data_turns_the_refusal_into_a_warning(tmp_path):
    trained_run(tmp_path)
    with pytest.warns(nx.NitroWarning) as caught:
        nitro = resume(tmp_path, WiderBatches(max_epochs=2), resume_changed_data=True)
    texts = [str(w.message) for w in caught]
    assert any(
        "with changed data (resume_changed_data=True): train split: 4 batches in "
        "the record, 2 batches now; batch size: 16 in the record, 32 now" in t
        for t in texts
    )
    assert any("hook `build_data` changed" in t for t in texts)  # its code did
    assert nitro.current_epoch == 1 and nitro.config.resume_changed_data is True
    nitro.train()
    assert nitro.current_epoch == 2


def test_changed_hook_code_warns_naming_the_hook(tmp_path):
    path = trained_run(tmp_path)
    with pytest.warns(nx.NitroWarning) as caught:
        nitro = resume(tmp_path, NewLoss(max_epochs=2))
    texts = [str(w.message) for w in caught if "changed since" in str(w.message)]
    assert len(texts) == 1
    assert texts[0].startswith(f"Resuming {path}: the code of hook")
    assert "`loss`" in texts[0] and "`forward`" not in texts[0]
    assert nitro.current_epoch == 1  # a warning: the resume goes on


def test_a_record_without_the_new_keys_resumes_without_comparing(tmp_path, caplog):
    path = trained_run(tmp_path)
    rewrite_header(
        path,
        lambda h: dataclasses.replace(h, hook_fingerprints=None, data_signature=None),
    )
    assert "data_signature" not in read_header(path).to_json()
    # Such a record was listed before the manifest kept checksums, too.
    manifest = load_manifest(str(tmp_path))
    write_manifest(
        str(tmp_path),
        [dataclasses.replace(e, checksum=None) for e in manifest.entries],
        manifest.pending_deletion,
    )
    with caplog.at_level(logging.INFO, logger="jaxnitro"):
        nitro = resume(tmp_path, WiderBatches(max_epochs=2))
    assert nitro.current_epoch == 1
    assert "are not compared" in caplog.text


def test_resume_changed_data_without_a_resume_is_refused():
    with pytest.raises(
        nx.ConfigError, match=r"resume_changed_data=True .* resumes nothing"
    ):
        nx.Nitro(Tiny(), logger=None, checkpointer=None, resume_changed_data=True)


def test_a_weights_load_compares_nothing(tmp_path):
    path = trained_run(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nitro = nx.Nitro(WiderBatches(), weights=path, logger=None, checkpointer=None)
    assert nitro.current_epoch == 0
