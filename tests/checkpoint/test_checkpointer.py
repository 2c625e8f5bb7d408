"""Checkpointer retention: selectors, the union, scopes, mixed metrics, filenames,
the stop_reason rewrite, TopKCheckpointer and the setup checks."""

import os
import warnings

import numpy as np
import pytest
from checkpoint_fixtures import (
    bound,
    manifest_files,
    record_files,
    record_header,
    write,
)

import jaxnitro as nx
from jaxnitro.checkpoint import checkpointer as checkpointer_module
from jaxnitro.checkpoint import topk as topk_module
from jaxnitro.checkpoint.checkpointer import Checkpointer
from jaxnitro.checkpoint.info import checkpoint_info
from jaxnitro.checkpoint.manifest import (
    MANIFEST,
    load_manifest,
    read_manifest,
    write_manifest,
)
from jaxnitro.checkpoint.record import CheckpointRecord, save_record
from jaxnitro.checkpoint.retention_checks import (
    check_keep,
    missing_last_warning,
    scope_deletion_warning,
    setup_warnings,
)
from jaxnitro.checkpoint.selectors import Best, Epochs, Every, Last, Selector
from jaxnitro.checkpoint.topk import TopKCheckpointer
from jaxnitro.experiment.record_name import checkpoint_filename

SCORES = {1: 0.9, 2: 0.5, 3: 0.7, 4: 0.4, 5: 0.8, 6: 0.6, 7: 0.95, 8: 0.3, 9: 0.85}


# ------------------------------------------------------------------ selectors -----
@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Best(0), r"Best\(k\) needs an integer k >= 1, got 0"),
        (lambda: Best(among=3), r"Best\(among=...\) takes a selector .* got 3"),
        (lambda: Last(0), r"Last\(n\) needs an integer n >= 1, got 0"),
        (lambda: Every(0), r"Every\(n\) needs an integer n >= 1, got 0"),
        (lambda: Every(True), r"Every\(n\) needs an integer n >= 1, got True"),
        (lambda: Epochs(5), r"takes a range or a collection .* got 5"),
        (lambda: Epochs([0, 2]), r"epoch numbers >= 1; got \[0\]"),
        (lambda: Epochs(range(0, 5)), r"range\(0, 5\) holds 0\. Keep the range"),
        (lambda: Epochs(range(5, -2, -2)), r"range\(5, -2, -2\) holds -1"),
        (lambda: Epochs([]), "needs at least one epoch"),
    ],
)
def test_selectors_validate_when_constructed(build, message):
    with pytest.raises(nx.ConfigError, match=message):
        build()


def test_epochs_and_every_pick_by_epoch(tmp_path):
    ckpt = bound(tmp_path, keep=(Epochs(range(2, 9, 3)), Every(4)))
    written = {e: write(ckpt, e, SCORES[e]) for e in range(1, 10)}
    assert [e for e, w in written.items() if w] == [2, 4, 5, 8]
    assert sorted(e.epoch for e in read_manifest(str(tmp_path))) == [2, 4, 5, 8]
    assert Epochs([3, 1]).epochs == frozenset({1, 3})


def test_retention_keeps_the_union_and_never_writes_an_unadmitted_epoch(tmp_path):
    ckpt = bound(tmp_path, keep=(Best(2), Every(3), Epochs([1])))
    ever_seen = set()
    results = {}
    for epoch in range(1, 10):
        results[epoch] = write(ckpt, epoch, SCORES[epoch])
        ever_seen |= set(record_files(tmp_path))
        assert record_files(tmp_path) == manifest_files(tmp_path)
    # 2 and 4 were best when written; 7 was neither best, a multiple of 3, nor 1.
    assert [e for e, w in results.items() if not w] == [5, 7]
    assert not [f for f in ever_seen if f.startswith(("epoch-0005", "epoch-0007"))]
    kept = sorted(e.epoch for e in read_manifest(str(tmp_path)))
    assert kept == [1, 3, 4, 6, 8, 9]  # best 2 = {8, 4}; every 3 = {3, 6, 9}; {1}


def test_last_is_a_rolling_window_and_best_ties_go_to_the_earlier_epoch(tmp_path):
    ckpt = bound(tmp_path, keep=(Best(1), Last(2)))
    for epoch in range(1, 6):
        assert write(ckpt, epoch, 0.5)
    assert sorted(e.epoch for e in read_manifest(str(tmp_path))) == [1, 4, 5]


