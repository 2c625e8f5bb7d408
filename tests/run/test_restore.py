"""weights= from a live handle or an average, restore_optimizer, restore_best."""

import jax
import numpy as np
import optax
import pytest
from experiments import QuietLogger, Tiny, init_mlp
from rich.console import Console

import jaxnitro as nx
from jaxnitro.checkpoint.sources import AverageSource


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def same(a, b):
    for x, y in zip(leaves(a), leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_weights_from_a_live_handle_is_a_warm_start(tmp_path):
    trained = nx.Nitro(Tiny(max_epochs=2), logger=None, checkpointer=None)
    trained.train()
    warm = nx.Nitro(Tiny(), weights=trained, logger=None, checkpointer=None)
    same(warm.parameters, trained.parameters)
    assert warm.current_step == 0 and warm.weights_from["epoch"] == 2
    current = nx.Nitro(
        Tiny(), weights=(trained, "current"), logger=None, checkpointer=None
    )
    same(current.parameters, trained.parameters)
    with pytest.raises(
        nx.CheckpointError, match=r"leaf \[.b1.\] is float32\[16\] there"
    ):
        nx.Nitro(Tiny(width=8), weights=trained, logger=None, checkpointer=None)


class KeyedState(Tiny):
    """Tiny whose state carries a typed PRNG key, as a dropout model's would."""

    def build_model(self, rng):
        return None, init_mlp(rng, self.width), {"rng": jax.random.key(7)}


def test_a_warm_start_takes_typed_prng_keys_in_the_state_over():
    trained = nx.Nitro(KeyedState(max_epochs=1), logger=None, checkpointer=None)
    trained.train()
    warm = nx.Nitro(KeyedState(), weights=trained, logger=None, checkpointer=None)
    key = warm.states["rng"]
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    assert jax.random.key_impl(key) == jax.random.key_impl(trained.states["rng"])
    np.testing.assert_array_equal(
        jax.random.key_data(key), jax.random.key_data(trained.states["rng"])
    )
    same(warm.parameters, trained.parameters)


def test_weights_from_an_average_of_a_runs_checkpoints(tmp_path):
    keep = nx.Checkpointer(keep=(nx.Best(1), nx.Last(3)))
    run = nx.Nitro(
        Tiny(max_epochs=3), run_dir=str(tmp_path), logger=None, checkpointer=keep
    )
    run.train()
    records = sorted(nx.read_manifest(str(tmp_path)), key=lambda e: e.epoch)
    assert [e.epoch for e in records] == [1, 2, 3]
    from jaxnitro.checkpoint.record import CheckpointRecord

    stored = [CheckpointRecord(str(tmp_path / e.file)) for e in records]
    expected = [
        np.mean([r.arrays[k] for r in stored], axis=0, dtype=np.float64).astype(
            np.float32
        )
        for k in sorted(k for k in stored[0].arrays if k.startswith("params/"))
    ]
    averaged = nx.Nitro(
        Tiny(),
        run_dir=str(tmp_path),
        weights=("latest", nx.Average(nx.Last(3))),
        logger=None,
        checkpointer=None,
    )
    got = [
        np.asarray(leaf)
        for _, leaf in sorted(
            (jax.tree_util.keystr(p), v)
            for p, v in jax.tree_util.tree_flatten_with_path(averaged.parameters)[0]
        )
    ]
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_weights_from_an_average_record_what_they_average(tmp_path):
    keep = nx.Checkpointer(keep=(nx.Best(1), nx.Last(2)))
    nx.Nitro(
        Tiny(max_epochs=2), run_dir=str(tmp_path), logger=None, checkpointer=keep
    ).train()
    averaged = nx.Nitro(
        Tiny(max_epochs=1),
        run_dir=str(tmp_path),
        weights=("latest", nx.Average(nx.Last(2))),
        logger=None,
    )
    origin = averaged.averaged_from
    assert origin["epochs"] == [1, 2] and origin["weights"] == [0.5, 0.5]
    assert averaged.checkpoint_source is None
    averaged.train()
    mine = [
        e for e in nx.read_manifest(str(tmp_path)) if e.run == averaged.checkpoint_run
    ]
    assert nx.checkpoint_info(str(tmp_path / mine[0].file))["averaged_from"] == origin
    plain = nx.Nitro(Tiny(), weights=str(tmp_path / mine[0].file), logger=None)
    assert plain.averaged_from is None  # a record of that run is not an average


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"restore_optimizer": True}, "restore_optimizer=True restores the optimizer"),
        (
            {"restore_optimizer": True, "resume": "auto"},
            "goes with weights=, not resume=",
        ),
    ],
)
def test_restore_optimizer_refusals(tmp_path, kw, message):
    with pytest.raises(nx.ConfigError, match=message):
        nx.Nitro(Tiny(), run_dir=str(tmp_path), logger=None, **kw)


