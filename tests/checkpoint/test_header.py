"""The checkpoint record's typed header: round trip, refusals naming the key, the
defaults an older format-1 record reads with, and a tampered file refused at resume."""

import dataclasses
import json
import os
import re

import numpy as np
import pytest
from checkpoint_fixtures import edit_header, record_header
from experiments import Tiny

import jaxnitro as nx
from jaxnitro.checkpoint import header as header_module
from jaxnitro.checkpoint.header import (
    FORMAT_VERSION,
    KEYS,
    OPTIONAL_KEYS,
    RecordHeader,
)
from jaxnitro.checkpoint.record import CheckpointRecord, read_header

PATH = "runs/E/epoch-0003-step-12.safetensors"

# The keys a required-key refusal is checked for (format_version has its own).
REQUIRED = sorted(set(KEYS) - OPTIONAL_KEYS - {"format_version"})


def full_header() -> RecordHeader:
    """A header with every field set to something other than its default."""
    return record_header(
        epoch=3,
        step=12,
        seed=7,
        preset="small",
        graphconst={"width": 16, "shape": [2, 3]},
        config={"width": 16, "lr": 0.05},
        derived=("class_weights",),
        derived_host={"classes": ["a", "b"]},
        derived_graphconst={"shape": [2, 3]},
        logger_type="jaxnitro.logging.jsonl.JSONLLogger",
        logger_state={"path": "runs/E/log.jsonl"},
        run_id="r-1",
        run_url="file://runs/E",
        anchor_checksums={"default": "ab12"},
        optimizer_layout={"rule of group 'default'": "adam"},
        early_stop={"metric": "loss", "mode": "min", "best": 0.5, "wait": 1},
        plateau={"opt.lr": {"scale": 0.5, "bad_epochs": 0}},
        epoch_loss={"epoch": 3, "step": 12, "batches": 2, "sum": 1.5, "count": 2},
        averaged_from={"epochs": [1, 2], "files": ["a", "b"]},
        hook_fingerprints={"forward": "f0", "loss": "l0"},
        data_signature={"splits": {"train": 4}, "batch_size": 8, "fields": {}},
        run="run-1",
        metrics={"loss": 0.25, "acc": 0.75},
        stop_reason="early_stop",
        prng_keys={"state/['key']": "threefry2x32"},
    )


def through_json(obj):
    return json.loads(json.dumps(obj))


def test_a_header_round_trips_through_its_json():
    header = full_header()
    obj = header.to_json()
    assert list(obj) == list(KEYS)  # every key, in the order a record writes them
    assert obj["derived"] == ["class_weights"]  # a JSON list on disk
    assert RecordHeader.from_json(through_json(obj), path=PATH) == header
    plain = record_header(epoch=1, step=4)
    assert "averaged_from" not in plain.to_json()  # left out when None, as before
    # Left out when None too, so an average's record reads in an older build.
    assert "hook_fingerprints" not in plain.to_json()
    assert "data_signature" not in plain.to_json()
    assert RecordHeader.from_json(through_json(plain.to_json()), path=PATH) == plain


def test_every_optional_key_has_a_default_and_reads_as_it():
    defaults = {
        f.name: f.default if f.default_factory is dataclasses.MISSING else {}
        for f in dataclasses.fields(RecordHeader)
        if f.name in OPTIONAL_KEYS
    }
    assert set(defaults) == OPTIONAL_KEYS
    assert dataclasses.MISSING not in defaults.values()
    older = {k: v for k, v in full_header().to_json().items() if k not in OPTIONAL_KEYS}
    older["optimizer"] = "Plan(...)"  # the key optimizer_layout replaced
    header = RecordHeader.from_json(through_json(older), path=PATH)
    assert {k: getattr(header, k) for k in OPTIONAL_KEYS} == {
        "derived": None,  # unknown: a weights load runs derive
        "derived_host": {},
        "derived_graphconst": None,  # read from graphconst
        "logger_state": None,
        "anchor_checksums": None,
        "optimizer_layout": None,
        "early_stop": None,
        "plateau": {},
        "epoch_loss": None,
        "averaged_from": None,
        "hook_fingerprints": None,  # an older record: a resume compares no code
        "data_signature": None,  # nor data
    }
    assert (header.epoch, header.seed, header.run) == (3, 7, "run-1")


def test_an_unknown_key_is_refused_naming_it_the_file_and_the_fix():
    obj = {**full_header().to_json(), "sead": 7}
    with pytest.raises(
        nx.CheckpointError,
        match=r"runs/E/epoch-0003-step-12.safetensors: its record header holds the "
        r"key `sead`, which a format-1 record does not have\. Did you mean `seed`\? "
        r"The header was edited, or the file was written by a newer jaxnitro or by "
        r"another program: read it with the jaxnitro that wrote it",
    ):
        RecordHeader.from_json(obj, path=PATH)
    two = {**obj, "zzz": 1}
    with pytest.raises(nx.CheckpointError, match=r"the key `sead` \(and `zzz`\)"):
        RecordHeader.from_json(two, path=PATH)


