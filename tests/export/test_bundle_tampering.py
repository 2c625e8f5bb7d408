"""load_bundle under hostile bundles: every tamper of issue 28 (item 1) is a named
BundleError subclass whose message names the file and the field; a sweep replaces
every manifest value with values of the wrong kind and finds nothing but those."""

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
from export_experiments import Exportable, quiet

import jaxnitro as nx
from jaxnitro.export import manifest as manifest_module


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    nitro = nx.Nitro(Exportable(), **quiet())
    return nx.export_model(
        nitro,
        nx.StableHLOBundle(),
        dir=tmp_path_factory.mktemp("bundle"),
        name="v1",
        batch_sizes=[1, 3],
    )


@pytest.fixture
def bundle(original, tmp_path):
    """A fresh copy of the bundle, inside a folder that holds files beside it."""
    path = str(tmp_path / "site" / "v1")
    shutil.copytree(original, path)
    return path


def read(path):
    with open(os.path.join(path, "manifest.json")) as f:
        return json.load(f)


def write(path, manifest):
    with open(os.path.join(path, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def tamper(path, change):
    manifest = read(path)
    change(manifest)
    write(path, manifest)


def digest(file):
    with open(file, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def rehash(path, name):
    """Record the current sha256 of `name` in the manifest (a deliberate forger)."""
    tamper(path, lambda m: m["files"].update({name: digest(os.path.join(path, name))}))


def refused(path, error, field, match):
    with pytest.raises(error, match=match) as info:
        nx.load_bundle(path)
    assert info.value.field == field
    assert issubclass(error, nx.export.BundleError)
    return info.value


def test_an_empty_files_table_does_not_turn_the_checksums_off(bundle):
    tamper(bundle, lambda m: m.update(files={}))
    error = refused(
        bundle,
        nx.export.BundleManifestError,
        "files",
        r"manifest.json: files has no sha256 for 'program_b1.jaxexport' "
        r"\(programs\['1'\]\); every file a bundle needs is listed",
    )
    assert error.file == os.path.join(os.path.realpath(bundle), "manifest.json")


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("weights.safetensors", "weights.file"),
        ("program_dynamic.jaxexport", r"programs\['dynamic'\]"),
        ("provenance.json", "the provenance"),
    ],
)
def test_every_needed_file_must_be_checksummed(bundle, name, field):
    tamper(bundle, lambda m: m["files"].pop(name))
    refused(
        bundle,
        nx.export.BundleManifestError,
        "files",
        rf"no sha256 for '{name}' \({field}\)",
    )


def test_a_program_outside_the_folder_is_refused_by_name(bundle):
    outside = os.path.join(os.path.dirname(bundle), "outside.jaxexport")
    shutil.copy(os.path.join(bundle, "program_b1.jaxexport"), outside)

    def point_out(m):
        m["programs"]["1"] = "../outside.jaxexport"
        m["files"]["../outside.jaxexport"] = digest(outside)

    tamper(bundle, point_out)
    refused(
        bundle,
        nx.export.BundlePathError,
        "programs['1']",
        r"programs\['1'\] is '../outside.jaxexport', which is not a path inside "
        r"the bundle's folder .*without '\.\.' or a leading '/'",
    )


def test_weights_outside_the_folder_and_absolute_paths_are_refused(bundle):
    tamper(bundle, lambda m: m["weights"].update(file="sub/../../w.safetensors"))
    refused(bundle, nx.export.BundlePathError, "weights.file", r"weights.file is 'sub/")
    tamper(bundle, lambda m: m["weights"].update(file="/etc/passwd"))
    refused(
        bundle, nx.export.BundlePathError, "weights.file", r"is '/etc/passwd', which"
    )
    tamper(bundle, lambda m: m["weights"].update(file="weights.safetensors"))
    tamper(bundle, lambda m: m["files"].update({"../notes.txt": "0" * 64}))
    refused(
        bundle, nx.export.BundlePathError, "files['../notes.txt']", r"'\.\./notes.txt'"
    )
    tamper(bundle, lambda m: m["files"].pop("../notes.txt"))
    tamper(bundle, lambda m: m.update(postprocess="post\x00.py"))
    refused(
        bundle, nx.export.BundlePathError, "postprocess", r"postprocess is 'post\\x00"
    )


def test_a_symbolic_link_leaving_the_folder_is_refused(bundle):
    program = os.path.join(bundle, "program_b1.jaxexport")
    outside = os.path.join(os.path.dirname(bundle), "elsewhere.jaxexport")
    shutil.move(program, outside)
    os.symlink(outside, program)  # same bytes, same checksum: only the link differs
    refused(
        bundle,
        nx.export.BundlePathError,
        "programs['1']",
        rf"programs\['1'\] is 'program_b1.jaxexport', which resolves to "
        rf"{outside} through a symbolic link, outside the bundle's folder",
    )
    os.remove(program)
    os.symlink("../v1/program_b3.jaxexport", program)  # a link inside is fine...
    rehash(bundle, "program_b1.jaxexport")
    # ...but the b3 program is not the b1 program the manifest declares.
    refused(
        bundle,
        nx.export.BundleProgramError,
        "programs['1']",
        r"program_b1.jaxexport \(programs\['1'\]\) has the input 'x' as "
        r"float32\[3,8\], but the manifest declares float32\[batch, 8\] at batch "
        r"size 1; the program does not belong to this manifest",
    )


def test_a_manifest_link_leaving_the_folder_is_refused(bundle):
    manifest = os.path.join(bundle, "manifest.json")
    outside = os.path.join(os.path.dirname(bundle), "manifest.json")
    shutil.move(manifest, outside)
    os.symlink(outside, manifest)
    refused(
        bundle, nx.export.BundlePathError, "the manifest", r"through a symbolic link"
    )


def test_a_fifo_or_a_folder_in_place_of_a_file_is_refused(bundle):
    weights = os.path.join(bundle, "weights.safetensors")
    os.remove(weights)
    os.mkfifo(weights)  # reading it would block forever
    refused(
        bundle,
        nx.export.BundleFileMissingError,
        "files['weights.safetensors']",
        r"weights.safetensors is missing \(or not a regular file\)",
    )
    manifest = os.path.join(bundle, "manifest.json")
    os.remove(manifest)
    os.mkdir(manifest)
    refused(
        bundle, nx.export.BundleManifestError, None, r"manifest.json is not a regular"
    )


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"format": ', r"manifest.json is not valid JSON \(Expecting value"),
        ("[1, 2]", r"the top level must be an object, got an array \[1, 2\]"),
        (b"\xff\xfe{}", r"manifest.json is not UTF-8 text"),
        ("[" * 5000, r"manifest.json nests 5000 levels deep; at most 16"),
        ('{"files": {}, "files": {}}', r"the key 'files' appears twice"),
        ('{"n": ' + "9" * 5000 + "}", r"not valid JSON \(Exceeds the limit"),
    ],
)
def test_a_manifest_that_is_no_json_object_is_refused(bundle, text, match):
    data = text if isinstance(text, bytes) else text.encode()
    with open(os.path.join(bundle, "manifest.json"), "wb") as f:
        f.write(data)
    with pytest.raises(nx.export.BundleManifestError, match=match) as info:
        nx.load_bundle(bundle)
    assert info.value.file.endswith("manifest.json")


