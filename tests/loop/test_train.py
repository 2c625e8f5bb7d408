"""The automatic loop: accumulation, the split checks, divergence, stopping, buffers."""

import gc
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from experiments import QuietLogger, StopsAtStep, Tiny, make_batches

import jaxnitro as nx
import jaxnitro.loop.feed as feed


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_trains():
    nitro = nx.train(Tiny(max_epochs=12), **quiet())
    losses = [row["loss"] for row in nitro.history]
    assert losses[-1] < 0.75 * losses[0]
    assert [row["epoch"] for row in nitro.history] == list(range(1, 13))
    assert nitro.current_step == 48 and nitro.current_epoch == 12
    assert nitro.stop_reason == "completed" and isinstance(nitro.phase, nx.Done)


def test_accum_counts_optimizer_steps_and_matches_one_big_batch():
    class Halves(Tiny):
        def build_data(self, dist):
            return {"train": make_batches(32, 8)}

    class Whole(Tiny):
        def build_data(self, dist):
            return {"train": make_batches(32, 16)}

    halves = nx.Nitro(Halves(max_epochs=1), accum=2, **quiet())
    halves.train()
    whole = nx.Nitro(Whole(max_epochs=1), **quiet())
    whole.train()
    assert halves.current_step == whole.current_step == 2
    for a, b in zip(
        jax.tree.leaves(halves.parameters),
        jax.tree.leaves(whole.parameters),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_batch_count_must_divide_by_accum():
    with pytest.raises(nx.ConfigError) as info:
        nx.Nitro(Tiny(), accum=3, **quiet())
    assert (
        "The train split has 4 batches, which does not divide by accum=3 (4 % 3 = 1)"
        in str(info.value)
    )


def test_a_partial_last_train_batch_is_refused_at_setup():
    class Partial(Tiny):
        def build_data(self, dist):
            return {"train": make_batches(40, 16)}

    with pytest.raises(
        nx.ConfigError,
        match=r"keeps a partial last batch \(8 samples, the others 16\).*"
        r"nx\.ArraySource\(\.\.\., drop_last=True\)",
    ):
        nx.Nitro(Partial(), **quiet())


def test_a_partial_batch_of_a_sequential_source_is_refused_when_met():
    class Sequential:
        def __init__(self, batches):
            self.batches = batches

        def __len__(self):
            return len(self.batches)

        def __iter__(self):
            return iter(self.batches)

    class Partial(Tiny):
        def build_data(self, dist):
            return {"train": Sequential(make_batches(40, 16) + make_batches(16, 16))}

    with pytest.warns(nx.NitroWarning, match="runs in ONE producer thread"):
        nitro = nx.Nitro(Partial(), **quiet())
    with pytest.raises(
        nx.ConfigError,
        match="Train batch 2 of epoch 1 holds 8 samples, the first held 16",
    ):
        nitro.train()
    assert isinstance(nitro.phase, nx.Failed) and nitro.stop_reason == "error"


class Diverging(Tiny):
    blowup_step: int = 3

    def loss(self, logits, *, y):
        return Tiny.loss(self, logits, y=y) + jnp.where(y[0, 0] > 2, jnp.nan, 0.0)

    def build_data(self, dist):
        batches = make_batches(64, 16)
        batches[2]["y"] = (
            batches[2]["y"] * 5.0
        )  # y[0, 0] > 2 only if that sample is class 0
        batches[2]["y"][0] = [5.0, 0.0, 0.0]
        return {"train": batches, "val": make_batches(16, 16)}


def test_a_non_finite_loss_raises_naming_step_and_epoch(tmp_path):
    nitro = nx.Nitro(Diverging(), run_dir=str(tmp_path), checkpointer=None)
    with pytest.raises(
        nx.DivergenceError, match="The training loss is nan at step 3 of epoch 1"
    ):
        nitro.train()
    lines = read_lines(tmp_path / "metrics.jsonl")
    run_id = nitro.prepared.run_id
    assert lines[-1] == {"type": "finish", "run_id": run_id, "status": "error"}


def test_with_accum_a_divergence_names_the_step_of_a_first_micro_batch(tmp_path):
    # Batch 3 (index 2) is the first micro-batch of optimizer step 2 at accum 2.
    nitro = nx.Nitro(Diverging(), accum=2, run_dir=str(tmp_path), checkpointer=None)
    with pytest.raises(
        nx.DivergenceError, match="The training loss is nan at step 2 of epoch 1"
    ):
        nitro.train()


class Finished(QuietLogger):
    def __init__(self):
        self.statuses = []

    def finish(self, status):
        self.statuses.append(status)


def test_a_failure_after_the_last_epoch_still_finishes_the_logger_and_fails(
    monkeypatch,
):
    def broken(nitro, values):
        raise RuntimeError("restore_best broke")

    monkeypatch.setattr("jaxnitro.run.training.finish_restore_best", broken)
    logger = Finished()
    nitro = nx.Nitro(Tiny(max_epochs=1), logger=logger, checkpointer=None)
    with pytest.raises(RuntimeError, match="restore_best broke"):
        nitro.train()
    assert logger.statuses == ["error"]
    assert isinstance(nitro.phase, nx.Failed) and nitro.stop_reason == "error"


class FinishRaises(Finished):
    def finish(self, status):
        super().finish(status)
        raise OSError("tracker unreachable")


class Releases(list):
    released = 0

    def release(self):
        self.released += 1


def test_a_logger_whose_finish_raises_fails_the_run_and_releases_the_sources():
    train, logger, terminal = Releases(make_batches(64, 16)), FinishRaises(), []
    nitro = nx.Nitro(
        Tiny(max_epochs=1), data={"train": train}, logger=logger, checkpointer=None
    )

    def watch(phase, step, epoch, info):
        if isinstance(phase, nx.Terminal):
            terminal.append(type(phase).__name__)

    nx.register_phase_monitor(watch, nitro=nitro)
    with pytest.raises(OSError, match="tracker unreachable"):
        nitro.train()
    assert logger.statuses == ["completed"]  # it raised: not called again
    assert isinstance(nitro.phase, nx.Failed) and nitro.stop_reason == "error"
    assert terminal == ["Failed"] and train.released == 1


class LineRecorder(QuietLogger):
    def __init__(self):
        self.lines = []

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        self.lines.append((context, dict(metrics)))


def test_loss_terms_are_averaged_over_the_steps_micro_batches_as_the_loss_is():
    class WithTerms(Tiny):
        def loss(self, logits, *, y):
            value = Tiny.loss(self, logits, y=y)
            return value, {"same": value, "twice": 2 * value}

    recorder = LineRecorder()
    nx.Nitro(
        WithTerms(max_epochs=1),
        accum=2,
        logger=recorder,
        checkpointer=None,
        log_every_n_steps=1,
    ).train()
    train = [line for context, line in recorder.lines if context == "train"]
    assert len(train) == 2
    for line in train:
        assert line["loss/same"] == pytest.approx(line["loss"], rel=1e-6)
        assert line["loss/twice"] == pytest.approx(2 * line["loss"], rel=1e-6)


class RunsDry:
    """Says len() 4 but its one iterator is shared: the probe and epoch 1 drain it.

    Each `__iter__` wraps it anew, so setup's check for one iterator handed out twice
    cannot see it; returning the shared iterator itself is refused at setup.
    """

    def __init__(self):
        self._batches = iter(make_batches(64, 16))

    def __len__(self):
        return 4

    def __iter__(self):
        return (batch for batch in self._batches)


class Shrinking:
    """Says len() 4 but yields 2 batches: a source that runs short."""

    def __init__(self):
        self._batches = make_batches(64, 16)

    def __len__(self):
        return 4

    def __iter__(self):
        return iter(self._batches[:2])


@pytest.mark.parametrize("source", [RunsDry, Shrinking])
@pytest.mark.parametrize("accum", [1, 2])
def test_an_epoch_that_delivers_other_than_len_batches_is_refused(source, accum):
    class Short(Tiny):
        def build_data(self, dist):
            return {"train": nx.data.PrefetchIterator(source(), workers=1)}

    nitro = nx.Nitro(Short(max_epochs=2), accum=accum, **quiet())
    with pytest.raises(
        nx.ConfigError, match=r"delivered \d batches in epoch 1, but len"
    ):
        nitro.train()
    assert nitro.stop_reason == "error"


def test_check_divergence_off_continues_and_drops_the_value(tmp_path):
    nitro = nx.Nitro(
        Diverging(max_epochs=1),
        run_dir=str(tmp_path),
        checkpointer=None,
        check_divergence=False,
        log_every_n_steps=1,
    )
    nitro.train()
    train = [
        line
        for line in read_lines(tmp_path / "metrics.jsonl")
        if line.get("context") == "train"
    ]
    assert [("loss" in line) for line in train] == [True, True, False, True]
    assert np.isnan(nitro.history[-1]["train_loss"])


def test_request_stop_leaves_at_the_step_boundary_and_checkpoints(tmp_path):
    holder = []

    class Stopper(nx.JSONLogger):
        def log_metrics(self, metrics, *, step, epoch, context, **kw):
            super().log_metrics(metrics, step=step, epoch=epoch, context=context)
            if context == "train" and step == 2:
                holder[0].request_stop()

    nitro = nx.Nitro(
        Tiny(max_epochs=5),
        run_dir=str(tmp_path),
        logger=Stopper(),
        run_ref=holder,
        log_every_n_steps=1,
    )
    nitro.train()
    assert nitro.stop_reason == "requested"
    assert nitro.current_epoch == 1 and nitro.current_step == 3  # one in flight
    assert nitro.history[-1]["epoch"] == 1 and "loss" in nitro.history[-1]
    manifest = nx.read_manifest(str(tmp_path))
    assert manifest[-1].stop_reason == "requested"
    assert read_lines(tmp_path / "metrics.jsonl")[-1] == {
        "type": "finish",
        "run_id": nitro.prepared.run_id,
        "status": "requested",
    }


@pytest.mark.parametrize("resume", [False, True], ids=["same-handle", "resume"])
def test_an_epoch_continued_after_a_stop_reports_the_whole_epochs_train_loss(
    tmp_path, resume
):
    recipe = {"max_epochs": 2, "n_train": 128}  # 8 batches: 4 steps an epoch
    straight = nx.Nitro(Tiny(**recipe), accum=2, **quiet())
    straight.train()
    stopper = StopsAtStep(5)  # read back after step 6: the stop ends step 6
    first = nx.Nitro(
        Tiny(**recipe),
        run_dir=str(tmp_path),
        accum=2,
        logger=stopper,
        log_every_n_steps=1,
        steps_per_call=1,  # on an accelerator too ("auto" stops at a call's end)
    )
    stopper.nitro = first
    first.train()
    assert (first.current_epoch, first.current_step) == (2, 6)
    again = first
    if resume:
        again = nx.Nitro(
            Tiny(**recipe),
            run_dir=str(tmp_path),
            accum=2,
            logger=None,
            resume="auto",
        )
    again.train()
    assert again.current_step == 8 and again.history[-1]["epoch"] == 2
    assert again.history[-1]["train_loss"] == straight.history[-1]["train_loss"]


def _stopped_midway(tmp_path, *, accum, at_line, n_train=128):
    recipe = {"max_epochs": 2, "n_train": n_train}
    stopper = StopsAtStep(at_line)
    first = nx.Nitro(
        Tiny(**recipe),
        run_dir=str(tmp_path),
        accum=accum,
        logger=stopper,
        log_every_n_steps=1,
        steps_per_call=1,  # on an accelerator too ("auto" stops at a call's end)
    )
    stopper.nitro = first
    first.train()
    return recipe, first


def test_a_resume_with_another_accum_trains_the_rest_of_the_stopped_epoch(tmp_path):
    # accum 1, 8 batches an epoch: stopped after step 12, 4 batches into epoch 2.
    recipe, first = _stopped_midway(tmp_path, accum=1, at_line=11)
    assert (first.current_epoch, first.current_step) == (2, 12)
    again = nx.Nitro(
        Tiny(**recipe), run_dir=str(tmp_path), accum=2, logger=None, resume="auto"
    )
    again.train()
    # The other 4 batches of epoch 2, as 2 steps of 2: nothing skipped.
    assert again.current_step == 14 and again.history[-1]["epoch"] == 2


def test_a_resume_whose_accum_does_not_divide_the_stopped_position_is_refused(
    tmp_path,
):
    recipe, first = _stopped_midway(tmp_path, accum=1, at_line=10)  # 3 into epoch 2
    assert first.current_step == 11
    again = nx.Nitro(
        Tiny(**recipe), run_dir=str(tmp_path), accum=2, logger=None, resume="auto"
    )
    with pytest.raises(nx.ConfigError, match="stopped 3 batches into epoch 2"):
        again.train()


def test_run_ref_accepts_a_callable():
    seen = []
    nitro = nx.Nitro(Tiny(), run_ref=seen.append, **quiet())
    assert seen == [nitro]


def test_no_batch_buffer_outlives_its_step():
    batch_shapes = {(16, 8), (16, 3)}
    alive_at_lines = []
    # Arrays an earlier test left for the collector (a traceback's frames) are not
    # this run's: collect them, and count only arrays made after this point.
    gc.collect()
    before = {id(a) for a in jax.live_arrays()}

    class Sampler(QuietLogger):
        def log_metrics(self, metrics, *, step, epoch, context, **kw):
            if context == "train":
                alive = [
                    a
                    for a in jax.live_arrays()
                    if a.shape in batch_shapes and id(a) not in before
                ]
                alive_at_lines.append(len(alive))

    nitro = nx.Nitro(
        Tiny(max_epochs=2, width=20),
        logger=Sampler(),
        checkpointer=None,
        log_every_n_steps=1,
    )
    nitro.train()
    # On the CPU the executable takes the host arrays: no batch buffer outlives its
    # step. Staged (an accelerator, or --staged): device_batches (1) + 2 batches of
    # two fields at most.
    bound = 2 * (1 + 2) if feed.stages_on_device() else 0
    assert len(alive_at_lines) == 8 and max(alive_at_lines) <= bound
    leftover = [a.shape for a in jax.live_arrays() if id(a) not in before]
    assert not batch_shapes & set(leftover)


def test_resumed_handle_at_max_epochs_warns_nothing_to_train(tmp_path):
    nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None).train()
    done = nx.Nitro(
        Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None, resume="auto"
    )
    with pytest.warns(
        nx.NitroWarning,
        match='Nothing to train: the handle is at epoch 1.*Nitro\\(e, resume="auto", '
        "max_epochs=N\\)",
    ):
        done.train()
    with pytest.raises(nx.ConfigError, match="train\\(\\) takes no keywords"):
        done.train(max_epochs=3)