@pytest.mark.parametrize("key", REQUIRED)
def test_a_missing_required_key_is_refused_naming_it(key):
    obj = full_header().to_json()
    del obj[key]
    with pytest.raises(
        nx.CheckpointError,
        match=rf"{PATH}: its record header lacks the key `{key}`, which every "
        rf"format-1 record holds\. .*use another checkpoint",
    ):
        RecordHeader.from_json(obj, path=PATH)


def test_several_missing_keys_are_named_together():
    obj = {"format_version": FORMAT_VERSION}
    with pytest.raises(
        nx.CheckpointError,
        match=r"lacks the key `framework_version` \(and `experiment`, `epoch`, ",
    ):
        RecordHeader.from_json(obj, path=PATH)


@pytest.mark.parametrize("version", [None, 2, "1", True])
def test_another_or_no_format_version_is_refused(version):
    obj = full_header().to_json()
    if version is None:
        del obj["format_version"]
    else:
        obj["format_version"] = version
    with pytest.raises(
        nx.CheckpointError,
        match=rf"{PATH} has record format {version!r}; this jaxnitro reads format 1",
    ):
        RecordHeader.from_json(obj, path=PATH)


@pytest.mark.parametrize(
    "key, value, form",
    [
        ("seed", "7", "an integer"),
        ("epoch", True, "an integer"),
        ("preset", 3, "a string or null"),
        ("metrics", [0.5], "an object"),
        ("derived", ["a", 1], "a list of strings or null"),
        ("prng_keys", {"k": 1}, "an object of strings"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_its_key(key, value, form):
    obj = {**full_header().to_json(), key: value}
    kind = type(value).__name__
    with pytest.raises(
        nx.CheckpointError,
        match=rf"{PATH}: the record header's `{key}` is {re.escape(repr(value))}, a "
        rf"{kind}; it must be {form}\. The header was edited or damaged",
    ):
        RecordHeader.from_json(obj, path=PATH)


def test_a_writer_passing_a_value_of_the_wrong_type_is_refused_before_writing():
    with pytest.raises(
        nx.CheckpointError,
        match=r"^RecordHeader: the record header's `step` is np\.int64\(12\), a "
        r"int64; it must be an integer\.$",
    ):
        record_header(step=np.int64(12))


def test_a_field_of_a_type_the_check_does_not_know_is_a_programming_error():
    # Guards the header's own declaration: a field added as, say, a float must
    # teach `_conforms` its JSON form rather than pass unchecked.
    with pytest.raises(TypeError, match="RecordHeader has a field of unchecked type"):
        header_module._conforms(0.5, float, tuple)


# ------------------------------------------------------------- on disk -----
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained")
    nitro = nx.Nitro(Tiny(max_epochs=1), run_dir=str(run_dir), logger=None)
    nitro.train()
    (entry,) = nx.read_manifest(str(run_dir))
    return run_dir / entry.file


def _copy(path, tmp_path):
    target = tmp_path / path.name
    target.write_bytes(path.read_bytes())
    return target


def test_a_written_record_reads_back_as_the_header_it_was_written_with(trained):
    header = read_header(str(trained))
    assert header.to_json() == CheckpointRecord(str(trained)).meta
    assert (header.epoch, header.step, header.seed) == (1, 4, 42)
    assert header.experiment == "experiments.Tiny"
    assert header.derived == () and header.stop_reason == "completed"
    assert header.format_version == FORMAT_VERSION


def test_a_tampered_header_is_refused_at_resume_naming_the_key_and_file(
    trained, tmp_path
):
    path = _copy(trained, tmp_path)

    def misspell(meta):
        meta["sead"] = meta.pop("seed")
        return meta

    edit_header(path, misspell)
    for open_it in (
        lambda: nx.Nitro(Tiny(), run_dir=str(tmp_path), resume=str(path), logger=None),
        lambda: nx.checkpoint_info(path),
    ):
        with pytest.raises(
            nx.CheckpointError,
            match=rf"{path}: its record header holds the key `sead`.*Did you mean "
            rf"`seed`\?",
        ):
            open_it()
    path = _copy(trained, tmp_path)
    edit_header(path, lambda meta: {**meta, "seed": "42"})
    with pytest.raises(nx.CheckpointError, match=r"`seed` is '42', a str"):
        nx.Nitro(Tiny(), run_dir=str(tmp_path), resume=str(path), logger=None)


def test_an_older_record_without_the_optional_keys_still_resumes(trained, tmp_path):
    path = _copy(trained, tmp_path)
    before = nx.checkpoint_info(path)
    edit_header(
        path, lambda meta: {k: v for k, v in meta.items() if k not in OPTIONAL_KEYS}
    )
    assert nx.checkpoint_info(path) == {**before, "anchor_checksum": None}
    resumed = nx.Nitro(
        Tiny(max_epochs=2), run_dir=str(tmp_path / "run"), resume=str(path), logger=None
    )
    assert (resumed.current_epoch, resumed.current_step) == (1, 4)
    resumed.train()
    assert resumed.current_epoch == 2
    assert os.path.exists(path)
