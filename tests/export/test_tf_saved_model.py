"""TFSavedModel: a SavedModel loaded back by TensorFlow in a fresh process equals
predict, one XlaCallModule signature per batch size, the weights shared
non-trainable variables; the missing extra and bad platforms are refused.

The round trip needs the `tf` extra and is marked `tf`: a plain `pytest` leaves it
out, `pytest -m tf` runs it (CI does, in a virtual environment with the extra). It
does not skip when TensorFlow is missing: in the tf tier that is a failure.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from experiments import make_batches
from export_experiments import Exportable, Rich, quiet

import jaxnitro as nx

LOADER = """
import json, sys
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

path, inputs, out = sys.argv[1:4]
data = np.load(inputs)
with open(path + "/assets.extra/manifest.json") as f:
    manifest = json.load(f)
loaded = tf.saved_model.load(path)
results, facts = {}, {"signatures": {}}
for n, key in manifest["signatures"].items():
    fn = loaded.signatures[key]
    _, kwargs = fn.structured_input_signature
    facts["signatures"][key] = {
        "inputs": {k: [s.dtype.name, list(s.shape)] for k, s in kwargs.items()},
        "outputs": sorted(fn.structured_outputs),
    }
    got = fn(**{k: tf.constant(data[k][: int(n)]) for k in kwargs})
    for name, value in got.items():
        results[f"{key}/{name}"] = value.numpy()
serving = loaded.signatures["serving_default"]
facts["serving_default"] = sorted(serving.structured_outputs)
facts["variables"] = [[v.name, v.trainable] for v in loaded.weights]
saved = saved_model_pb2.SavedModel()
with open(path + "/saved_model.pb", "rb") as f:
    saved.ParseFromString(f.read())
graph = saved.meta_graphs[0].graph_def
facts["xla_call_modules"] = sum(
    node.op == "XlaCallModule" for fn in graph.library.function for node in fn.node_def
)
facts["checkpoint"] = [
    name for name, _ in tf.train.list_variables(path + "/variables/variables")
    if name.startswith("weights/")
]
np.savez(out, **results)
with open(out + ".json", "w") as f:
    json.dump(facts, f)
"""


def load_in_fresh_process(path, inputs, tmp_path):
    """Run LOADER on the SavedModel at `path`; return its outputs and its facts."""
    np.savez(tmp_path / "in.npz", **inputs)
    out = str(tmp_path / f"{os.path.basename(path)}.npz")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    subprocess.run(
        [sys.executable, "-c", LOADER, path, tmp_path / "in.npz", out],
        check=True,
        env=env,
        timeout=300,
    )
    with open(out + ".json") as f:
        return np.load(out), json.load(f)


@pytest.mark.tf
def test_a_fresh_tensorflow_process_reproduces_predict(tmp_path):
    nitro = nx.Nitro(Exportable(max_epochs=1), **quiet())
    nitro.train()
    path = nx.export_model(
        nitro, nx.export.TFSavedModel(), dir=tmp_path, name="tf", batch_sizes=[1, 3, 5]
    )
    x = make_batches(7, 7, seed=8)[0]["x"]
    got, facts = load_in_fresh_process(path, {"x": x}, tmp_path)
    assert sorted(facts["signatures"]) == ["b1", "b3", "b5"]
    for n in (1, 3, 5):
        assert facts["signatures"][f"b{n}"] == {
            "inputs": {"x": ["float32", [n, 8]]},
            "outputs": ["logits"],
        }
        np.testing.assert_allclose(
            got[f"b{n}/logits"], nitro.predict({"x": x[:n]}), rtol=1e-6, atol=1e-6
        )
    assert facts["serving_default"] == ["logits"]
    # one XlaCallModule per batch size; the weights saved once, read by all three
    assert facts["xla_call_modules"] == 3
    assert facts["variables"] == [
        ["params.b1:0", False],
        ["params.w1:0", False],
        ["params.w2:0", False],
    ]
    assert len(facts["checkpoint"]) == 3
    with open(os.path.join(path, "assets.extra", "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["format"] == "jaxnitro-tf-saved-model"
    assert manifest["signatures"] == {"1": "b1", "3": "b3", "5": "b5"}
    assert manifest["weights"]["variables"] == [
        "['params']['b1']",
        "['params']['w1']",
        "['params']['w2']",
    ]
    assert os.path.exists(os.path.join(path, "assets.extra", "provenance.json"))


@pytest.mark.tf
def test_wire_names_dtypes_echoes_and_the_postprocess_survive(tmp_path):
    nitro = nx.Nitro(Rich(), **quiet())
    path = nx.export_model(
        nitro, nx.export.TFSavedModel(), dir=tmp_path, name="rich", batch_sizes=[2]
    )
    pixels = np.arange(16, dtype=np.uint8).reshape(2, 8) * 15
    got, facts = load_in_fresh_process(path, {"pixels": pixels}, tmp_path)
    assert facts["signatures"]["b2"] == {
        "inputs": {"pixels": ["uint8", [2, 8]]},
        "outputs": ["pixels_echo", "scores", "top"],
    }
    want = nitro.predict({"x": pixels.astype(np.float32) / 255.0})
    np.testing.assert_allclose(got["b2/scores"], want["logits"], rtol=1e-6, atol=1e-6)
    assert got["b2/top"].dtype == np.int32
    np.testing.assert_array_equal(got["b2/top"], want["top"])
    np.testing.assert_array_equal(got["b2/pixels_echo"], pixels)
    with open(os.path.join(path, "assets.extra", "postprocess.py")) as f:
        assert f.read() == Rich().export_postprocess()


def test_without_tensorflow_the_export_names_the_tf_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # import fails
    nitro = nx.Nitro(Exportable(), **quiet())
    with pytest.raises(
        nx.MissingExtraError,
        match=r"TFSavedModel needs the `tensorflow` package.*jaxnitro\[tf\]",
    ):
        nx.export_model(nitro, nx.export.TFSavedModel(), dir=tmp_path, name="tf")
    assert os.listdir(tmp_path) == []  # nothing half-written


def test_platforms_are_checked_when_constructed():
    assert repr(nx.export.TFSavedModel()) == "TFSavedModel(platforms=('cpu',))"
    with pytest.raises(nx.ConfigError, match=r"platforms=\('gpu',\).*cpu, cuda"):
        nx.export.TFSavedModel(platforms=("gpu",))
    with pytest.raises(nx.ConfigError, match="at least one is needed"):
        nx.export.TFSavedModel(platforms=())
