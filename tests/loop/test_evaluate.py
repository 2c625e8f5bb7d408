"""validate, evaluate and predict: the metrics they return, padding, residency, the
one shared eval program."""

import threading
import types
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from experiments import (
    N_CLASSES,
    QuietLogger,
    Tiny,
    TinyMetrics,
    make_batches,
    mlp,
)
from toy_sources import FannedOut

import jaxnitro as nx
import jaxnitro.loop.feed as feed
from jaxnitro.checkpoint.manifest import read_manifest
from jaxnitro.compile.cache import program_cache


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


def test_default_metric_is_loss_averaged_over_batches():
    nitro = nx.Nitro(Tiny(), **quiet())
    result = nitro.validate()
    assert set(result) == {"loss"}
    per_batch = batch_losses(nitro, make_batches(24, 16, seed=1))
    assert result["loss"] == pytest.approx(np.mean(per_batch), rel=1e-5)


def batch_losses(nitro, batches):
    """Tiny's loss of each batch, computed directly."""
    e, params = nitro.experiment, nitro.parameters
    return [
        float(Tiny.loss(e, mlp(params, jnp.asarray(b["x"])), y=jnp.asarray(b["y"])))
        for b in batches
    ]


class Counting(TinyMetrics):
    scratch: dict = nx.field(default_factory=dict)  # Host: what finalize keeps

    def metrics(self, logits, *, y):
        assert isinstance(logits, np.ndarray) and len(logits) == len(y)
        base = TinyMetrics.metrics(self, logits, y=y)
        return {
            **base,
            "n": (len(y), "sum"),
            "sizes": (np.full(len(y), len(y)), "concat"),
        }

    def finalize_metrics(self, acc, split):
        c = acc["confusion"]
        recall = np.diag(c) / np.maximum(c.sum(1), 1)
        self.scratch["sizes"] = acc["sizes"]  # per sample: kept, not logged
        return {
            "acc": acc["acc"],
            "macro_recall": recall.mean(),
            "n": acc["n"],
            "split": split,
        }


def test_metrics_never_see_padding_and_finalize_gets_the_split():
    nitro = nx.Nitro(Counting(), **quiet())
    val = nitro.validate()
    assert val["n"] == 24 and val["split"] == "val"
    sizes = nitro.experiment.scratch["sizes"]
    np.testing.assert_array_equal(sizes, [16] * 16 + [8] * 8)
    test = nitro.evaluate(split="test")
    assert test["n"] == 40 and test["split"] == "test"
    batches = make_batches(40, 16, seed=2)
    x = np.concatenate([b["x"] for b in batches])
    y = np.concatenate([b["y"] for b in batches])
    pred = np.asarray(mlp(nitro.parameters, jnp.asarray(x))).argmax(-1)
    assert test["acc"] == pytest.approx((pred == y.argmax(-1)).mean())


def test_device_residency_matches_host():
    class OnDevice(TinyMetrics):
        def metrics(self, logits, *, y):
            pred, truth = jnp.argmax(logits, -1), jnp.argmax(y, -1)
            return {"acc": ((pred == truth).sum(), y.shape[0])}

        def metrics_residency(self, hook):
            return "device"

    host = nx.Nitro(TinyMetrics(), **quiet()).evaluate("test")
    device = nx.Nitro(OnDevice(), **quiet()).evaluate("test")
    assert device["acc"] == pytest.approx(host["acc"])


class StringModes(TinyMetrics):
    """Every mode spelling: a count, None, "sum", "concat", and a group's mode."""

    def metrics(self, logits, *, y):
        pred, truth = jnp.argmax(logits, -1), jnp.argmax(y, -1)
        n = y.shape[0]
        return {
            "acc": ((pred == truth).sum(), n),
            "n": (n, None),
            "hits": ((pred == truth).sum(), "sum"),
            "scores": (logits[:, 0], "concat"),
            "group": ({"a": jnp.sum(y, 0), "b": n}, "sum"),
        }

    def finalize_metrics(self, acc, split):
        return {**acc, "scores": np.sort(acc["scores"])[-3:].sum()}  # reduced


class StringModesOnDevice(StringModes):
    def metrics_residency(self, hook):
        return "device"


