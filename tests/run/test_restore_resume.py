"""Checkpoints the core writes, weights=, and resume="auto" with exact continuation."""

import enum
import json
import logging
import os
import struct

import jax
import numpy as np
import pytest
from checkpoint_fixtures import edit_header
from experiments import QuietLogger, StopsAtStep, Tiny, make_batches

import jaxnitro as nx
from jaxnitro.checkpoint.manifest import repair_manifest
from jaxnitro.checkpoint.record import CheckpointRecord, read_header
from jaxnitro.loop.state import HeldStop


class Scored(Tiny):
    """Validation loss rises on a schedule, so Best and Last pick different epochs."""


def test_default_checkpointer_writes_records_and_a_manifest(tmp_path):
    nitro = nx.Nitro(Tiny(max_epochs=5), run_dir=str(tmp_path), logger=None)
    nitro.train()
    entries = nx.read_manifest(str(tmp_path))
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    assert sorted(e.file for e in entries) == files
    scores = {row["epoch"]: row["loss"] for row in nitro.history}
    best3 = sorted(scores, key=scores.get)[:3]
    assert sorted(e.epoch for e in entries) == sorted(set(best3) | {5})
    last = max(entries, key=lambda e: e.epoch)
    assert (
        last.stop_reason == "completed" and last.metric == "loss" and last.mode == "min"
    )
    assert {e.run for e in entries} == {nitro.checkpoint_run}
    assert last.file == nx.checkpoint_filename(
        epoch=5, step=20, metric="loss", score=scores[5]
    )
    info = nx.checkpoint_info(tmp_path / last.file)
    assert (info["epoch"], info["step"], info["seed"]) == (5, 20, 42)
    assert info["metrics"]["loss"] == pytest.approx(scores[5])
    assert info["stop_reason"] == "completed"
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]


