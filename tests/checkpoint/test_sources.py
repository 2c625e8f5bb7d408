"""Checkpoint sources (paths, (run, which), "all", "legacy", Nitro handles, Average),
average_checkpoints, runs() and the lookups, read from the manifest."""

import logging
import os

import jax.numpy as jnp
import numpy as np
import pytest
from checkpoint_fixtures import (
    bound,
    manifest_files,
    params_at,
    record_header,
    write,
    write_legacy_manifest,
)
from experiments import Tiny

import jaxnitro as nx
from jaxnitro.checkpoint.averaging import (
    Average,
    check_keep_holds,
    expected_count,
    keep_holds,
    short_average_message,
)
from jaxnitro.checkpoint.checkpointer import Checkpointer
from jaxnitro.checkpoint.info import checkpoint_info
from jaxnitro.checkpoint.lookup import find_latest, selected_checkpoint
from jaxnitro.checkpoint.manifest import read_manifest
from jaxnitro.checkpoint.record import CheckpointRecord, save_record
from jaxnitro.checkpoint.run_listing import checkpoint_run, runs
from jaxnitro.checkpoint.selectors import Best, Epochs, Every, Last
from jaxnitro.checkpoint.source_checks import check_source
from jaxnitro.checkpoint.sources import (
    AverageSource,
    HandleSource,
    ResolvedSource,
    resolve_source,
    resolve_weights_source,
    resume_source,
)
from jaxnitro.checkpoint.sources import (
    average_checkpoints as average_checkpoints,
)


@pytest.fixture
def two_runs(tmp_path, monkeypatch):
    """Run "old" (epochs 1-4) then run "new" (epochs 1-3), plus their clocks."""
    clock = iter(range(1000, 2000))
    monkeypatch.setattr("time.time", lambda: float(next(clock)))
    old = bound(tmp_path, run="old", keep=(Best(2), Last(3)))
    for epoch, score in zip((1, 2, 3, 4), (0.5, 0.2, 0.4, 0.45), strict=True):
        write(old, epoch, score)
    new = bound(tmp_path, run="new", keep=(Best(2), Last(3)))
    for epoch, score in zip((1, 2, 3), (0.3, 0.35, 0.33), strict=True):
        write(new, epoch, score)
    return tmp_path


def resolved_epoch(source, run_dir, ckpt=None, what="weights"):
    found = resolve_source(source, str(run_dir), ckpt, what)
    return found.entry.run, found.entry.epoch


# -------------------------------------------------------------- (run, which) -----
def test_run_and_which_resolve_through_the_manifest(two_runs):
    assert resolved_epoch(("latest", "latest"), two_runs) == ("new", 3)
    assert resolved_epoch(("latest", "best"), two_runs) == ("new", 1)
    assert resolved_epoch(("old", "best"), two_runs) == ("old", 2)
    assert resolved_epoch(("old", Last(1)), two_runs) == ("old", 4)
    assert resolved_epoch(("old", Best(1)), two_runs) == ("old", 2)
    assert resolved_epoch(("all", "best"), two_runs) == ("old", 2)
    found = resolve_source(("old", "latest"), str(two_runs), None, "resume")
    assert found.is_run_newest and found.load().meta["epoch"] == 4
    assert not resolve_source(("all", "best"), str(two_runs), None, "w").is_run_newest


def test_best_ranks_by_the_checkpointers_current_metric(two_runs):
    acc = bound(two_runs, run="acc", keep=Last(3), metric="acc", mode="max")
    for epoch, score in zip((1, 2, 3), (0.6, 0.9, 0.8), strict=True):
        write(acc, epoch, score)
    by_acc = Checkpointer(metric="acc", mode="max")
    with pytest.warns(nx.NitroWarning, match="6 checkpoint\\(s\\) were scored"):
        assert resolved_epoch(("all", "best"), two_runs, by_acc) == ("acc", 2)
    found = resolve_source(
        ("acc", "best"), str(two_runs), None, "weights", monitor=("acc", "max")
    )
    assert found.entry.epoch == 2
    assert resolved_epoch(("acc", "best"), two_runs) == ("acc", 2)  # its own pair


