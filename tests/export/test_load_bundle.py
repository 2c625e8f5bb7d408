"""load_bundle: refusals (newer format, missing file, tampered file), input checks,
and the outputs of a bundle loaded in a fresh process against predict."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from experiments import make_batches
from export_experiments import Exportable, quiet

import jaxnitro as nx


@pytest.fixture
def bundle(tmp_path):
    nitro = nx.Nitro(Exportable(), **quiet())
    path = nx.export_model(
        nitro, nx.StableHLOBundle(), dir=tmp_path, name="v1", batch_sizes=[1, 3]
    )
    return nitro, path


def edit_manifest(path, **changes):
    file = os.path.join(path, "manifest.json")
    with open(file) as f:
        manifest = json.load(f)
    manifest.update(changes)
    with open(file, "w") as f:
        json.dump(manifest, f)


def test_newer_format_version_is_refused(bundle):
    _, path = bundle
    edit_manifest(path, format_version=2)
    with pytest.raises(
        nx.export.BundleVersionError, match="format version 2, newer than"
    ):
        nx.load_bundle(path)
    edit_manifest(path, format="other")
    with pytest.raises(nx.export.BundleVersionError, match="declares format 'other'"):
        nx.load_bundle(path)


def test_missing_files_are_refused(bundle, tmp_path):
    _, path = bundle
    os.remove(os.path.join(path, "program_b3.jaxexport"))
    with pytest.raises(
        nx.export.BundleFileMissingError, match=r"program_b3.jaxexport is miss"
    ):
        nx.load_bundle(path)
    with pytest.raises(nx.export.BundleFileMissingError, match="is not a bundle"):
        nx.load_bundle(tmp_path)


def test_a_tampered_weights_file_is_refused(bundle):
    _, path = bundle
    with open(os.path.join(path, "weights.safetensors"), "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\x00\x00\x80\x7f")
    with pytest.raises(
        nx.export.BundleChecksumError, match=r"weights.safetensors has sha256"
    ):
        nx.load_bundle(path)
    assert issubclass(nx.export.BundleChecksumError, nx.export.BundleError)
    assert issubclass(nx.export.BundleError, nx.NitroError)


def test_on_a_default_platform_it_was_not_lowered_for_it_runs_on_one_it_was(
    bundle, monkeypatch
):
    """A TPU machine loading a bundle lowered for cpu and cuda runs it on its CPU."""
    import jax
    from jax import export

    nitro, path = bundle
    x = make_batches(3, 3, seed=4)[0]["x"]
    monkeypatch.setattr(export, "default_export_platform", lambda: "tpu")
    model = nx.load_bundle(path)
    assert model._device == jax.devices("cpu")[0]
    np.testing.assert_allclose(
        model(x=x)["logits"], nitro.predict({"x": x}), rtol=1e-6, atol=1e-6
    )


def test_a_bundle_for_no_platform_this_process_has_is_refused(tmp_path):
    import jax

    try:
        jax.devices("cuda")
        pytest.skip("this process has a CUDA device")
    except RuntimeError:
        pass
    nitro = nx.Nitro(Exportable(), **quiet())
    path = nx.export_model(
        nitro, nx.StableHLOBundle(platforms=("cuda",)), dir=tmp_path, name="gpu"
    )
    default = jax.export.default_export_platform()
    message = (
        f"load_bundle: {path} holds programs lowered for cuda, and this process has "
        f"no device of those platforms (its default is {default}). Export the model "
        f"again with StableHLOBundle(platforms=(..., {default!r})), or load the "
        "bundle in a process that has one of them (JAX_PLATFORMS)."
    )
    with pytest.raises(nx.export.BundlePlatformError, match=f"^{re.escape(message)}$"):
        nx.load_bundle(path)
    assert issubclass(nx.export.BundlePlatformError, nx.export.BundleError)


def test_inputs_are_checked_by_name_dtype_and_shape(bundle):
    _, path = bundle
    model = nx.load_bundle(path)
    assert repr(model) == "LoadedBundle('v1', inputs=['x'], outputs=['logits'])"
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(nx.ConfigError, match=r"missing \['x'\], unknown \['y'\]"):
        model(y=x)
    with pytest.raises(nx.ConfigError, match=r"dtype complex64 does not cast safely"):
        model(x=x.astype(np.complex64))
    with pytest.raises(nx.ConfigError, match=r"shape \(2, 9\) does not match.*float32"):
        model(x=np.zeros((2, 9), np.float32))
    out = model(x=np.zeros((2, 8), np.int8))  # casts safely
    assert out["logits"].shape == (2, 3) and out["logits"].dtype == np.float32


def test_checkpoint_provenance_and_git_diff_file(tmp_path):
    run = tmp_path / "run"
    nx.Nitro(Exportable(max_epochs=1), logger=None, run_dir=str(run)).train()
    nitro = nx.Nitro(
        Exportable(), logger=None, run_dir=str(run), weights=("latest", "latest")
    )
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "model.py").write_text("A = 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    (repo / "model.py").write_text("A = 2\n")
    path = nx.export_model(
        nitro, nx.StableHLOBundle(), dir=tmp_path, name="v1", provenance_root=repo
    )
    with open(os.path.join(path, "provenance.json")) as f:
        prov = json.load(f)
    assert prov["checkpoint"] == os.path.abspath(nitro.checkpoint_source)
    assert prov["git_branch"] == "main" and prov["git_dirty"] is True
    assert len(prov["git_commit"]) == 40 and "git_diff" not in prov
    assert prov["git_diff_file"] == "git.diff"
    with open(os.path.join(path, "git.diff")) as f:
        assert "+A = 2" in f.read()
    assert "git.diff" in nx.load_bundle(path).manifest["files"]


def test_git_provenance_outside_a_work_tree_warns_and_is_empty(tmp_path):
    with pytest.warns(nx.NitroWarning, match="is not inside a git work tree"):
        assert nx.export.git_provenance(tmp_path) == {}
    assert nx.site_provenance(nx.StableHLOBundle(), None) == {}


LOADER = """
import sys, numpy as np, jaxnitro as nx
model = nx.load_bundle(sys.argv[1])
data = np.load(sys.argv[2])
np.savez(sys.argv[3], **{
    str(n): model(x=data["x"][:n])["logits"] for n in (1, 3, 5, 7)
})
"""


@pytest.mark.needs_processes
@pytest.mark.slow
def test_a_fresh_process_reproduces_predict(bundle, tmp_path):
    nitro, path = bundle
    nitro.train()  # predict after training: a fresh export of the trained weights
    path = nx.export_model(
        nitro, nx.StableHLOBundle(), dir=tmp_path, name="v2", batch_sizes=[1, 3, 5]
    )
    x = make_batches(7, 7, seed=8)[0]["x"]
    np.savez(tmp_path / "in.npz", x=x)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run(
        [sys.executable, "-c", LOADER, path, tmp_path / "in.npz", tmp_path / "out.npz"],
        check=True,
        env=env,
        timeout=300,
    )
    got = np.load(tmp_path / "out.npz")
    for n in (1, 3, 5, 7):
        np.testing.assert_allclose(
            got[str(n)], nitro.predict({"x": x[:n]}), rtol=1e-6, atol=1e-6
        )


def test_a_two_input_bundle_refuses_disagreeing_batch_sizes(tmp_path):
    class Two(Exportable):
        def export_inputs(self):
            return [
                nx.ExportSpec("x", "float32", (1, 8)),
                nx.ExportSpec("w", "float32", (1,)),
            ]

        def export_preprocess(self, x, w):
            return {"x": x * w[:, None]}

    nitro = nx.Nitro(Two(), **quiet())
    model = nx.load_bundle(
        nx.export_model(nitro, nx.StableHLOBundle(), dir=tmp_path, name="t")
    )
    x = np.ones((3, 8), np.float32)
    with pytest.raises(nx.ConfigError, match=r"disagree on the batch size.*\[2, 3\]"):
        model(x=x, w=np.ones(2, np.float32))
    out = model(x=x, w=np.full(3, 2.0, np.float32))["logits"]
    np.testing.assert_allclose(out, nitro.predict({"x": 2 * x}), rtol=1e-6, atol=1e-6)


def test_nonfinite_inputs_are_refused_unless_the_export_allows_them(bundle, tmp_path):
    _, path = bundle
    x = np.zeros((2, 8), np.float32)
    x[0, 5], x[1, 3] = np.inf, np.nan
    refusal = (
        r"input 'x': 2 values are NaN or infinite \(the first at index \[0, 5\]\); "
        r"bundle 'v1' refuses them \(its export declared nonfinite='refuse', the "
        r"default\).*ExportSpec\('x', \.\.\., nonfinite='allow'\)"
    )
    with pytest.raises(nx.ConfigError, match=refusal):
        nx.load_bundle(path)(x=x)
    manifest = nx.load_bundle(path).manifest
    del manifest["inputs"][0]["nonfinite"]  # a manifest without the key refuses
    edit_manifest(path, inputs=manifest["inputs"])
    with pytest.raises(nx.ConfigError, match=refusal):
        nx.load_bundle(path)(x=x)

    class Allowing(Exportable):
        def export_inputs(self):
            return [nx.ExportSpec("x", "float32", (1, 8), nonfinite="allow")]

    nitro = nx.Nitro(Allowing(), **quiet())
    allowing = nx.load_bundle(
        nx.export_model(nitro, nx.StableHLOBundle(), dir=tmp_path, name="a")
    )
    assert allowing.manifest["inputs"][0]["nonfinite"] == "allow"
    out = allowing(x=x)["logits"]
    assert not np.isfinite(out).all()