def restoring_optimizer(tmp_path, cls, **kw):
    """A handle on `cls` taking the optimizer state of one epoch of Tiny."""
    nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None).train()
    path = str(tmp_path / nx.read_manifest(str(tmp_path))[0].file)
    return nx.Nitro(
        cls(max_epochs=1),
        weights=path,
        restore_optimizer=True,
        logger=None,
        checkpointer=None,
        **kw,
    )


@pytest.mark.parametrize(
    "kw",
    [{}, {"ema": nx.EMA(0.9)}, {"gradient_clip_norm": 1.0}],
    ids=["same", "added-ema", "added-clip"],
)
def test_restore_optimizer_takes_the_records_state_and_starts_fresh(tmp_path, kw):
    """Also across an added EMA or clipping, which do not shape the state."""
    tuned = restoring_optimizer(tmp_path, Tiny, **kw)
    tuned.train()
    assert tuned.current_step == 4  # a new run: step and epoch start fresh
    counts = [int(x) for x in leaves(tuned.train_state.opt_state) if np.ndim(x) == 0]
    assert 8 in counts  # RAdam's count went on from the record's 4 steps


class Sgd(Tiny):
    def optimizer(self):
        return optax.sgd


class Decayed(Tiny):
    def weight_decay(self, group=None):
        return 0.01


class TwoGroups(Tiny):
    def param_group(self, keypath):
        return "head" if keypath[0] == "w2" else "default"


@pytest.mark.parametrize(
    "cls, message",
    [
        (
            Sgd,
            r"rule of group 'default': 'optax.*radam \(level 0, code \w+\)' in "
            r"the record, 'optax.*sgd \(level 1, code \w+\)' in this run",
        ),
        (Decayed, "decay in group 'default': False in the record, True in this run"),
        (
            TwoGroups,
            r"group of params\['w2'\]: 'default' in the record, 'head' in "
            r"this run",
        ),
    ],
    ids=["rule", "decay", "groups"],
)
def test_restore_optimizer_refuses_another_rule_or_group_layout_naming_it(
    tmp_path, cls, message
):
    other = restoring_optimizer(tmp_path, cls)
    with pytest.raises(nx.CheckpointError, match=message):
        other.train()


def test_restore_best_ends_training_holding_the_best_checkpoint(tmp_path):
    nitro = nx.Nitro(
        Tiny(max_epochs=4), run_dir=str(tmp_path), logger=None, restore_best=True
    )
    nitro.train()
    best_epoch = min(nitro.history, key=lambda row: row["loss"])["epoch"]
    best = [e for e in nx.read_manifest(str(tmp_path)) if e.epoch == best_epoch][0]
    assert nitro.checkpoint_source == str(tmp_path / best.file)
    # show says the handle holds it: repr, and the rich table on a terminal
    assert f"holding the best checkpoint {best.file} in run_dir" in repr(nitro)
    console = Console(width=100, record=True, color_system=None)
    console.print(nitro)
    assert "holding the best checkpoint" in " ".join(console.export_text().split())
    assert nitro.validate()["loss"] == pytest.approx(
        nitro.history[best_epoch]["loss"], rel=1e-6
    )
    assert nitro.current_epoch == 4  # the position stays where training ended
    with pytest.raises(nx.ConfigError, match="will not train further"):
        nitro.train()