def test_a_manifest_over_the_size_limit_is_refused_before_it_is_read(
    bundle, monkeypatch
):
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", 512)
    refused(
        bundle,
        nx.export.BundleManifestError,
        None,
        r"manifest.json is \d+ bytes; a manifest is at most 512",
    )


SCHEMA = [
    (lambda m: m.pop("files"), "files", r"files is missing; format version 1"),
    (lambda m: m.update(weights=[]), "weights", r"weights must be an object, got an"),
    (lambda m: m.update(inputs={}), "inputs", r"inputs must be an array, got an obj"),
    (
        lambda m: m["inputs"][0].update(dtype="nonsense"),
        "inputs[0].dtype",
        r"inputs\[0\].dtype is 'nonsense', not a NumPy dtype name such as 'float32'",
    ),
    (
        lambda m: m["outputs"][0].update(dtype="object"),
        "outputs[0].dtype",
        r"outputs\[0\].dtype is 'object'; a wire tensor has a numeric dtype",
    ),
    (
        lambda m: m["inputs"][0].update(shape=[1, "8"]),
        "inputs[0].shape[1]",
        r"inputs\[0\].shape\[1\] must be an integer, got a string '8'",
    ),
    (
        lambda m: m["inputs"][0].update(nonfinite="sometimes"),
        "inputs[0].nonfinite",
        r"inputs\[0\].nonfinite is 'sometimes'; it is one of \['refuse', 'allow'\]",
    ),
    (
        lambda m: m["outputs"][0].update(nonfinite="allow"),
        "outputs[0].nonfinite",
        r"outputs\[0\].nonfinite is not a key format version 1 defines",
    ),
    (lambda m: m.update(extra=1), "extra", r"extra is not a key format version 1"),
    (
        lambda m: m["programs"].pop("3"),
        "programs.3",
        r"programs.3 is missing; format version 1 requires it",
    ),
    (
        lambda m: m.update(batch_sizes=[1, 0]),
        "batch_sizes[1]",
        r"batch_sizes\[1\] is 0; it must be >= 1",
    ),
    (
        lambda m: m["files"].update({"weights.safetensors": "abc"}),
        "files['weights.safetensors']",
        r"files\['weights.safetensors'\] is 'abc', not a sha256",
    ),
    (
        lambda m: m["weights"].update(keys=["a", "a"]),
        "weights.keys",
        r"weights.keys names a weight tensor twice",
    ),
    (
        lambda m: m.update(platforms=["cpu", "gpu"]),
        "platforms[1]",
        r"platforms\[1\] is 'gpu', not one of cpu, cuda, rocm, tpu",
    ),
]