def test_a_custom_selector_needs_only_select_and_admits_can_veto(tmp_path):
    class Odd:  # no Selector base: the protocol is select (and optionally admits)
        def select(self, entries, checkpointer):
            return [e for e in entries if e.epoch % 2 == 1]

    class Never(Selector):
        def select(self, entries, checkpointer):
            return list(entries)

        def admits(self, entries, candidate, checkpointer):
            return False

    ckpt = bound(tmp_path, keep=(Odd(),))
    assert [write(ckpt, e, 0.1) for e in (1, 2, 3)] == [True, False, True]
    never = bound(tmp_path / "never", keep=Never())
    assert not write(never, 1, 0.1)
    assert not os.path.exists(tmp_path / "never" / "manifest.json")
    with pytest.raises(NotImplementedError, match="must define select"):
        Selector().select([], ckpt)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"keep": ()}, r"keep=...\) takes selectors such as Best\(3\)"),
        ({"keep": "best"}, r"takes selectors .* got 'best'"),
        ({"keep": Best(2, among=Last(5))}, r"Best\(among=...\) is for loading"),
        ({"mode": "up", "metric": "acc"}, 'mode must be "min" or "max", got \'up\''),
        ({"metric": "acc"}, r"give both to rank by something other than the monitor"),
        ({"scope": "everything"}, "scope must be \"run\" .* got 'everything'"),
        ({"name": "file.safetensors"}, r"name=...\) takes a filename function"),
    ],
)
def test_checkpointer_refuses_bad_configuration(kwargs, message):
    with pytest.raises(nx.ConfigError, match=message):
        Checkpointer(**kwargs)


def test_keep_with_only_best_is_refused_for_a_training_run_with_no_val_split():
    with pytest.raises(nx.ConfigError, match="keeps only Best checkpoints, but"):
        check_keep(Checkpointer(keep=Best(3)), trains=True, has_val=False)
    check_keep(Checkpointer(keep=Best(3)), trains=False, has_val=False)
    check_keep(Checkpointer(keep=(Best(3), Every(5))), trains=True, has_val=False)
    check_keep(Checkpointer(keep=Best(3)), trains=True, has_val=True)


def test_setup_warns_a_training_handle_whose_keep_has_no_last(tmp_path):
    ckpt = bound(tmp_path, keep=(Best(3), Every(5)))
    text = missing_last_warning(ckpt, trains=True)
    assert "has no Last: an epoch no selector keeps is not written, so a crash" in text
    assert missing_last_warning(ckpt, trains=False) is None
    assert missing_last_warning(bound(tmp_path), trains=True) is None
    assert setup_warnings(ckpt, [], trains=True) == [text]
    assert setup_warnings(ckpt, [], trains=False) == []


def test_a_custom_filename_function_names_the_records(tmp_path):
    ckpt = bound(tmp_path, keep=Last(1), name=lambda *, epoch, **kw: f"e{epoch}")
    write(ckpt, 1, 0.5)
    assert record_files(tmp_path) == ["e1.safetensors"]
    # A bad name is found when setup binds the checkpointer, not after an epoch.
    with pytest.raises(nx.ConfigError, match="returned '../escape'; it must return"):
        bound(tmp_path, keep=Last(1), name=lambda **kw: "../escape")
    with pytest.raises(nx.ConfigError, match=r"name function failed on sample values"):
        bound(tmp_path, keep=Last(1), name=lambda *, epoch: f"e{epoch}")


def test_a_bound_filename_hook_names_records_unless_name_was_given(tmp_path):
    calls = []

    def hook(**names):
        calls.append(names)
        return f"hook-{names['epoch']}"

    ckpt = Checkpointer(keep=Last(2))
    ckpt.bind(
        directory=str(tmp_path), monitor=None, run="r1", parent=None, filename=hook
    )
    write(ckpt, 1, None)
    assert record_files(tmp_path) == ["hook-1.safetensors"]
    assert calls[-1] == {"epoch": 1, "step": 4, "metric": None, "score": None}
    assert ckpt.name is None  # the bound hook does not become the user's name
    named = Checkpointer(keep=Last(1), name=lambda *, epoch, **kw: f"mine{epoch}")
    named.bind(
        directory=str(tmp_path / "b"), monitor=None, run="r", parent=None, filename=hook
    )
    write(named, 2, None)
    assert record_files(tmp_path / "b") == ["mine2.safetensors"]