def test_device_residency_keeps_string_modes_and_matches_host():
    host = nx.Nitro(StringModes(), **quiet()).evaluate("test")
    device = nx.Nitro(StringModesOnDevice(), **quiet()).evaluate("test")
    # A second handle takes the metrics program from the cache: no trace runs, the
    # modes come back all the same.
    cached = nx.Nitro(StringModesOnDevice(), **quiet()).evaluate("test")
    for result in (device, cached):
        assert set(result) == set(host) and result["n"] == 40
        assert result["acc"] == pytest.approx(host["acc"])
        assert result["hits"] == host["hits"]
        assert result["scores"] == pytest.approx(host["scores"], rel=1e-6)
        np.testing.assert_array_equal(result["group"]["a"], host["group"]["a"])
        assert result["group"]["b"] == host["group"]["b"] == 40


def test_eval_loss_adds_the_loss_and_refuses_a_collision():
    nitro = nx.Nitro(TinyMetrics(), eval_loss=True, **quiet())
    result = nitro.validate()
    assert {"acc", "confusion", "loss"} <= set(result)

    class Collides(TinyMetrics):
        def metrics(self, logits, *, y):
            return {"loss": (1.0, 1)}

    with pytest.raises(
        nx.HookError, match="metrics returns `loss` while eval_loss is on"
    ):
        nx.Nitro(Collides(), eval_loss=True, **quiet()).validate()


class WithTerms(TinyMetrics):
    def loss(self, logits, *, y):
        value = Tiny.loss(self, logits, y=y)
        return value, {"ce": value}


def test_eval_loss_terms_stay_apart_from_metrics_and_collisions_name_both():
    result = nx.Nitro(WithTerms(), eval_loss=True, **quiet()).validate()
    assert result["loss/ce"] == pytest.approx(result["loss"])

    class TermCollides(WithTerms):
        def metrics(self, logits, *, y):
            return {"loss/ce": (100.0, 1)}

    with pytest.raises(
        nx.HookError,
        match="metrics returns `loss/ce` while eval_loss is on, which also reports "
        "`loss/ce` \\(the loss hook's term `ce`\\)",
    ):
        nx.Nitro(TermCollides(), eval_loss=True, **quiet()).validate()

    class FinalizeCollides(TinyMetrics):
        def finalize_metrics(self, acc, split):
            return {"acc": acc["acc"], "loss": -1.0}

    with pytest.raises(
        nx.HookError,
        match="finalize_metrics returns `loss` while eval_loss is on, which also "
        "reports `loss` \\(the loss itself\\)",
    ):
        nx.Nitro(FinalizeCollides(), eval_loss=True, **quiet()).validate()


def test_the_eval_loss_averages_batches_whatever_their_order():
    val = make_batches(37, 16, seed=1)  # batches of 16, 16 and 5
    per_batch = batch_losses(nx.Nitro(Tiny(), **quiet()), val)
    for experiment, order in [
        (Tiny(), val),
        (Tiny(), val[::-1]),  # the 5 first sets the width: 16s run as 5, 5, 5, 1
        (TinyMetrics(), val[::-1]),
    ]:
        handle = nx.Nitro(experiment, data={"val": order}, eval_loss=True, **quiet())
        loss = handle.validate()["loss"]
        assert loss == pytest.approx(np.mean(per_batch), rel=1e-5)


class PerBatch(Tiny):
    """Metrics of one eval batch: a count of batches, a per-batch max, sizes."""

    residency: str = "host"

    def metrics(self, logits, *, y):
        n = y.shape[0]
        return {
            "batches": (1, "sum"),
            "top": (jnp.max(logits), 1),  # the mean over batches of each one's max
            "sizes": (jnp.full(n, n), "concat"),
        }

    def finalize_metrics(self, acc, split):
        return {**acc, "sizes": tuple(np.unique(acc["sizes"]).tolist())}

    def metrics_residency(self, hook):
        return self.residency if hook == "metrics" else "device"


@pytest.mark.parametrize("residency", ["host", "device"])
def test_metrics_see_each_batch_whole_when_it_runs_in_chunks(residency):
    val = make_batches(37, 16, seed=1)[::-1]  # 5 first sets the width: 16 runs as 5s
    nitro = nx.Nitro(PerBatch(residency=residency), data={"val": val}, **quiet())
    result = nitro.validate()
    tops = [float(jnp.max(mlp(nitro.parameters, jnp.asarray(b["x"])))) for b in val]
    assert result["batches"] == 3 and result["sizes"] == (5, 16)
    assert result["top"] == pytest.approx(np.mean(tops), rel=1e-5)