def test_legacy_entries_are_the_unnamed_run(tmp_path):
    ckpt = Checkpointer(keep=Last(5), dir=str(tmp_path))  # no setup: run None
    for epoch in (1, 2):
        write(ckpt, epoch, None)
    entries = read_manifest(str(tmp_path))
    assert {e.run for e in entries} == {None}
    assert resolved_epoch(("legacy", "latest"), tmp_path) == (None, 2)
    assert resolved_epoch(("latest", "latest"), tmp_path) == (None, 2)
    assert find_latest(None, str(tmp_path), run=None).endswith(
        "epoch-0002-step-8.safetensors"
    )


def test_a_manifest_from_before_runs_were_recorded_reads_as_legacy(tmp_path):
    save_record(
        str(tmp_path / "a.safetensors"), {"params": params_at(1.0)}, record_header()
    )
    write_legacy_manifest(
        tmp_path, [{"file": "a.safetensors", "epoch": 3, "score": 0.25}]
    )
    (entry,) = read_manifest(str(tmp_path))
    assert (entry.run, entry.metric, entry.written, entry.step) == (None, None, 0.0, 0)
    assert resolved_epoch(("legacy", "best"), tmp_path) == (None, 3)
    assert runs(str(tmp_path))[0].id == "legacy"


@pytest.mark.parametrize(
    "source, error, message",
    [
        ("best", nx.ConfigError, 'use a pair such as weights=\\("latest", "best"\\)'),
        ("latest", nx.ConfigError, 'weights=\\("latest", "latest"\\)'),
        ("current", nx.ConfigError, 'weights="current" needs a handle'),
        (("all", "latest"), nx.ConfigError, 'is \\("latest", "latest"\\)'),
        (("latest", "current"), nx.ConfigError, "the run must be a Nitro"),
        (("latest", "middle"), nx.ConfigError, 'which is "best", "latest", "current"'),
        ((3, "best"), nx.ConfigError, 'the run is "latest", "all", "legacy", a run id'),
        (("latest", Last(3)), nx.ConfigError, "takes it only inside Average"),
        (Average(Last(3)), nx.ConfigError, "names no run: write a pair such as"),
        (Last(3), nx.ConfigError, "names no run"),
        (("all", Average(Last(2))), nx.ConfigError, "averaging across runs is refused"),
        ([1, 2], nx.ConfigError, "takes a checkpoint path or a \\(run, which\\) pair"),
    ],
)
def test_sources_of_the_wrong_shape_are_refused(source, error, message):
    with pytest.raises(error, match=message):
        check_source(source, "weights")


def test_resume_refuses_an_average_and_restore_optimizer_refuses_one_too():
    with pytest.raises(nx.ConfigError, match="resume=.*an average has no optimizer"):
        check_source(("latest", Average(Last(3))), "resume")
    with pytest.raises(nx.ConfigError, match="restore_optimizer=True with weights="):
        check_source(("latest", Average(Last(3))), "weights", restore_optimizer=True)
    check_source("auto", "resume")
    check_source(False, "resume")


def test_sources_that_cannot_be_found_name_the_directory_and_its_runs(two_runs):
    with pytest.raises(
        nx.CheckpointError,
        match="holds no run 'zzz'. Its runs: new \\(3 checkpoints\\), old "
        "\\(3 checkpoints\\). See jaxnitro.runs",
    ):
        resolve_source(("zzz", "best"), str(two_runs), None, "weights")
    with pytest.raises(
        nx.CheckpointError,
        match='The first element is a run id \\(or "latest"\\) in this handle\'s '
        "run_dir",
    ):  # a directory where the run id goes
        resolve_source((str(two_runs), "best"), str(two_runs), None, "weights")
    with pytest.raises(nx.CheckpointError, match="holds the runs: new \\(3 checkpo"):
        resolve_source("gone.safetensors", str(two_runs), None, "weights")
    os.remove(two_runs / read_manifest(str(two_runs))[-1].file)
    with pytest.raises(nx.CheckpointError, match="lists epoch-0003.*the file is gone"):
        resolve_source(("new", "latest"), str(two_runs), None, "weights")