def test_compile_options_are_checked_at_construction():
    with pytest.raises(nx.ConfigError, match="compile_options were refused by XLA"):
        nx.Nitro(Tiny(), compile_options={"xla_no_such_option": True}, **quiet())
    nitro = nx.Nitro(
        Tiny(max_epochs=1),
        compile_options={"xla_embed_ir_in_executable": True},
        **quiet(),
    )
    nitro.train()


def test_a_misspelled_monitor_raises_at_the_end_of_the_first_epoch():
    from experiments import TinyMetrics

    class Typo(TinyMetrics):
        def monitor(self):
            return ("accc", "max")

    nitro = nx.Nitro(Typo(max_epochs=2), **quiet())  # nothing follows the monitor
    with pytest.raises(
        nx.ConfigError,
        match=r"monitor\(\) names `accc` \(max\), but validation(.|\n)*"
        r"Did you mean `acc`\?",
    ):
        nitro.train()
    assert nitro.current_epoch == 1


def test_a_run_count_of_the_wrong_type_names_its_source_and_the_fix():
    with pytest.raises(
        nx.ConfigError,
        match=r"max_epochs must be an int, got '3' \(from the keyword\)\. Pass a "
        r"whole number",
    ):
        nx.Nitro(Tiny(), max_epochs="3", **quiet())