# ------------------------------------------------------------- TopKCheckpointer -----
def test_topk_checkpointer_builds_the_equivalent_checkpointer_and_warns_once(
    monkeypatch,
):
    monkeypatch.setattr(topk_module, "_TOPK_WARNED", False)
    with pytest.warns(DeprecationWarning, match=r"Checkpointer\(keep=\(Best\(5\)"):
        ckpt = TopKCheckpointer(k=5, metric="acc", mode="max")
    assert ckpt.keep == (Best(5), Last(1))
    assert (ckpt.metric, ckpt.mode, ckpt.scope) == ("acc", "max", "run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        no_latest = TopKCheckpointer(k=2, keep_latest=False)  # second: silent
    assert no_latest.keep == (Best(2),)
    with pytest.warns(DeprecationWarning, match="Checkpointer.k is deprecated"):
        assert ckpt.k == 5
    with pytest.warns(DeprecationWarning, match="keep_latest is deprecated"):
        assert no_latest.keep_latest is False
    with pytest.warns(DeprecationWarning):
        assert Checkpointer(keep=Last(3)).k == 0


# ------------------------------------------------------------------- scopes -----
def test_scope_run_never_touches_another_runs_files(tmp_path):
    first = bound(tmp_path, run="aaa", keep=(Best(1), Last(1)))
    for epoch in (1, 2, 3):
        write(first, epoch, SCORES[epoch])
    before = {f: (tmp_path / f).read_bytes() for f in record_files(tmp_path)}
    second = bound(tmp_path, run="bbb", keep=(Best(1), Last(1)))
    for epoch in (1, 2, 3, 4):
        write(second, epoch, 0.01 * epoch)  # better than anything the first scored
    for name, data in before.items():
        assert (tmp_path / name).read_bytes() == data
    entries = read_manifest(str(tmp_path))
    assert sorted((e.run, e.epoch) for e in entries) == [
        ("aaa", 2),
        ("aaa", 3),
        ("bbb", 1),
        ("bbb", 4),
    ]
    assert scope_deletion_warning(second, entries, trains=True) is None


def test_scope_dir_ranks_the_directory_and_deletes_other_runs_losers(tmp_path):
    first = bound(tmp_path, run="aaa", keep=(Best(3), Last(1)))
    for epoch in (1, 2, 3):
        write(first, epoch, SCORES[epoch])  # 0.9, 0.5, 0.7: all three kept
    entries = read_manifest(str(tmp_path))
    second = bound(tmp_path, run="bbb", keep=(Best(2), Last(1)), scope="dir")
    text = scope_deletion_warning(second, entries, trains=True)
    assert 'scope="dir") ranks every run' in text
    assert "any of the 3 checkpoints of run(s) aaa scored under loss/min" in text
    assert scope_deletion_warning(second, entries, trains=False) is None
    write(second, 1, 0.6)  # the best 2 of the directory: aaa/2 (0.5), bbb/1 (0.6)
    assert sorted((e.run, e.epoch) for e in read_manifest(str(tmp_path))) == [
        ("aaa", 2),
        ("bbb", 1),
    ]
    write(second, 2, 0.65)  # bbb's Last keeps it; aaa/2 and bbb/1 stay best
    assert len(read_manifest(str(tmp_path))) == 3
    write(second, 3, 0.1)
    kept = sorted((e.run, e.epoch) for e in read_manifest(str(tmp_path)))
    assert kept == [("aaa", 2), ("bbb", 3)]
    assert record_files(tmp_path) == manifest_files(tmp_path)


def test_last_under_scope_dir_orders_by_write_time(tmp_path):
    ckpt = bound(tmp_path, run="r", keep=Last(2), scope="dir")
    for epoch in (5, 6, 2):  # a branch that retrained from epoch 1, say
        write(ckpt, epoch, None)
    assert sorted(e.epoch for e in read_manifest(str(tmp_path))) == [2, 6]


def test_entries_under_another_metric_are_never_ranked_or_deleted(tmp_path):
    acc = bound(tmp_path, run="aaa", keep=(Best(1), Last(1)), metric="acc", mode="max")
    for epoch in (1, 2, 3):
        write(acc, epoch, 0.1 * epoch)
    kept_acc = manifest_files(tmp_path)
    # The same run resumed under another selection, and a scope="dir" run.
    same_run = bound(tmp_path, run="aaa", keep=(Best(1), Last(1)))
    dir_run = bound(tmp_path, run="bbb", keep=(Best(1), Last(1)), scope="dir")
    for epoch in (4, 5, 6):
        write(same_run, epoch, 1.0 / epoch)
        write(dir_run, epoch, 2.0 / epoch)
    files = manifest_files(tmp_path)
    assert set(kept_acc) <= set(files)
    by_pair = {(e.run, e.metric, e.epoch) for e in read_manifest(str(tmp_path))}
    assert by_pair == {
        ("aaa", "acc", 3),
        ("aaa", "loss", 6),
        ("bbb", "loss", 6),
    }
    entries = read_manifest(str(tmp_path))
    texts = setup_warnings(same_run, entries, trains=True)
    assert any(
        "1 checkpoint(s) were scored under another metric or mode (acc/max: 1); they "
        "are kept, but only those under loss/min are ranked" in t
        for t in texts
    )


# ----------------------------------------------------------------- filenames -----
def test_a_filename_another_run_owns_gets_the_run_id(tmp_path):
    first = bound(tmp_path, run="aaa", keep=Last(1))
    write(first, 1, 0.5)
    theirs = tmp_path / checkpoint_filename(epoch=1, step=4, metric="loss", score=0.5)
    before = theirs.read_bytes()
    second = bound(tmp_path, run="bbb", keep=Last(1))
    write(second, 1, 0.5, value=7.0)
    assert theirs.read_bytes() == before
    mine = [e for e in read_manifest(str(tmp_path)) if e.run == "bbb"][0]
    assert mine.file == "epoch-0001-step-4-loss=0.5-run-bbb.safetensors"
    # A file no manifest lists, written by someone else, is not overwritten either.
    stray = tmp_path / checkpoint_filename(epoch=2, step=8, metric="loss", score=0.5)
    stray.write_bytes(b"not mine")
    write(second, 2, 0.5)
    assert stray.read_bytes() == b"not mine"
    assert "epoch-0002-step-8-loss=0.5-run-bbb.safetensors" in record_files(tmp_path)


@pytest.mark.parametrize(
    "fields",
    # The second: a record of a run that started from averaged weights.
    [{"run": "aaa"}, {"run": "aaa", "averaged_from": {"epochs": [1, 2]}}],
)
def test_a_record_this_run_left_unlisted_by_a_crash_is_overwritten_in_place(
    tmp_path, fields
):
    ckpt = bound(tmp_path, run="aaa", keep=Last(1))
    write_manifest(str(tmp_path), [])  # what a kill after the rename leaves beside it
    orphan = tmp_path / checkpoint_filename(epoch=1, step=4, metric="loss", score=0.5)
    save_record(str(orphan), {"params": {"w": np.zeros(2)}}, record_header(**fields))
    write(ckpt, 1, 0.5)
    assert manifest_files(tmp_path) == [orphan.name]
    assert CheckpointRecord(str(orphan)).arrays["params/['w']"].shape == (2, 3)


# ---------------------------------------------------------- stop_reason rewrite -----
def test_finalize_rewrites_the_last_kept_record_and_its_entry(tmp_path):
    ckpt = bound(tmp_path, keep=(Best(1), Last(1)))
    write(ckpt, 1, 0.5)
    write(ckpt, 2, 0.6)
    last = tmp_path / [e for e in read_manifest(str(tmp_path)) if e.epoch == 2][0].file
    arrays_before = CheckpointRecord(str(last)).arrays
    assert ckpt.finalize("error") is True
    assert checkpoint_info(last)["stop_reason"] == "error"
    entry = [e for e in read_manifest(str(tmp_path)) if e.epoch == 2][0]
    assert entry.stop_reason == "error"
    after = CheckpointRecord(str(last))
    for key, value in arrays_before.items():
        np.testing.assert_array_equal(after.arrays[key], value)
    assert after.meta["epoch"] == 2 and after.meta["run"] == "r1"
    assert ckpt.finalize("error") is False  # once per train()
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]