def test_best_warns_about_mixed_metrics_and_raises_with_none_under_the_pair(tmp_path):
    acc = bound(tmp_path, run="r", keep=Last(3), metric="acc", mode="max")
    write(acc, 1, 0.7)
    loss = bound(tmp_path, run="r", keep=Last(3))
    write(loss, 2, 0.3)
    with pytest.warns(
        nx.NitroWarning,
        match="1 checkpoint\\(s\\) were scored under another metric or mode "
        "\\(acc/max: 1\\); they are kept, but only those under loss/min",
    ):
        found = resolve_source(("r", "best"), str(tmp_path), loss, "weights")
    assert found.entry.epoch == 2
    by_f1 = Checkpointer(metric="f1", mode="max")
    with (
        pytest.raises(
            nx.CheckpointError,
            match="run 'r' has no checkpoint scored under f1/max; it has acc/max, "
            "loss/min",
        ),
        pytest.warns(nx.NitroWarning),
    ):
        resolve_source(("r", "best"), str(tmp_path), by_f1, "weights")


def test_best_of_a_run_without_validation_says_so(tmp_path):
    write(bound(tmp_path, run="r", keep=Last(2), metric=None), 1, None)
    with pytest.raises(nx.CheckpointError, match="no scored checkpoint \\(it ran with"):
        resolve_source(("r", "best"), str(tmp_path), None, "weights")
    assert selected_checkpoint(Checkpointer(), str(tmp_path)) is None


def test_resume_sources(two_runs, caplog):
    with pytest.raises(nx.ConfigError, match="resume=True is ambiguous"):
        resume_source(True, str(two_runs), None)
    assert resume_source(False, str(two_runs), None) is None
    with caplog.at_level(logging.INFO, logger="jaxnitro"):
        found = resume_source("auto", str(two_runs), None)
    assert found.entry.epoch == 3 and found.entry.run == "new"
    assert 'resume="auto": continuing run new from epoch 3' in caplog.text
    with pytest.raises(nx.CheckpointError, match="holds no checkpoints \\(runs: none"):
        resume_source(("latest", "latest"), str(two_runs / "empty"), None)


def test_lookups_read_the_checkpointers_own_directory(two_runs, tmp_path_factory):
    elsewhere = str(tmp_path_factory.mktemp("elsewhere"))
    ckpt = Checkpointer(dir=str(two_runs))
    assert resolved_epoch(("old", "latest"), elsewhere, ckpt) == ("old", 4)
    assert find_latest(ckpt, elsewhere).endswith(
        "epoch-0003-step-12-loss=0.33.safetensors"
    )
    assert find_latest(ckpt, elsewhere, run="old").startswith(str(two_runs))
    assert find_latest(ckpt, elsewhere, run="nope") is None
    best = selected_checkpoint(ckpt, elsewhere, run="old")
    assert (best.epoch, best.score, best.metric, best.run) == (2, 0.2, "loss", "old")
    assert selected_checkpoint(None, elsewhere) is None
    following = Checkpointer()  # bound to two_runs by an earlier setup
    following.bind(directory=str(two_runs), monitor=None, run="x", parent=None)
    with pytest.raises(nx.CheckpointError, match="holds no checkpoints"):
        resolve_source(("latest", "latest"), elsewhere, following, "resume")