def test_custom_metrics_without_monitor_refuse_a_best_checkpointer():
    class NoMonitor(TinyMetrics):
        def monitor(self):
            return None

    with pytest.raises(
        nx.ConfigError,
        match="keeps Best checkpoints but NoMonitor defines its own metrics",
    ):
        nx.Nitro(NoMonitor(), logger=None)
    nx.Nitro(NoMonitor(), logger=None, checkpointer=nx.Checkpointer(keep=nx.Last(1)))


def test_evaluate_unknown_split_lists_the_splits():
    nitro = nx.Nitro(Tiny(), **quiet())
    with pytest.raises(
        nx.ConfigError, match="no split 'holdout'. The splits are: train, val, test"
    ):
        nitro.evaluate(split="holdout")


def test_predict_a_batch_pads_and_slices():
    nitro = nx.Nitro(Tiny(), **quiet())
    x = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    out = nitro.predict({"x": x})
    assert isinstance(out, np.ndarray) and out.shape == (5, N_CLASSES)
    np.testing.assert_allclose(
        out, np.asarray(mlp(nitro.parameters, jnp.asarray(x))), rtol=1e-5
    )
    wide = np.concatenate([x] * 8)  # 40 rows, wider than the eval width of 16
    np.testing.assert_allclose(
        nitro.predict({"x": wide}), np.concatenate([out] * 8), rtol=1e-5
    )


def test_predict_an_iterable_is_lazy():
    nitro = nx.Nitro(Tiny(), **quiet())
    pulled = []

    def loader():
        for size in (16, 16, 7):
            pulled.append(size)
            yield {"x": np.ones((size, 8), np.float32)}

    outputs = nitro.predict(loader())
    assert isinstance(outputs, types.GeneratorType) and pulled == []
    shapes = [o.shape for o in outputs]
    assert shapes == [(16, 3), (16, 3), (7, 3)] and pulled == [16, 16, 7]


def test_predict_a_bare_array_names_the_forward_fields():
    nitro = nx.Nitro(Tiny(), **quiet())
    with pytest.raises(
        nx.RoutingError,
        match="forward is routed by field name and declares x. Pass \\{'x': ...\\}",
    ):
        nitro.predict(np.ones((3, 8), np.float32))


def test_predict_needs_only_forward_fields():
    nitro = nx.Nitro(Tiny(), **quiet())
    with pytest.raises(nx.RoutingError, match="`forward` declares the batch field `x`"):
        nitro.predict({"img": np.ones((3, 8), np.float32)})


def test_data_empty_predicts_with_width_from_the_first_batch():
    nitro = nx.Nitro(Tiny(), data={}, **quiet())
    assert nitro.predict({"x": np.ones((6, 8), np.float32)}).shape == (6, 3)
    assert nitro.predict({"x": np.ones((2, 8), np.float32)}).shape == (2, 3)
    assert nitro.predict({"x": np.ones((13, 8), np.float32)}).shape == (13, 3)


def test_validate_evaluate_predict_share_one_eval_program():
    nitro = nx.Nitro(Tiny(), **quiet())
    nitro.validate()
    before = [k for k in program_cache().program_keys() if k.kind == "eval_forward"]
    nitro.evaluate(split="test")
    nitro.predict({"x": np.ones((3, 8), np.float32)})
    list(nitro.predict(make_batches(20, 16)))
    after = [k for k in program_cache().program_keys() if k.kind == "eval_forward"]
    assert after == before


def test_a_never_trained_handle_allocates_no_optimizer_state():
    nitro = nx.Nitro(Tiny(), **quiet())
    nitro.validate()
    nitro.evaluate(split="test")
    nitro.predict({"x": np.ones((3, 8), np.float32)})
    assert nitro.train_state.opt_state is None
    assert nitro.current_step == 0 and nitro.current_epoch == 0


