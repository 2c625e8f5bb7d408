"""export_model end to end in-process: the bundle's files, its numbers against
predict, the weights and Device values it bakes, the phase, atomicity, and the hook
disagreements refused before anything is written."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from experiments import make_batches, mlp
from export_experiments import Exportable, Rich, quiet

import jaxnitro as nx


def export(nitro, tmp_path, **kw):
    kw.setdefault("name", "v1")
    return nx.export_model(nitro, nx.StableHLOBundle(), dir=tmp_path / "out", **kw)


def test_bundle_files_and_outputs_equal_predict(tmp_path):
    nitro = nx.Nitro(Exportable(), **quiet(run_dir=str(tmp_path / "run")))
    nitro.train()
    entries = nx.cache_stats()["entries"]
    path = export(nitro, tmp_path, batch_sizes=[1, 4])
    assert nx.cache_stats()["entries"] == entries  # export compiles outside the cache
    assert path == str(tmp_path / "out" / "v1")
    files = set(os.listdir(path))
    assert files == {
        "manifest.json",
        "program_b1.jaxexport",
        "program_b4.jaxexport",
        "program_dynamic.jaxexport",
        "weights.safetensors",
        "provenance.json",
    }
    model = nx.load_bundle(path)
    manifest = model.manifest
    assert manifest["format_version"] == 1
    assert manifest["platforms"] == ["cpu", "cuda"]
    assert manifest["inputs"][0] == {
        "name": "x",
        "dtype": "float32",
        "shape": [1, 8],
        "batch_axis": 0,
        "axis_letters": None,
        "nonfinite": "refuse",
    }
    assert manifest["outputs"][0]["shape"] == [1, 3]
    assert "nonfinite" not in manifest["outputs"][0]
    assert set(manifest["files"]) == files - {"manifest.json"}
    x = make_batches(7, 7, seed=5)[0]["x"]
    for n in (1, 4, 7):
        expected = nitro.predict({"x": x[:n]})
        np.testing.assert_allclose(
            model(x=x[:n])["logits"], expected, rtol=1e-6, atol=1e-6
        )
    assert not any(name.startswith(".") for name in os.listdir(tmp_path / "out"))


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_a_bundle_follows_the_process_umask(tmp_path, umask):
    """Not mkdtemp's drwx------ nor safetensors' -rw-------: a bundle is shared."""
    nitro = nx.Nitro(Exportable(), **quiet(run_dir=str(tmp_path / "run")))
    previous = os.umask(umask)
    try:
        path = export(nitro, tmp_path)
    finally:
        os.umask(previous)
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o777 & ~umask)
    modes = {
        name: oct(os.stat(os.path.join(path, name)).st_mode & 0o777)
        for name in os.listdir(path)
    }
    assert "weights.safetensors" in modes
    assert modes == dict.fromkeys(modes, oct(0o666 & ~umask))


def test_export_reads_ema_weights_and_bakes_device_values(tmp_path):
    nitro = nx.Nitro(Exportable(max_epochs=3), ema=nx.EMA(0.5), **quiet())
    nitro.train()
    nitro.set_device(temperature=3.0)
    model = nx.load_bundle(export(nitro, tmp_path))
    x = make_batches(5, 5, seed=3)[0]["x"]
    out = model(x=x)["logits"]
    np.testing.assert_allclose(out, nitro.predict({"x": x}), rtol=1e-6, atol=1e-6)
    raw = np.asarray(mlp(nitro.parameters, x)) / 3.0
    assert not np.allclose(out, raw, atol=1e-4)  # the EMA, not the raw weights


def test_preprocess_dict_outputs_rename_echo_and_postprocess(tmp_path):
    nitro = nx.Nitro(Rich(), **quiet())
    path = export(nitro, tmp_path, batch_sizes=[2])
    model = nx.load_bundle(path)
    assert model.output_names == ("scores", "top", "pixels_echo")
    pixels = np.arange(3 * 8, dtype=np.uint8).reshape(3, 8) * 7
    out = model(pixels=pixels)
    expected = nitro.predict({"x": pixels.astype(np.float32) / 255.0})
    np.testing.assert_allclose(out["scores"], expected["logits"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out["top"], expected["top"])
    np.testing.assert_array_equal(out["pixels_echo"], pixels)
    assert out["pixels_echo"].dtype == np.uint8
    manifest = model.manifest
    assert manifest["inputs"][0]["axis_letters"] == "f"
    assert manifest["client_outputs"][0]["name"] == "label"
    assert manifest["postprocess"] == "postprocess.py"
    with open(os.path.join(path, "postprocess.py")) as f:
        assert f.read() == Rich().export_postprocess()


def test_provenance_layers_merge_lowest_first(tmp_path):
    nitro = nx.Nitro(Rich(), **quiet(run_dir=str(tmp_path / "run")))
    path = export(nitro, tmp_path, provenance={"model": "override", "owner": "me"})
    with open(os.path.join(path, "provenance.json")) as f:
        prov = json.load(f)
    assert prov["framework"] == "jaxnitro"
    assert prov["name"] == "v1" and prov["batch_sizes"] == [1]
    assert prov["run_dir"] == str(tmp_path / "run")
    assert prov["config"]["temperature"] == 1.0
    assert prov["seed"] == -1  # export_provenance_extra beats the framework
    assert prov["model"] == "override" and prov["owner"] == "me"  # the argument wins
    assert prov["class_names"] == ["a", "b", "c"]
    assert "checkpoint" not in prov and "git_commit" not in prov


def test_export_publishes_export_compiling_and_restores_the_phase(tmp_path):
    nitro = nx.Nitro(Exportable(), **quiet())
    before = nitro.phase
    seen = []
    handle = nx.register_phase_monitor(
        lambda phase, step, epoch, info: seen.append(type(phase).__name__), nitro
    )
    try:
        export(nitro, tmp_path)
    finally:
        nx.unregister_phase_monitor(handle)
    assert "ExportCompiling" in seen
    assert nitro.phase == before


class Exploding(nx.StableHLOBundle):
    def write_export(self, program, params, state, example_inputs, request):
        with open(os.path.join(request.dir, "weights.safetensors"), "w") as f:
            f.write("half")
        raise KeyboardInterrupt


def test_an_interrupted_export_leaves_no_bundle_and_restores_the_phase(tmp_path):
    nitro = nx.Nitro(Exportable(), **quiet())
    before = nitro.phase
    with pytest.raises(KeyboardInterrupt):
        nx.export_model(nitro, Exploding(), dir=tmp_path / "out", name="v1")
    assert os.listdir(tmp_path / "out") == []
    assert nitro.phase == before


def test_arguments_are_checked(tmp_path):
    nitro = nx.Nitro(Exportable(), **quiet())
    export(nitro, tmp_path)
    with pytest.raises(nx.ConfigError, match=r"v1 exists already.*never overwritten"):
        export(nitro, tmp_path)
    with pytest.raises(nx.ConfigError, match=r"batch_sizes=\[0\] must be"):
        export(nitro, tmp_path, name="v2", batch_sizes=[0])
    with pytest.raises(nx.ConfigError, match=r"batch_sizes=\[2, 2\] must be"):
        export(nitro, tmp_path, name="v2", batch_sizes=[2, 2])
    with pytest.raises(nx.ConfigError, match="without a slash"):
        export(nitro, tmp_path, name="a/b")
    with pytest.raises(nx.ConfigError, match="platform is one of"):
        nx.StableHLOBundle(platforms=("gpu",))
    with pytest.raises(nx.ConfigError, match=r"backend=<class.*StableHLOBundle\(\)"):
        nx.export_model(nitro, nx.StableHLOBundle, dir=tmp_path, name="v3")


class NoOutput(Rich):
    def export_outputs(self):
        return [nx.ExportSpec("probs")]


class EchoNoFrom(Exportable):
    def export_outputs(self):
        return [nx.ExportSpec("logits"), nx.ExportSpec("x")]


class WrongDtype(Exportable):
    def forward(self, model, params, state, *, x):
        import jax

        return jax.lax.exp(x) @ params["w1"] @ params["w2"], state

    def export_inputs(self):
        return [nx.ExportSpec("x", "int32", (1, 8))]


class ClientNoPost(Exportable):
    def export_client_outputs(self):
        return [nx.ExportSpec("label", "int32", (1,))]


class BadDeclared(Exportable):
    def export_outputs(self):
        return [nx.ExportSpec("logits", "float32", (1, 4))]


class BareTwice(Exportable):
    def export_outputs(self):
        return [nx.ExportSpec("logits"), nx.ExportSpec("more")]


class NoBatchAxis(Exportable):
    def forward(self, model, params, state, *, x):
        return jnp.sum(x), state


class MissingField(Exportable):
    def export_inputs(self):
        return [nx.ExportSpec("z", "float32", (1, 8))]


class NoHooks(Exportable):
    export_inputs = nx.Experiment.export_inputs


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (NoOutput, r"'probs'.*neither an output of forward \(it returns logits, top"),
        (EchoNoFrom, r"names the wire input 'x'.*from_='x'"),
        (WrongDtype, r"failed on example wire inputs \(x: int32\[1, 8\]\).*export_pre"),
        (ClientNoPost, "export_client_outputs is declared but export_postprocess"),
        (BadDeclared, r"declares float32\[1, 4\].*computes float32\[1, 3\]"),
        (BareTwice, "forward returns a bare"),
        (NoBatchAxis, r"'logits' has shape \(\) on a batch of 1"),
        (MissingField, r"batch field `x`.*declare the field in export_inputs"),
        (NoHooks, r"needs NoHooks.export_inputs"),
    ],
)
def test_disagreeing_hooks_fail_before_anything_is_written(tmp_path, cls, message):
    nitro = nx.Nitro(cls(), **quiet())
    with pytest.raises(nx.HookError, match=message):
        export(nitro, tmp_path)
    assert not (tmp_path / "out").exists()


def test_averaged_weights_are_exported_with_their_provenance(tmp_path):
    run = str(tmp_path / "run")
    nx.Nitro(Exportable(max_epochs=3), logger=None, run_dir=run).train()
    nitro = nx.Nitro(
        Exportable(),
        logger=None,
        run_dir=run,
        weights=("latest", nx.Average(nx.Last(2))),
    )
    path = export(nitro, tmp_path)
    x = make_batches(4, 4, seed=2)[0]["x"]
    out = nx.load_bundle(path)(x=x)["logits"]
    np.testing.assert_allclose(out, nitro.predict({"x": x}), rtol=1e-6, atol=1e-6)
    with open(os.path.join(path, "provenance.json")) as f:
        prov = json.load(f)
    assert prov["averaged_from"] == json.loads(json.dumps(nitro.averaged_from))


class BatchSizeBound(Exportable):
    def forward(self, model, params, state, *, x):
        n = int(x.shape[0])  # a concrete batch size: no symbolic program
        return mlp(params, x) + jnp.zeros((n, 3)), state


class PreprocessList(Exportable):
    def export_preprocess(self, x):
        return [x]


class PostprocessBytes(Exportable):
    def export_postprocess(self):
        return b"def postprocess(out): ..."


def test_program_and_hook_errors_name_the_fix(tmp_path):
    nitro = nx.Nitro(BatchSizeBound(), **quiet())
    with pytest.raises(nx.HookError, match="does not trace with a symbolic batch"):
        export(nitro, tmp_path)
    assert os.listdir(tmp_path / "out") == []
    with pytest.raises(nx.HookError, match="must return a dict of batch fields"):
        export(nx.Nitro(PreprocessList(), **quiet()), tmp_path)
    with pytest.raises(nx.HookError, match="postprocess's Python source as a str"):
        export(nx.Nitro(PostprocessBytes(), **quiet()), tmp_path)


def test_device_resident_values_are_refused_by_key_path():
    from jaxnitro.export.view import check_host_resident

    check_host_resident("the weights", {"w": np.zeros(2)})
    with pytest.raises(
        nx.ConfigError, match=r"holds a device-resident array at \['w'\]"
    ):
        check_host_resident("the weights", {"w": jnp.zeros(2)})