# -------------------------------------------------------------------- Nitro -----
def test_a_nitro_names_its_own_run_or_its_in_memory_state(tmp_path):
    nitro = nx.Nitro(Tiny(max_epochs=2), run_dir=str(tmp_path / "a"), logger=None)
    nitro.train()
    # Another run writes in the same directory later: (nitro, ...) still reads its own.
    later = bound(tmp_path / "a", run="later", keep=Last(1))
    write(later, 5, 0.01)
    found = resolve_weights_source((nitro, "latest"), str(tmp_path / "b"), None)
    assert isinstance(found, ResolvedSource) and found.entry.run == nitro.checkpoint_run
    assert found.entry.epoch == 2
    best = resolve_weights_source((nitro, Best(1)), str(tmp_path / "b"), None)
    assert best.entry.run == nitro.checkpoint_run
    assert resolve_weights_source(nitro, "x", None) == HandleSource(nitro)
    assert resolve_weights_source((nitro, "current"), "x", None) == HandleSource(nitro)
    assert checkpoint_run(nitro) == nitro.checkpoint_run
    with pytest.raises(nx.NotYetSupportedError, match="is not one checkpoint record"):
        resolve_source(nitro, "x", None, "weights")
    with pytest.raises(nx.NotYetSupportedError, match="continuation from memory"):
        check_source(nitro, "resume")
    with pytest.raises(nx.NotYetSupportedError, match="continuation from memory"):
        check_source((nitro, "current"), "resume")
    with pytest.raises(nx.ConfigError, match="restoring a live handle's optimizer"):
        check_source(nitro, "weights", restore_optimizer=True)
    quiet = nx.Nitro(
        Tiny(), run_dir=str(tmp_path / "c"), logger=None, checkpointer=None
    )
    with pytest.raises(nx.CheckpointError, match="that handle has no checkpointer"):
        resolve_weights_source((quiet, "best"), "x", None)


# ------------------------------------------------------------------- Average -----
@pytest.fixture
def averaged_run(tmp_path):
    ckpt = bound(tmp_path, run="r", keep=(Best(2), Last(4)))
    for epoch, score in zip(range(1, 6), (0.5, 0.1, 0.4, 0.2, 0.3), strict=True):
        write(ckpt, epoch, score, value=epoch * 1.5, state=epoch * 10)
    return tmp_path


def test_average_checkpoints_is_the_mean_of_the_records(averaged_run):
    record = average_checkpoints(str(averaged_run), ("r", Average(Last(3))))
    np.testing.assert_allclose(record.arrays["params/['w']"], np.full((2, 3), 6.0))
    assert record.arrays["params/['w']"].dtype == np.float32
    np.testing.assert_allclose(record.arrays["params/['b']"], np.full(3, -6.0))
    assert int(record.arrays["state/['count']"]) == 50  # the latest pick's state
    origin = record.meta["averaged_from"]
    assert origin["epochs"] == [3, 4, 5] and origin["run"] == "r"
    assert origin["weights"] == pytest.approx([1 / 3] * 3)
    assert origin["spec"] == "Average(selector=Last(n=3), weight='uniform', state=None)"
    assert not record.has_tree("opt_state")
    restored = record.restore("params", params_at(0.0), "parameter")
    np.testing.assert_allclose(np.asarray(restored["w"]), 6.0)


def test_an_average_of_a_ranking_selector_takes_state_from_the_best(averaged_run):
    best = average_checkpoints(str(averaged_run), ("r", Average(Best(2))))
    assert best.meta["averaged_from"]["epochs"] == [2, 4]
    assert int(best.arrays["state/['count']"]) == 20
    np.testing.assert_allclose(best.arrays["params/['w']"], 4.5)
    latest = average_checkpoints(
        str(averaged_run), ("r", Average(Best(2), state="latest"))
    )
    assert int(latest.arrays["state/['count']"]) == 40
    among = average_checkpoints(
        str(averaged_run), ("latest", Average(Best(2, among=Last(2))))
    )
    assert among.meta["averaged_from"]["epochs"] == [4, 5]