@pytest.mark.parametrize("container", [dict, list])
def test_a_forward_returning_a_dict_or_list_validates_with_the_default_loss(container):
    class Wrapped(Tiny):
        def forward(self, model, params, state, *, x):
            logits, state = Tiny.forward(self, model, params, state, x=x)
            return ({"logits": logits} if container is dict else [logits]), state

        def loss(self, outputs, *, y):
            logits = outputs["logits"] if container is dict else outputs[0]
            return Tiny.loss(self, logits, y=y)

    expected = nx.Nitro(Tiny(), logger=None, checkpointer=None).validate()["loss"]
    nitro = nx.Nitro(Wrapped(), logger=None, checkpointer=None)
    assert nitro.validate()["loss"] == pytest.approx(expected)


def test_predict_on_fields_of_another_sample_shape_says_which_differ():
    nitro = nx.Nitro(Tiny(), logger=None, checkpointer=None)
    batch = make_batches(4, 4)[0]
    width = batch["x"].shape[1]
    with pytest.raises(Exception) as info:
        nitro.predict({"x": batch["x"][:, :-1]})
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"`x` has samples of shape ({width - 1},), not ({width},)" in notes
    assert "Pass batches shaped like the training data" in notes


def test_evaluation_pads_on_the_prefetch_thread_and_hooks_see_unpadded_batches(
    monkeypatch,
):
    import jaxnitro.data.prefetch as prefetch

    padded_on = []
    pad = prefetch.pad_batch

    def spying_pad(batch, size):
        padded_on.append((threading.current_thread().name, len(batch["x"]), size))
        return pad(batch, size)

    monkeypatch.setattr(prefetch, "pad_batch", spying_pad)
    sizes = []

    class Counting(TinyMetrics):
        def metrics(self, logits, *, y):
            sizes.append((len(logits), len(y)))
            return TinyMetrics.metrics(self, logits, y=y)

    class Fanned(Counting):
        def build_data(self, dist):  # val: batches of 16, 16 and a short 8
            val = make_batches(40, 16, seed=1)
            return {
                "train": make_batches(64, 16),
                "val": nx.data.PrefetchIterator(FannedOut(val), workers=2),
            }

    class Listed(Counting):
        def build_data(self, dist):
            return {"train": make_batches(64, 16), "val": make_batches(40, 16, seed=1)}

    fanned = nx.Nitro(Fanned(), logger=None, checkpointer=None)
    assert fanned.prepared.prefetch["val"].path == "fanout"
    streamed = fanned.validate()
    assert sizes == [(16, 16), (16, 16), (8, 8)]
    # On the CPU the workers pad (nothing to stage); on an accelerator, the transfer
    # thread: either way a prefetch thread, never the consumer.
    assert all(name.startswith("jaxnitro-prefetch-val-") for name, *_ in padded_on)
    assert [(n, size) for _, n, size in padded_on] == [(16, 16), (16, 16), (8, 16)]
    padded_on.clear()
    sizes.clear()
    inline = nx.Nitro(Listed(), logger=None, checkpointer=None).validate()
    assert sizes == [(16, 16), (16, 16), (8, 8)]
    # A list is read inline on the CPU; staged, its one producer thread pads.
    padder = (
        "jaxnitro-prefetch-val-producer" if feed.stages_on_device() else "MainThread"
    )
    assert [name for name, *_ in padded_on] == [padder] * 3
    assert streamed["acc"] == inline["acc"]
    np.testing.assert_array_equal(streamed["confusion"], inline["confusion"])
    assert streamed["confusion"].sum() == 40


class NanAccuracy(TinyMetrics):
    def metrics(self, logits, *, y):
        return {"acc": (np.nan, 1), "count": (len(y), 1)}


def test_a_non_finite_validation_metric_warns_and_ranks_no_checkpoint(tmp_path):
    nitro = nx.Nitro(NanAccuracy(max_epochs=2), run_dir=str(tmp_path), logger=None)
    with pytest.warns(nx.NitroWarning) as caught:
        nitro.train()
    messages = [str(w.message) for w in caught if "non-finite" in str(w.message)]
    assert [m.split(":")[0] for m in messages] == [
        "Split `val` scored non-finite metrics at epoch 1",
        "Split `val` scored non-finite metrics at epoch 2",
    ]
    assert "`acc` = nan" in messages[0] and "`count`" not in messages[0]
    assert np.isnan(nitro.history[-1]["acc"])  # reported as it is
    # The default keep (Best, Last): only the latest, unscored, is kept.
    kept = [(e.epoch, e.score) for e in read_manifest(str(tmp_path))]
    assert kept == [(2, None)]