@pytest.fixture(params=[0o022, 0o027, 0o002])
def umask(request):
    """The process umask set to each value for the test, restored after."""
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def test_records_and_the_manifest_get_the_process_umask(tmp_path, umask):
    """Not mkstemp's -rw-------: a team shares a run directory."""
    ckpt = bound(tmp_path, keep=(Last(1),))
    write(ckpt, 1, 0.5)
    write(ckpt, 2, 0.6)  # a rotation rewrites the manifest
    assert ckpt.finalize("error") is True  # rewrites the last record in place
    expected = 0o666 & ~umask
    files = [*record_files(tmp_path), MANIFEST]
    modes = {f: oct(os.stat(tmp_path / f).st_mode & 0o777) for f in files}
    assert modes == dict.fromkeys(files, oct(expected))


def test_a_record_as_save_leaves_it_gets_the_process_umask(tmp_path, umask):
    """One save and nothing after it (no rotation, no finalize rewriting the file
    in place): safetensors' save_file replaces its file with a -rw------- one."""
    ckpt = bound(tmp_path, keep=(Last(1),))
    assert write(ckpt, 1, 0.5)
    [record] = record_files(tmp_path)
    expected = oct(0o666 & ~umask)
    assert oct(os.stat(tmp_path / record).st_mode & 0o777) == expected
    assert oct(os.stat(tmp_path / MANIFEST).st_mode & 0o777) == expected