def test_average_checkpoints_saves_an_ordinary_record_outside_the_manifest(
    averaged_run,
):
    target = averaged_run / "avg.safetensors"
    before = read_manifest(str(averaged_run))
    written = average_checkpoints(
        str(averaged_run), ("r", Average(Last(2))), save=str(target)
    )
    assert written.path == str(target) and read_manifest(str(averaged_run)) == before
    info = checkpoint_info(target)
    assert info["averaged_from"]["files"] == [e.file for e in before][-2:]
    assert info["run"] is None and info["stop_reason"] is None
    np.testing.assert_allclose(
        CheckpointRecord(str(target)).arrays["params/['w']"], 6.75
    )
    with pytest.raises(nx.CheckpointError, match="the file exists; it refuses to"):
        average_checkpoints(str(averaged_run), ("r", Average(Last(2))), save=target)
    # The checkpointer keeps writing in the directory: the average is never touched.
    resumed = bound(averaged_run, run="r", keep=(Best(2), Last(4)))
    write(resumed, 6, 0.9)
    assert target.exists() and "avg.safetensors" not in manifest_files(averaged_run)


def test_average_resolves_to_an_average_source(averaged_run):
    found = resolve_weights_source(("r", Average(Every(2))), str(averaged_run), None)
    assert isinstance(found, AverageSource)
    assert [e.epoch for e in found.picks] == [2, 4] and found.state_entry.epoch == 4
    np.testing.assert_allclose(found.load().arrays["params/['w']"], 4.5)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Average(3), "takes a selector such as Last\\(10\\).*got 3"),
        (lambda: Average(Last(2), weight="ema"), '"uniform" is the only weighting'),
        (lambda: Average(Last(2), state="middle"), "state='middle'.*\"best\""),
    ],
)
def test_average_validates_when_constructed(build, message):
    with pytest.raises(nx.ConfigError, match=message):
        build()


def test_average_refuses_what_it_cannot_average(averaged_run, tmp_path_factory):
    with pytest.raises(nx.CheckpointError, match="the selector picks no checkpoint"):
        average_checkpoints(str(averaged_run), ("r", Average(Epochs([9]))))
    with pytest.raises(nx.ConfigError, match="takes a \\(run, Average\\(selector"):
        average_checkpoints(str(averaged_run), ("r", "best"))
    entries = read_manifest(str(averaged_run))
    os.remove(averaged_run / entries[-1].file)
    with pytest.raises(nx.CheckpointError, match="no longer holds epoch-0005"):
        average_checkpoints(str(averaged_run), ("r", Average(Last(2))))
    # Two records of different models.
    other = tmp_path_factory.mktemp("mixed")
    ckpt = bound(other, run="m", keep=Last(2))
    write(ckpt, 1, 0.5)
    ckpt.save(
        epoch=2,
        step=8,
        metrics={"loss": 0.4},
        trees={"params": params_at(1.0, width=4)},
        header=record_header(epoch=2, step=8),
    )
    with pytest.raises(
        nx.CheckpointError,
        match="parameter trees differ: params/\\['b'\\] is float32\\[3\\] in the "
        "first but float32\\[4\\] in the second",
    ):
        average_checkpoints(str(other), ("m", Average(Last(2))))
    unscored = tmp_path_factory.mktemp("unscored")
    write(bound(unscored, run="u", keep=Last(2), metric=None), 1, None)
    with pytest.raises(nx.CheckpointError, match="no scored checkpoint to rank"):
        average_checkpoints(str(unscored), ("u", Average(Best(2))))
    with pytest.raises(nx.CheckpointError, match='state="best" needs a scored'):
        average_checkpoints(str(unscored), ("u", Average(Last(1), state="best")))


def test_average_refuses_a_differing_integer_leaf(tmp_path):
    ckpt = bound(tmp_path, run="r", keep=Last(2))
    for epoch in (1, 2):
        ckpt.save(
            epoch=epoch,
            step=epoch,
            metrics={"loss": 1.0},
            trees={"params": {"w": np.ones(2, np.float32), "n": np.array(epoch)}},
            header=record_header(epoch=epoch, step=epoch),
        )
    with pytest.raises(nx.CheckpointError, match="Cannot average params/\\['n'\\]"):
        average_checkpoints(str(tmp_path), ("r", Average(Last(2))))