def test_restore_best_refusals_and_warnings(tmp_path):
    with pytest.raises(nx.ConfigError, match="checkpointing is off"):
        nx.Nitro(Tiny(), restore_best=True, logger=None, checkpointer=None)
    never_ranks = nx.Checkpointer(keep=nx.Last(1))
    with pytest.raises(nx.ConfigError, match="never ranks one"):
        nx.Nitro(Tiny(), restore_best=True, logger=None, checkpointer=never_ranks)
    keep = nx.Checkpointer(keep=(nx.Best(1), nx.Last(1)))
    with pytest.raises(nx.ConfigError, match="does not keep"):
        nx.Nitro(
            Tiny(), restore_best=nx.Average(nx.Last(5)), logger=None, checkpointer=keep
        )


def test_restore_optimizer_needs_a_train_split(tmp_path):
    first = nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None)
    first.train()
    path = str(tmp_path / nx.read_manifest(str(tmp_path))[0].file)
    with pytest.raises(nx.ConfigError, match="no optimizer to restore into"):
        nx.Nitro(Tiny(), weights=path, restore_optimizer=True, data={}, logger=None)


def test_restore_best_without_a_scored_checkpoint_warns_and_keeps_the_final_weights(
    tmp_path,
):
    class NoVal(Tiny):
        def build_data(self, dist):
            return {"train": Tiny.build_data(self, dist)["train"]}

    def run(run_dir, **kw):
        return nx.Nitro(
            NoVal(max_epochs=1),
            run_dir=str(run_dir),
            logger=None,
            checkpointer=nx.Checkpointer(keep=(nx.Best(1), nx.Last(1))),
            seed=42,
            **kw,
        )

    nitro = run(tmp_path / "restore", restore_best=True)
    with pytest.warns(nx.NitroWarning, match="no scored checkpoint; keeping the final"):
        nitro.train()
    assert nitro.checkpoint_source is None
    twin = run(tmp_path / "twin")  # the same run without restore_best
    twin.train()
    same(nitro.parameters, twin.parameters)


class Finished(QuietLogger):
    def __init__(self):
        self.status = None

    def finish(self, status):
        self.status = status


def test_restore_best_average_holds_the_average_or_warns_when_the_run_is_short(
    tmp_path,
):
    def run(run_dir, epochs):
        return nx.Nitro(
            Tiny(max_epochs=epochs),
            run_dir=str(run_dir),
            logger=None,
            checkpointer=nx.Checkpointer(keep=(nx.Best(1), nx.Last(3))),
            restore_best=nx.Average(nx.Last(3)),
        )

    full = run(tmp_path / "full", 3)
    full.train()
    assert full.averaged_from["epochs"] == [1, 2, 3]
    assert full.checkpoint_source is None
    assert "holding the average of epochs 1, 2, 3 (restore_best)" in repr(full)
    short = run(tmp_path / "short", 2)
    with pytest.warns(nx.NitroWarning, match="wants 3 checkpoints but the run holds 2"):
        short.train()
    assert short.averaged_from is None


def test_restore_best_that_cannot_load_warns_and_keeps_the_final_weights(
    tmp_path, monkeypatch
):
    def damaged(self):
        raise nx.CheckpointError("epoch-0002.safetensors is damaged")

    monkeypatch.setattr(AverageSource, "load", damaged)
    logger = Finished()
    nitro = nx.Nitro(
        Tiny(max_epochs=2),
        run_dir=str(tmp_path),
        logger=logger,
        checkpointer=nx.Checkpointer(keep=(nx.Best(1), nx.Last(2))),
        restore_best=nx.Average(nx.Last(2)),
    )
    with pytest.warns(
        nx.NitroWarning,
        match="restore_best: epoch-0002.safetensors is damaged; keeping the final",
    ):
        nitro.train()
    assert logger.status == "completed" and isinstance(nitro.phase, nx.Done)
    assert nitro.averaged_from is None and nitro.checkpoint_source is None


def test_weights_with_other_graphconst_values_warn_with_the_diff(tmp_path):
    nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None).train()
    path = str(tmp_path / nx.read_manifest(str(tmp_path))[0].file)

    class Renamed(Tiny):
        variant: nx.GraphConst[str] = "b"

    with pytest.warns(nx.NitroWarning, match="variant: None in the record, 'b' now"):
        nx.Nitro(Renamed(), weights=path, logger=None, checkpointer=None)