def test_finalize_rewrites_nothing_when_no_selector_kept_the_last_epoch(tmp_path):
    ckpt = bound(tmp_path, keep=Best(1))
    write(ckpt, 1, 0.5)
    assert not write(ckpt, 2, 0.6)
    assert ckpt.finalize("completed") is False
    assert [e.stop_reason for e in read_manifest(str(tmp_path))] == [None]
    assert (
        checkpoint_info(tmp_path / manifest_files(tmp_path)[0])["stop_reason"] is None
    )


def test_finalize_keeps_a_reason_already_recorded_and_refuses_unknown_ones(tmp_path):
    ckpt = bound(tmp_path, keep=Last(1))
    write(ckpt, 1, 0.5, stop_reason="early_stop")
    record = tmp_path / manifest_files(tmp_path)[0]
    manifest = tmp_path / MANIFEST

    def snapshot(path):
        info = path.stat()
        return path.read_bytes(), info.st_mtime_ns, info.st_ino

    before = {path: snapshot(path) for path in (record, manifest)}
    assert ckpt.finalize("early_stop") is True
    # The reason is already there: neither file is rewritten (not even in place).
    assert {path: snapshot(path) for path in (record, manifest)} == before
    assert checkpoint_info(record)["stop_reason"] == "early_stop"
    with pytest.raises(nx.ConfigError, match="stop_reason='crashed'.*completed"):
        ckpt.finalize("crashed")


# ------------------------------------------------------------------ recovery -----
def test_recover_finishes_an_interrupted_rotation_and_removes_own_temporaries(
    tmp_path,
):
    ckpt = bound(tmp_path, run="aaa", keep=Last(1))
    write(ckpt, 1, 0.5)
    dropped = tmp_path / "epoch-0000-step-0.safetensors"
    # A record a rotation dropped, left behind by a kill before it was deleted.
    dropped.write_bytes((tmp_path / record_files(tmp_path)[0]).read_bytes())

    write_manifest(str(tmp_path), read_manifest(str(tmp_path)), [dropped.name])
    (tmp_path / ".tmp-aaa-x1").write_bytes(b"partial")
    (tmp_path / ".tmp-zzz-x2").write_bytes(b"another run's")
    resumed = bound(tmp_path, run="aaa", keep=Last(1))
    write(resumed, 2, 0.4)
    assert not dropped.exists() and not (tmp_path / ".tmp-aaa-x1").exists()
    assert (tmp_path / ".tmp-zzz-x2").exists()
    assert load_manifest(str(tmp_path)).pending_deletion == [
        checkpoint_filename(epoch=1, step=4, metric="loss", score=0.5)
    ]
    assert record_files(tmp_path) == manifest_files(tmp_path)


def test_a_checkpointer_without_a_directory_says_so():
    with pytest.raises(nx.CheckpointError, match="has no directory yet"):
        Checkpointer().entries()


def test_bind_fills_what_was_left_to_setup_every_time(tmp_path):
    following = Checkpointer()
    following.bind(directory="a", monitor=("acc", "max"), run="r1", parent=None)
    following.bind(directory="b", monitor=None, run=None, parent="p")
    assert (following.dir, following.metric, following.mode) == ("b", None, None)
    assert (following.run, following.parent) == (None, "p")
    fixed = Checkpointer(metric="loss", mode="min", dir=tmp_path)
    fixed.bind(directory="b", monitor=("acc", "max"), run="r2", parent=None)
    assert (fixed.dir, fixed.metric, fixed.mode) == (str(tmp_path), "loss", "min")