def test_a_record_holds_no_pickle_and_reads_back(tmp_path):
    nitro = nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None)
    nitro.train()
    path = tmp_path / nx.read_manifest(str(tmp_path))[0].file
    record = CheckpointRecord(str(path))
    assert set(k.split("/")[0] for k in record.arrays) == {
        "params",
        "opt_state",
        "device",
    }
    restored = record.restore("params", nitro.parameters, "parameter")
    for a, b in zip(
        jax.tree.leaves(restored), jax.tree.leaves(nitro.parameters), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert b"pickle" not in path.read_bytes()[:200]


def test_weights_restores_parameters_and_derived_values_and_skips_derive(tmp_path):
    calls = []

    class WithDerive(Tiny):
        class_weights: nx.Device[np.ndarray] = nx.field(
            default_factory=lambda: np.zeros(0, np.float32)
        )

        def derive(self, data):
            calls.append(1)
            return {"class_weights": np.array([0.2, 0.3, 0.5], np.float32)}

    trained = nx.Nitro(WithDerive(max_epochs=2), run_dir=str(tmp_path), logger=None)
    trained.train()
    expected = trained.evaluate(split="test")
    path = tmp_path / max(nx.read_manifest(str(tmp_path)), key=lambda e: e.epoch).file
    loaded = nx.Nitro(
        WithDerive(),
        weights=str(path),
        data={"test": make_batches(40, 16, seed=2)},
        logger=None,
        checkpointer=None,
    )
    assert calls == [1]  # derive ran for the trained handle only
    np.testing.assert_allclose(loaded.device_value("class_weights"), [0.2, 0.3, 0.5])
    assert loaded.evaluate(split="test")["loss"] == pytest.approx(
        expected["loss"], rel=1e-6
    )
    assert loaded.current_step == 0  # weights carry no training position


class DerivedShape(Tiny):
    n_out: nx.GraphConst[int] = 5
    variant: nx.GraphConst[str] = "a"
    n_seen: int = 0
    names: list = nx.field(default_factory=list)

    def derive(self, data):
        return {"n_out": 3, "n_seen": sum(len(b["y"]) for b in data["train"])}

    def build_model(self, rng):
        model, params, state = Tiny.build_model(self, rng)
        return model, {**params, "w2": params["w2"][:, : self.n_out]}, state


def trained_record(cls, tmp_path):
    nx.Nitro(cls(max_epochs=1), run_dir=str(tmp_path), logger=None).train()
    return str(tmp_path / nx.read_manifest(str(tmp_path))[0].file)


def test_weights_restores_derived_graphconst_and_host_values(tmp_path):
    path = trained_record(DerivedShape, tmp_path)
    # Only `variant`, which the user set and derive does not produce, differs.
    with pytest.warns(nx.NitroWarning) as warned:
        loaded = nx.Nitro(
            DerivedShape(variant="b"),
            weights=path,
            data={"test": make_batches(16, 8)},
            logger=None,
            checkpointer=None,
        )
    (message,) = [str(w.message) for w in warned]
    assert "(variant: 'a' in the record, 'b' now)" in message
    e = loaded.experiment
    assert (e.n_out, e.n_seen, e.variant) == (3, 64, "b")


class DerivedTables(DerivedShape):
    counts: np.ndarray | None = None

    def derive(self, data):
        labels = np.concatenate([b["y"] for b in data["train"]]).argmax(-1)
        counts = np.bincount(labels, minlength=3).astype(np.int64)
        return {"n_out": 3, "names": ["a", "b", "c"], "counts": counts}


def test_weights_restores_derived_host_arrays_and_json_values(tmp_path):
    path = trained_record(DerivedTables, tmp_path)
    e = DerivedTables()
    derived = e.derive(e.build_data(None))
    loaded = nx.Nitro(DerivedTables(), weights=path, logger=None, checkpointer=None)
    e = loaded.experiment
    assert e.names == ["a", "b", "c"] and e.n_out == 3
    assert e.counts.dtype == np.int64
    np.testing.assert_array_equal(e.counts, derived["counts"])


def test_weights_warns_for_a_derived_host_value_no_record_holds(tmp_path):
    class DerivedNames(DerivedShape):
        def derive(self, data):
            return {"n_out": 3, "names": ("a", "b", "c")}  # JSON returns a list

    path = trained_record(DerivedNames, tmp_path)
    with pytest.warns(
        nx.NitroWarning,
        match="the record does not hold the values derive produced for `names`",
    ):
        loaded = nx.Nitro(DerivedNames(), weights=path, logger=None, checkpointer=None)
    assert loaded.experiment.names == [] and loaded.experiment.n_out == 3


def test_weights_by_run_and_which(tmp_path):
    nitro = nx.Nitro(Tiny(max_epochs=3), run_dir=str(tmp_path), logger=None)
    nitro.train()
    best = nx.Nitro(
        Tiny(),
        run_dir=str(tmp_path),
        weights=("latest", "best"),
        logger=None,
        checkpointer=None,
    )
    assert best.validate()["loss"] == pytest.approx(
        min(r["loss"] for r in nitro.history), rel=1e-6
    )
    by_id = nx.Nitro(
        Tiny(),
        run_dir=str(tmp_path),
        weights=(nitro.checkpoint_run, "latest"),
        logger=None,
        checkpointer=None,
    )
    assert by_id.validate()["loss"] == pytest.approx(
        nitro.history[-1]["loss"], rel=1e-6
    )


@pytest.mark.parametrize(
    "source, error, message",
    [
        ("best", nx.ConfigError, 'weights=\\("latest", "best"\\)'),
        (
            "nowhere.safetensors",
            nx.CheckpointError,
            "no such checkpoint file. The run directory",
        ),
        (
            ("latest", "best"),
            nx.CheckpointError,
            "holds no checkpoints \\(runs: none\\)",
        ),
        (("all", "latest"), nx.ConfigError, 'is \\("latest", "latest"\\)'),
    ],
)
def test_weights_sources_that_cannot_be_found_raise(tmp_path, source, error, message):
    with pytest.raises(error, match=message):
        nx.Nitro(Tiny(), run_dir=str(tmp_path), weights=source, logger=None)


def test_resume_auto_with_nothing_to_resume_warns_and_starts_fresh(tmp_path):
    with pytest.warns(nx.NitroWarning, match='resume="auto" found nothing to resume'):
        nitro = nx.Nitro(Tiny(), run_dir=str(tmp_path), resume="auto", logger=None)
    assert nitro.current_epoch == 0


class OtherLogged(QuietLogger):
    def __init__(self):
        self.other = {}

    def log_other(self, key, value):
        self.other[key] = value


def test_resuming_an_earlier_record_logs_that_it_branches_into_a_new_run(
    tmp_path, caplog
):
    keep = nx.Checkpointer(keep=nx.Last(2))
    first = nx.Nitro(
        Tiny(max_epochs=2), run_dir=str(tmp_path), logger=None, checkpointer=keep
    )
    first.train()
    earlier = min(nx.read_manifest(str(tmp_path)), key=lambda e: e.epoch)
    path = str(tmp_path / earlier.file)
    logger = OtherLogged()
    with caplog.at_level(logging.INFO, logger="jaxnitro"):
        branch = nx.Nitro(Tiny(), run_dir=str(tmp_path), resume=path, logger=logger)
    assert branch.checkpoint_run != first.checkpoint_run
    assert (
        f"resume: {path} is epoch 1 of run {first.checkpoint_run}, not its newest "
        f"record, so this is a new run {branch.checkpoint_run} that branches from it"
        in caplog.text
    )
    assert logger.other["branched_from"] == path
    caplog.clear()
    logger = OtherLogged()
    with caplog.at_level(logging.INFO, logger="jaxnitro"):
        nx.Nitro(Tiny(), run_dir=str(tmp_path), resume="auto", logger=logger)
    assert "branches" not in caplog.text and "branched_from" not in logger.other


def leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


@pytest.mark.parametrize("accum", [1, 2])
@pytest.mark.parametrize("stop_after", [1, 3])
def test_resume_is_bitwise_identical_to_an_uninterrupted_run(
    tmp_path, accum, stop_after
):
    straight = nx.Nitro(
        Tiny(max_epochs=4), run_dir=str(tmp_path / "a"), accum=accum, logger=None
    )
    straight.train()

    first = nx.Nitro(
        Tiny(max_epochs=stop_after),
        run_dir=str(tmp_path / "b"),
        accum=accum,
        logger=None,
    )
    first.train()
    resumed = nx.Nitro(
        Tiny(max_epochs=4),
        run_dir=str(tmp_path / "b"),
        accum=accum,
        logger=None,
        resume="auto",
    )
    assert (resumed.current_epoch, resumed.current_step) == (
        stop_after,
        stop_after * 4 // accum,
    )
    resumed.train()
    assert resumed.current_step == straight.current_step
    for a, b in zip(
        leaves(resumed.parameters), leaves(straight.parameters), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(
        leaves(resumed.train_state.opt_state),
        leaves(straight.train_state.opt_state),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    tail = [
        (r["epoch"], r["step"], r["train_loss"], r["loss"])
        # history[k:] is an epoch-keyed slice (epochs k on), not list positions.
        for r in straight.history[stop_after + 1 :]
    ]
    assert [
        (r["epoch"], r["step"], r["train_loss"], r["loss"]) for r in resumed.history
    ] == tail
    assert (
        resumed.checkpoint_run == first.checkpoint_run
    )  # the newest record continues its run


@pytest.mark.parametrize("resume", [False, True], ids=["same-handle", "resume"])
def test_a_stop_partway_through_an_epoch_continues_that_epoch_bitwise(tmp_path, resume):
    """The stopped epoch is validated and checkpointed; training again (the same
    handle, or a resume) finishes the epoch from the next batch, and the run ends
    equal to one never stopped (Plateau and early stopping count the epoch once)."""

    class Plateaued(Tiny):
        def schedules(self):
            return {"learning_rate": nx.Plateau(0.1, patience=0)}

    recipe = {"max_epochs": 3, "n_train": 128}  # 8 batches: 4 steps an epoch
    straight = nx.Nitro(
        Plateaued(**recipe), run_dir=str(tmp_path / "a"), accum=2, logger=None
    )
    straight.train()
    # Step 5's line is read back after step 6 is dispatched: the stop comes at the
    # boundary after step 6, halfway through epoch 2.
    stopper = StopsAtStep(5)
    first = nx.Nitro(
        Plateaued(**recipe),
        run_dir=str(tmp_path / "b"),
        accum=2,
        logger=stopper,
        log_every_n_steps=1,
        steps_per_call=1,  # on an accelerator too ("auto" stops at a call's end)
    )
    stopper.nitro = first
    first.train()
    assert (first.stop_reason, first.current_epoch, first.current_step) == (
        "requested",
        2,
        6,
    )
    again = first
    if resume:
        again = nx.Nitro(
            Plateaued(**recipe),
            run_dir=str(tmp_path / "b"),
            accum=2,
            logger=None,
            resume="auto",
        )
    again.train()
    assert again.stop_reason == "completed"
    assert again.current_step == straight.current_step == 12
    for a, b in zip(leaves(again.parameters), leaves(straight.parameters), strict=True):
        np.testing.assert_array_equal(a, b)
    if not resume:  # one row an epoch, the stopped epoch's replaced when it ended
        assert [r["epoch"] for r in again.history] == [1, 2, 3]
        assert again.history[-1]["loss"] == straight.history[-1]["loss"]


def _stopped_in_epoch_two(run_dir):
    """A run of 4 steps an epoch (accum 2, 8 batches) stopped after step 6,
    halfway through epoch 2; its recipe and handle."""
    recipe = {"max_epochs": 2, "n_train": 128}
    stopper = StopsAtStep(5)  # read back after step 6: the stop ends step 6
    first = nx.Nitro(
        Tiny(**recipe),
        run_dir=str(run_dir),
        accum=2,
        logger=stopper,
        log_every_n_steps=1,
        steps_per_call=1,  # on an accelerator too ("auto" stops at a call's end)
    )
    stopper.nitro = first
    assert first.train_state.held is None
    first.train()
    assert (first.stop_reason, first.current_step) == ("requested", 6)
    return recipe, first


def _newest_header(run_dir):
    return read_header(str(run_dir / nx.read_manifest(str(run_dir))[-1].file))


@pytest.mark.parametrize("resume", [False, True], ids=["same-handle", "resume"])
def test_the_train_state_holds_where_a_stop_cut_the_epoch_until_the_epoch_ends(
    tmp_path, resume
):
    recipe, first = _stopped_in_epoch_two(tmp_path)
    held = first.train_state.held
    assert isinstance(held, HeldStop)
    # Epoch 2's first 4 batches (steps 5 and 6), their 4 losses summed.
    assert (held.epoch, held.step, held.batches, held.loss_count) == (2, 6, 4, 4)
    assert np.isfinite(held.loss_sum) and held.loss_sum > 0
    # The record written at the stop keeps it, from the state.
    assert _newest_header(tmp_path).epoch_loss == held.to_json()
    again = first
    if resume:
        again = nx.Nitro(
            Tiny(**recipe),
            run_dir=str(tmp_path),
            accum=2,
            logger=None,
            resume="auto",
        )
        assert again.train_state.held == held  # restored into the state
    again.train()
    assert (again.stop_reason, again.current_step) == ("completed", 8)
    assert again.train_state.held is None  # the continued epoch ended whole
    assert _newest_header(tmp_path).epoch_loss is None


def test_a_damaged_held_stop_in_the_record_resumes_with_none(tmp_path):
    recipe, _ = _stopped_in_epoch_two(tmp_path)
    path = tmp_path / nx.read_manifest(str(tmp_path))[-1].file
    edit_header(path, lambda meta: {**meta, "epoch_loss": {"epoch": 2}})
    repair_manifest(str(tmp_path))  # the edited record listed as it is now
    again = nx.Nitro(
        Tiny(**recipe), run_dir=str(tmp_path), accum=2, logger=None, resume="auto"
    )
    assert again.train_state.held is None
    again.train()
    # The step count places the rest of the epoch: its other 4 batches, 2 steps.
    assert (again.current_epoch, again.current_step) == (2, 8)
    assert [r["epoch"] for r in again.history] == [2]


def test_a_stop_asked_for_during_validation_ends_the_run_after_that_epoch():
    nitro = nx.Nitro(Tiny(max_epochs=3), logger=None, checkpointer=None)

    def stop_in_validation(phase, step, epoch, info):
        if isinstance(phase, nx.EvalStepping):
            nitro.request_stop()

    nx.register_phase_monitor(stop_in_validation, nitro=nitro)
    nitro.train()
    assert (nitro.stop_reason, nitro.current_epoch, nitro.current_step) == (
        "requested",
        1,
        4,
    )


def test_a_run_with_a_stateless_optimizer_resumes(tmp_path):
    import optax

    class PlainSGD(Tiny):
        def optimizer(self):
            return optax.sgd

    nx.Nitro(PlainSGD(max_epochs=1), run_dir=str(tmp_path), logger=None).train()
    resumed = nx.Nitro(
        PlainSGD(max_epochs=2), run_dir=str(tmp_path), logger=None, resume="auto"
    )
    resumed.train()
    assert resumed.current_step == 8


def test_resume_restores_the_recorded_seed_with_a_warning(tmp_path):
    nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None, seed=5).train()
    with pytest.warns(
        nx.NitroWarning,
        match="recorded seed 5; the seed given here \\(42\\) is ignored",
    ) as caught:
        resumed = nx.Nitro(
            Tiny(max_epochs=2), run_dir=str(tmp_path), logger=None, resume="auto"
        )
    assert resumed.frozen()["seed"] == 5
    # The warning names the line that built the handle, not a frame of setup.
    assert [w.filename for w in caught] == [__file__]


def test_resume_refuses_changed_graphconst_fields(tmp_path):
    nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None).train()
    with pytest.raises(
        nx.ConfigError,
        match="GraphConst fields differ .*width: 16 in the record, 32 now",
    ):
        nx.Nitro(
            Tiny(max_epochs=2, width=32),
            run_dir=str(tmp_path),
            logger=None,
            resume="auto",
        )


def test_resume_appends_to_the_same_log(tmp_path):
    nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path)).train()
    nx.Nitro(Tiny(max_epochs=2), run_dir=str(tmp_path), resume="auto").train()
    lines = [
        json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert [x["status"] for x in lines if x["type"] == "finish"] == [
        "completed",
        "completed",
    ]
    assert [x["epoch"] for x in lines if x.get("context") == "validate"] == [1, 2]


class CrashAt(nx.JSONLogger):
    """A JSON logger that dies at the first train line of one epoch: a crash."""

    def __init__(self, crash_in):
        super().__init__()
        self.crash_epoch = crash_in

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        if context == "train" and epoch == self.crash_epoch:
            raise RuntimeError("the machine went away")
        super().log_metrics(metrics, step=step, epoch=epoch, context=context)


@pytest.mark.parametrize("crash_in", [2, 3])
def test_resume_after_a_crash_with_ema_plateau_and_schedules_is_bitwise(
    tmp_path, crash_in
):
    """Train 4 epochs straight, against: train, crash in epoch k, resume to 4."""

    def train(run_dir, **extra):
        nitro = nx.Nitro(
            Tiny(max_epochs=4),
            run_dir=str(run_dir),
            accum=2,
            ema=nx.EMA(0.9),
            schedules={
                "learning_rate": nx.Plateau(
                    lambda total: lambda t: 0.05 * (1 - t / total), patience=0
                ),
                "smoothing": lambda total: lambda t: 0.01 * t,
            },
            early_stop=nx.EarlyStopping(patience=3, min_delta=0.0),
            log_every_n_steps=1,
            **extra,
        )
        nitro.train()
        return nitro

    straight = train(tmp_path / "a")
    with pytest.raises(RuntimeError, match="the machine went away"):
        train(tmp_path / "b", logger=CrashAt(crash_in=crash_in))
    resumed = train(tmp_path / "b", resume="auto", logger=CrashAt(crash_in=99))
    # It redid the lost epoch: its history starts there and runs to the end.
    assert [r["epoch"] for r in resumed.history] == list(range(crash_in, 5))
    for name in ("params", "opt_state", "ema"):
        for a, b in zip(
            leaves(getattr(resumed.train_state, name)),
            leaves(getattr(straight.train_state, name)),
            strict=True,
        ):
            np.testing.assert_array_equal(a, b)
    for p, q in zip(
        resumed.prepared.plan.schedules, straight.prepared.plan.schedules, strict=True
    ):
        if p.plateau is not None:
            assert p.plateau.state() == q.plateau.state()
    assert resumed.prepared.stopper.state() == straight.prepared.stopper.state()
    rows = [(r["epoch"], r["train_loss"], r["loss"]) for r in straight.history]
    assert [(r["epoch"], r["train_loss"], r["loss"]) for r in resumed.history] == rows[
        crash_in - 1 :
    ]

    def logged(run_dir, context):
        text = (run_dir / "metrics.jsonl").read_text().splitlines()
        lines = [json.loads(x) for x in text]
        return [
            {k: v for k, v in x.items() if k.startswith("schedule/") or k == "step"}
            for x in lines
            if x.get("context") == context
        ]

    for context in ("train", "validate"):
        assert logged(tmp_path / "b", context) == logged(tmp_path / "a", context)


class Act(enum.Enum):
    RELU = "relu"
    TANH = "tanh"


class DerivedConstants(Tiny):
    pair: nx.GraphConst[tuple] = (0.0, 0.0)
    act: nx.GraphConst[Act] = Act.RELU

    def derive(self, data):
        return {"pair": (0.5, float("nan")), "act": Act.TANH}


def test_weights_restores_derived_graphconst_values_exactly_or_warns(tmp_path):
    path = trained_record(DerivedConstants, tmp_path)
    with pytest.warns(nx.NitroWarning) as warned:
        loaded = nx.Nitro(
            DerivedConstants(), weights=path, logger=None, checkpointer=None
        )
    pair = loaded.experiment.pair
    assert pair[0] == 0.5 and np.isnan(pair[1])  # NaN read back as a float
    # An enum's text would come back a string: it is left out, and said so.
    assert loaded.experiment.act is Act.RELU
    (message,) = [str(w.message) for w in warned if "derive produced" in str(w.message)]
    assert "`act`" in message and "`pair`" not in message


def _drop_from_header(path, *keys):
    """Rewrite a record's header without `keys`: a record an older version wrote."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        tensors = f.read()
    meta = json.loads(header["__metadata__"]["jaxnitro"])
    for key in keys:
        meta.pop(key, None)
    header["__metadata__"]["jaxnitro"] = json.dumps(meta)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + tensors)


def test_an_older_record_runs_derive_and_its_device_values_override(tmp_path):
    class DerivedWeights(Tiny):
        class_weights: nx.Device[np.ndarray] = nx.field(
            default_factory=lambda: np.ones(3, np.float32)
        )

        def derive(self, data):
            return {"class_weights": np.array([9.0, 9.0, 9.0], np.float32)}

    class Trained(DerivedWeights):
        def derive(self, data):
            return {"class_weights": np.array([0.1, 0.2, 0.7], np.float32)}

    path = trained_record(Trained, tmp_path)
    _drop_from_header(path, "derived", "derived_host", "derived_graphconst")
    loaded = nx.Nitro(DerivedWeights(), weights=path, logger=None, checkpointer=None)
    np.testing.assert_allclose(loaded.device_value("class_weights"), [0.1, 0.2, 0.7])


def test_a_misspelled_resume_names_auto(tmp_path):
    with pytest.raises(nx.CheckpointError, match='pass resume="auto"'):
        nx.Nitro(Tiny(), run_dir=str(tmp_path), resume="atuo", logger=None)