@pytest.mark.parametrize(("change", "field", "match"), SCHEMA)
def test_schema_violations_name_the_field(bundle, change, field, match):
    tamper(bundle, change)
    error = refused(bundle, nx.export.BundleManifestError, field, match)
    assert "export the bundle again" in str(error)


def test_format_and_version_types_are_checked(bundle):
    tamper(bundle, lambda m: m.update(format_version=True))
    refused(
        bundle, nx.export.BundleVersionError, "format", r"version True; this jaxnitro"
    )
    tamper(bundle, lambda m: m.update(format_version=0))
    refused(
        bundle, nx.export.BundleVersionError, "format_version", r"versions start at 1"
    )


def test_an_altered_program_with_its_checksum_updated_is_a_named_error(bundle):
    program = os.path.join(bundle, "program_dynamic.jaxexport")
    with open(program, "r+b") as f:
        f.truncate(100)
    rehash(bundle, "program_dynamic.jaxexport")
    refused(
        bundle,
        nx.export.BundleProgramError,
        "programs['dynamic']",
        r"program_dynamic.jaxexport \(programs\['dynamic'\]\) is not a readable "
        r"jax.export program \(struct.error: unpack_from requires.*altered after "
        r"the export, its checksum updated with it",
    )


def test_altered_weights_with_their_checksum_updated_are_a_named_error(bundle):
    weights = os.path.join(bundle, "weights.safetensors")
    with open(weights, "wb") as f:
        f.write(b"\xff" * 64)
    rehash(bundle, "weights.safetensors")
    refused(
        bundle,
        nx.export.BundleProgramError,
        "weights.file",
        r"weights.safetensors is not a readable safetensors file",
    )


def test_weight_keys_and_shapes_must_match_the_programs(bundle):
    manifest = read(bundle)
    keys = manifest["weights"]["keys"]
    tamper(bundle, lambda m: m["weights"].update(keys=[*keys[:-1], "['params']['zz']"]))
    refused(
        bundle,
        nx.export.BundleProgramError,
        "weights.keys",
        r"holds no tensor \"\['params'\]\['zz'\]\", which the manifest lists",
    )
    tamper(bundle, lambda m: m["weights"].update(keys=keys[::-1]))
    refused(
        bundle,
        nx.export.BundleProgramError,
        "programs['1']",
        r"takes the weight \"\['params'\]\['w2'\]\" as float32\[16\], but the "
        r"weights file holds float32\[16, 3\]",
    )
    tamper(bundle, lambda m: m["weights"].update(keys=keys[:-1]))
    refused(
        bundle,
        nx.export.BundleProgramError,
        "programs['1']",
        r"takes 4 arguments, but the manifest gives it 2 weight tensors and 1 wire",
    )


def test_a_changed_output_dtype_disagrees_with_the_program(bundle):
    tamper(bundle, lambda m: m["outputs"][0].update(dtype="float16"))
    refused(
        bundle,
        nx.export.BundleProgramError,
        "programs['1']",
        r"has the output 'logits' as float32\[1,3\], but the manifest declares "
        r"float16\[batch, 3\]",
    )


def leaves(value, path=()):
    """Every (path, value) of a JSON tree, containers included."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, (*path, i))


WRONG = [None, True, -1, 2.5, "", "../x", [], {}, [[1]], {"a": None}]


def test_every_manifest_value_replaced_gives_a_bundle_error_or_loads(bundle):
    """The sweep: no replacement of any value raises anything but a BundleError."""
    pristine = read(bundle)
    outcomes = {}
    for path, _ in list(leaves(pristine))[1:]:
        for wrong in WRONG:
            manifest = json.loads(json.dumps(pristine))
            parent = manifest
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = wrong
            write(bundle, manifest)
            try:
                nx.load_bundle(bundle)
                outcome = "loads"
            except nx.export.BundleError as error:
                outcome = type(error).__name__
            outcomes[(path, repr(wrong))] = outcome
    assert len(outcomes) > 300
    loaded = {key for key, outcome in outcomes.items() if outcome == "loads"}
    # Only free text takes any string (a tensor's name, the jax version), and
    # what was null may stay null.
    free = [("inputs", 0, "name"), ("outputs", 0, "name"), ("jax_version",)]
    assert loaded == {
        *((path, repr(text)) for path in free for text in ("../x",)),
        *(
            ((*spec, "axis_letters"), "None")
            for spec in [("inputs", 0), ("outputs", 0)]
        ),
        *(
            ((key,), "None")
            for key in ("client_inputs", "client_outputs", "postprocess")
        ),
    }
    write(bundle, pristine)
    out = nx.load_bundle(bundle)(x=np.zeros((2, 8), np.float32))
    assert out["logits"].shape == (2, 3)