def test_monitors_see_every_epoch_start_and_progress_shows_the_checkpoint_write(
    tmp_path,
):
    class NoVal(Tiny):  # stays in TrainStepping from one epoch to the next
        max_epochs: int = 3

        def build_data(self, dist):
            return {"train": make_batches(32, 16)}

    starts, verbs = [], []
    nitro = nx.Nitro(
        NoVal(),
        logger=None,
        run_dir=str(tmp_path),
        checkpointer=nx.Checkpointer(keep=nx.Last(1)),
    )
    nx.register_phase_monitor(
        lambda phase, step, epoch, info: starts.append(
            (type(phase).__name__, epoch, info.get("epoch_started"))
        ),
        nitro=nitro,
    )
    previous = nx.progress_reporter(
        lambda verb, label, *rest: verbs.append((verb, label))
    )
    try:
        nitro.train()
    finally:
        nx.progress_reporter(previous)
    assert [s for s in starts if s[2] is not None] == [
        ("TrainStepping", 1, 1),
        ("TrainStepping", 2, 2),
        ("TrainStepping", 3, 3),
    ]
    phases = [label for verb, label in verbs if verb == "phase"]
    assert phases.count("writing checkpoint") == 3
    at = verbs.index(("phase", "writing checkpoint"))
    assert verbs[at + 1] == ("phase", "")  # and the line goes back to its work


class FailingFinish(QuietLogger):
    """A logger whose finish fails, as one writing to the same full disk would."""

    def finish(self, status):
        raise OSError(28, "No space left on device")


def test_a_logger_failing_at_shutdown_never_masks_a_full_disk(tmp_path, monkeypatch):
    from jaxnitro.checkpoint import record as record_module

    full = record_module.SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    )

    def no_room(tensors, path, metadata=None):
        raise full

    monkeypatch.setattr(record_module, "save_file", no_room)
    nitro = nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path), logger=FailingFinish())
    with pytest.raises(nx.CheckpointError) as caught:
        nitro.train()
    assert str(caught.value).startswith("Cannot write the checkpoint ")
    assert "No space left on device" in str(caught.value)
    assert any(
        "logger's finish('error') also failed" in n for n in caught.value.__notes__
    )
    assert nitro.stop_reason == "error"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]