def test_a_non_finite_metric_outside_training_warns_without_an_epoch():
    nitro = nx.Nitro(NanAccuracy(), logger=None, checkpointer=None)
    expected = r"Split `test` scored non-finite metrics: `acc` = nan"
    with pytest.warns(nx.NitroWarning, match=expected):
        nitro.evaluate("test")


class Poisoned(TinyMetrics):
    """TinyMetrics whose eval logit of each row's true class is NaN while `poison`
    is: accuracy, an argmax (NumPy's picks a NaN), stays finite, and perfect."""

    poison: nx.Device[float] = 0.0

    def forward(self, model, params, state, *, x, y=None):
        logits, state = TinyMetrics.forward(self, model, params, state, x=x)
        if not nx.training():
            logits = jnp.where(y > 0, logits + self.poison, logits)
        return logits, state


class ValidateLines(QuietLogger):
    def __init__(self):
        self.lines = []

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        if context == "validate":
            self.lines.append((epoch, dict(metrics)))


def poison_epoch_2(nitro, epoch, observations):
    nitro.set_device(poison=float("nan") if epoch == 1 else 0.0)


@pytest.mark.parametrize(
    "n_devs", [1, pytest.param(4, marks=pytest.mark.needs_devices(4))]
)
def test_non_finite_outputs_under_a_finite_metric_warn_and_rank_no_checkpoint(
    tmp_path, n_devs
):
    """Epoch 2 validates on NaN logits: its accuracy (perfect) is kept as
    computed, but the pass warns, reports the count, and its record is unscored:
    Best(1) keeps the best clean epoch instead, on one device and on a mesh
    (sharded outputs)."""
    logger = ValidateLines()
    nitro = nx.Nitro(
        Poisoned(max_epochs=3),
        run_dir=str(tmp_path),
        logger=logger,
        checkpointer=nx.Checkpointer(keep=(nx.Best(1), nx.Last(1))),
        n_devs=n_devs,
    ).on_epoch_end(poison_epoch_2)
    with pytest.warns(nx.NitroWarning) as caught:
        nitro.train()
    messages = [str(w.message) for w in caught if "non-finite" in str(w.message)]
    # One NaN logit in each of 24 val rows, the short batch's padding not counted.
    assert messages == [
        "Split `val` produced 24 non-finite output values at epoch 2 (NaN or "
        "infinite in forward's outputs); its metrics are reported as computed, "
        "with `nonfinite_outputs` = 24, but the checkpointer keeps this epoch's "
        "record unscored (a Last selector may keep it; Best never picks it), and "
        "early stopping and Plateau count it as no improvement. Check the model "
        "for a diverged output."
    ]
    rows = list(nitro.history)
    assert [row.get("nonfinite_outputs") for row in rows] == [None, 24, None]
    assert rows[1]["acc"] == 1.0 and max(rows[0]["acc"], rows[2]["acc"]) < 1.0
    assert [(e, m.get("nonfinite_outputs"), m["acc"]) for e, m in logger.lines] == [
        (row["epoch"], row.get("nonfinite_outputs"), row["acc"]) for row in rows
    ]
    best = 1 if rows[0]["acc"] > rows[2]["acc"] else 3
    kept = [(e.epoch, e.score) for e in read_manifest(str(tmp_path))]
    assert kept == sorted({(best, rows[best - 1]["acc"]), (3, rows[2]["acc"])})