def test_an_average_refuses_a_run_holding_fewer_checkpoints_than_it_names(tmp_path):
    ckpt = bound(tmp_path, run="r", keep=Last(1))
    for epoch in range(1, 5):
        write(ckpt, epoch, 0.5)
    with pytest.raises(
        nx.CheckpointError,
        match=r"Last\(n=3\) names 3 checkpoints, but run 'r' in .* holds 1 of them "
        r"\(epochs \[4\]; the run holds epochs \[4\]\).*keep them while training "
        r"with Checkpointer\(keep=\(Best\(3\), Last\(n=3\)\)\), or average fewer",
    ):
        average_checkpoints(str(tmp_path), ("r", Average(Last(3))))
    with pytest.raises(nx.CheckpointError, match=r"Best\(3\), Last\(n=2\)\)\)"):
        average_checkpoints(str(tmp_path), ("r", Average(Best(2, among=Last(2)))))
    # restore_best takes the short pick and warns itself (short_average_message).
    short = resolve_weights_source(
        ("r", Average(Last(3))), str(tmp_path), None, allow_short=True
    )
    assert isinstance(short, AverageSource) and len(short.picks) == 1


def test_an_average_keeps_bfloat16_leaves_bfloat16(tmp_path):
    bf16 = jnp.bfloat16
    ckpt = bound(tmp_path, run="r", keep=Last(3))
    for epoch, value in zip((1, 2, 3), (1.0, 2.0, 4.0), strict=True):
        ckpt.save(
            epoch=epoch,
            step=epoch,
            metrics={"loss": 1.0},
            trees={"params": {"w": np.full((2, 3), value, bf16)}},
            header=record_header(epoch=epoch, step=epoch),
        )
    record = average_checkpoints(str(tmp_path), ("r", Average(Last(3))))
    averaged = record.arrays["params/['w']"]
    assert averaged.dtype == bf16
    np.testing.assert_array_equal(averaged, np.full((2, 3), 7 / 3).astype(bf16))


def test_restore_best_average_needs_a_keep_that_holds_it():
    keep = (Best(3), Last(10), Every(5))
    assert keep_holds(keep, Last(10)) and not keep_holds(keep, Last(11))
    assert keep_holds(keep, Best(3)) and not keep_holds(keep, Best(4))
    assert keep_holds(keep, Best(5, among=Last(8)))
    assert keep_holds(keep, Every(10)) and not keep_holds(keep, Every(3))
    assert keep_holds(keep, Epochs([5, 15])) and not keep_holds(keep, Epochs([4]))
    assert keep_holds(keep, object()) is None
    check_keep_holds(Checkpointer(keep=keep), Average(Last(10)), "restore_best")
    with pytest.raises(nx.ConfigError, match="averages checkpoints this run's"):
        check_keep_holds(Checkpointer(), Average(Last(10)), "restore_best")
    assert expected_count(Best(5, among=Last(3))) == 3
    assert expected_count(Every(2)) is None
    text = short_average_message(Average(Last(10)), 4, "restore_best")
    assert "wants 10 checkpoints but the run holds 4" in text
    assert short_average_message(Average(Last(10)), 10, "restore_best") is None


# --------------------------------------------------------------------- runs -----
def test_runs_lists_the_most_recent_first_and_legacy_last(two_runs):
    legacy = Checkpointer(keep=Last(2), dir=str(two_runs))  # run None, written later
    write(legacy, 1, None)
    summaries = runs(str(two_runs))
    assert [s.id for s in summaries] == ["new", "old", "legacy"]
    new, old = summaries[0], summaries[1]
    assert (new.checkpoints, new.epochs, new.best) == (3, (1, 2, 3), 0.3)
    assert (new.metric, new.mode, new.metrics) == (
        "loss",
        "min",
        ((("loss", "min"), 3),),
    )
    assert old.epochs == (2, 3, 4) and old.best == 0.2 and old.parent is None
    assert new.written > old.written
    assert runs(str(two_runs / "nothing")) == []