def test_the_score_must_be_a_real_value_of_the_metric_ranked_by(tmp_path):
    # A NaN or inf is kept unscored instead (see the non-finite tests below).
    ckpt = bound(tmp_path, keep=Last(1))
    save = dict(step=1, trees={"params": {"w": np.zeros(1)}}, header=record_header())
    with pytest.raises(nx.CheckpointError, match="ranks by `loss`, but validation"):
        ckpt.save(epoch=1, metrics={"acc": 0.5}, **save)
    with pytest.raises(nx.CheckpointError, match="`loss` is 'x', not a real number"):
        ckpt.save(epoch=1, metrics={"loss": "x"}, **save)


def test_a_filename_with_no_free_variant_is_refused(tmp_path, monkeypatch):
    ckpt = bound(tmp_path, keep=Last(1))
    monkeypatch.setattr(checkpointer_module.os.path, "exists", lambda path: True)
    with pytest.raises(nx.CheckpointError, match="Cannot find a free checkpoint file"):
        write(ckpt, 1, 0.5)


def test_load_checkpoint_reads_a_record_through_its_checkpointer(tmp_path):
    ckpt = bound(tmp_path, keep=Last(1))
    write(ckpt, 3, 0.25, value=7.0)
    (name,) = record_files(tmp_path)
    record = nx.load_checkpoint(ckpt, tmp_path / name)
    assert isinstance(record, CheckpointRecord)
    assert (record.header.epoch, record.header.step) == (3, 12)
    np.testing.assert_array_equal(record.arrays["device/['scale']"], np.float32(7.0))
    assert nx.load_checkpoint(None, tmp_path / name) is None

    class Elsewhere:  # a checkpointer with another storage backend
        def load(self, path):
            return ("loaded", path)

    assert nx.load_checkpoint(Elsewhere(), "key") == ("loaded", "key")
    with pytest.raises(nx.ConfigError, match="str has no load\\(path\\) method"):
        nx.load_checkpoint("runs", tmp_path / name)
    (tmp_path / "junk.safetensors").write_bytes(b"not a record")
    with pytest.raises(nx.CheckpointError, match="junk.safetensors"):
        nx.load_checkpoint(ckpt, tmp_path / "junk.safetensors")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), np.float32("nan")])
def test_a_non_finite_score_is_kept_unscored_and_never_ranked(tmp_path, bad):
    # Best(1) under "min": a NaN or inf never beats 0.5 nor evicts it; Last keeps
    # the unscored epoch as the latest, with no score and no metric recorded.
    ckpt = bound(tmp_path, keep=(Best(1), Last(1)))
    assert write(ckpt, 1, 0.5)
    assert write(ckpt, 2, bad)
    entries = {e.epoch: e for e in read_manifest(str(tmp_path))}
    assert sorted(entries) == [1, 2]
    assert entries[1].score == 0.5
    assert entries[2].score is None and entries[2].metric is None
    assert write(ckpt, 3, 0.7)
    assert sorted(e.epoch for e in read_manifest(str(tmp_path))) == [1, 3]


def test_an_epoch_with_non_finite_outputs_is_kept_unscored_and_never_ranked(tmp_path):
    # A finite score whose pass had NaN outputs (accuracy over NaN logits) ranks
    # nothing, though it beats the best: Best keeps epoch 1, Last the unscored 2.
    ckpt = bound(tmp_path, keep=(Best(1), Last(1)))
    assert write(ckpt, 1, 0.5, extra={"nonfinite_outputs": 0})
    assert write(ckpt, 2, 0.1, extra={"nonfinite_outputs": 72})
    entries = {e.epoch: e for e in read_manifest(str(tmp_path))}
    assert sorted(entries) == [1, 2]
    assert entries[1].score == 0.5
    assert entries[2].score is None and entries[2].metric is None
    assert write(ckpt, 3, 0.7)
    assert sorted(e.epoch for e in read_manifest(str(tmp_path))) == [1, 3]
    only_best = bound(tmp_path / "best", keep=Best(2))
    assert not write(only_best, 1, 0.1, extra={"nonfinite_outputs": 1})


def test_only_best_never_writes_a_non_finite_epoch(tmp_path):
    ckpt = bound(tmp_path, keep=Best(2))
    assert write(ckpt, 1, 0.5)
    assert not write(ckpt, 2, float("nan"))
    assert [e.epoch for e in read_manifest(str(tmp_path))] == [1]