def test_non_finite_outputs_outside_training_warn_without_an_epoch():
    """evaluate() and validate() count every real row, across chunks (the 5-row
    first batch sets the width: 16s run as 5, 5, 5, 1), and a clean pass again
    reports no count and warns of nothing."""
    val = make_batches(37, 16, seed=1)[::-1]
    nitro = nx.Nitro(
        Poisoned(), data={"val": val, "test": make_batches(40, 16)}, **quiet()
    )
    nitro.set_device(poison=float("nan"))
    expected = r"^Split `test` produced 40 non-finite output values \(NaN"
    with pytest.warns(nx.NitroWarning, match=expected):
        tested = nitro.evaluate("test")
    assert tested["nonfinite_outputs"] == 40 and tested["acc"] == 1.0
    with pytest.warns(nx.NitroWarning, match=r"^Split `val` produced 37 non-fin"):
        assert nitro.validate()["nonfinite_outputs"] == 37
    nitro.set_device(poison=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clean = nitro.validate()
    assert "nonfinite_outputs" not in clean and set(clean) == {"acc", "confusion"}


def test_the_tally_counts_inexact_leaves_on_the_host_and_on_the_device():
    """Across processes the gathered outputs are host arrays; otherwise device
    ones. Integer leaves cannot hold NaN and are skipped; bfloat16 counts."""
    from jaxnitro.loop.nonfinite import OutputTally

    tally = OutputTally()
    tally.add(
        {
            "f": np.array([1.0, np.nan, -np.inf], np.float32),
            "h": np.array([np.inf, 0.0], jnp.bfloat16),
            "i": np.arange(3),
        }
    )
    tally.add((jnp.full((2, 2), np.nan, jnp.bfloat16), jnp.arange(4)))
    assert tally.total() == tally.total() == 2 + 1 + 4


def test_a_metric_named_like_the_non_finite_count_is_refused():
    class Reserved(TinyMetrics):
        def finalize_metrics(self, acc, split):
            return {"acc": acc["acc"], "nonfinite_outputs": 0}

    expected = r"^finalize_metrics returns `nonfinite_outputs`, the key evaluation"
    with pytest.raises(nx.HookError, match=expected):
        nx.Nitro(Reserved(), **quiet()).validate()


def test_an_empty_batch_mid_split_is_refused_with_its_index():
    val = make_batches(48, 16, seed=1)
    val[1] = {k: v[:0] for k, v in val[1].items()}
    nitro = nx.Nitro(
        Tiny(), data={"train": make_batches(32, 16), "val": val}, **quiet()
    )
    expected = r"^Batch 1 of split `val` holds 0 samples"
    with pytest.raises(nx.ConfigError, match=expected):
        nitro.validate()


def test_a_non_finite_monitored_metric_counts_as_no_improvement_for_stopping():
    """Early stopping and Plateau take a NaN epoch as one that did not improve,
    after evaluation warned of it, rather than stopping the run with an error."""
    stopper = nx.EarlyStopping(metric="acc", mode="max", patience=2)
    assert stopper.should_stop(1, {"acc": 0.5}) is False
    assert stopper.should_stop(2, {"acc": float("nan")}) is False
    assert stopper.should_stop(3, {"acc": float("inf")}) is True
    assert stopper.state()["best"] == 0.5
    nitro = nx.Nitro(
        NanAccuracy(max_epochs=3),
        early_stop=nx.EarlyStopping(patience=2),
        schedules={"learning_rate": nx.Plateau(0.05, patience=0)},
        **quiet(),
    )
    with pytest.warns(nx.NitroWarning, match="scored non-finite metrics"):
        nitro.train()
    assert nitro.stop_reason == "early_stop" and nitro.current_epoch == 2


def test_non_finite_outputs_count_as_no_improvement_for_stopping():
    """A finite metric of a pass with non-finite outputs never improves: early
    stopping waits on, Plateau counts a bad epoch, though the value (a perfect
    accuracy over NaN logits, in the run) beats the best."""
    stopper = nx.EarlyStopping(metric="acc", mode="max", patience=2)
    assert stopper.should_stop(1, {"acc": 0.5}) is False
    assert stopper.should_stop(2, {"acc": 0.9, "nonfinite_outputs": 72}) is False
    assert stopper.state()["best"] == 0.5 and stopper.wait == 1
    assert stopper.should_stop(3, {"acc": 0.95, "nonfinite_outputs": 1}) is True
    logger = ValidateLines()
    nitro = nx.Nitro(
        Poisoned(max_epochs=3),
        early_stop=nx.EarlyStopping(patience=1),
        schedules={"learning_rate": nx.Plateau(0.05, patience=0)},
        logger=logger,
        checkpointer=None,
    ).on_epoch_end(poison_epoch_2)
    with pytest.warns(nx.NitroWarning, match="non-finite output values at epoch 2"):
        nitro.train()
    assert nitro.stop_reason == "early_stop" and nitro.current_epoch == 2
    scales = [m["schedule/plateau/learning_rate"] for _, m in logger.lines]
    assert scales == [1.0, pytest.approx(0.1)]
