"""Step-based runs: max_steps, validation and checkpoints every N steps, and exact
resumes from a record written mid-epoch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from experiments import QuietLogger, StopsAtStep, Tiny, init_mlp, make_batches, mlp

import jaxnitro as nx


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


class Open(nx.Experiment):
    """Tiny's problem with max_epochs left at its default (4 steps an epoch)."""

    n_train: int = 64

    def build_data(self, dist):
        return {
            "train": make_batches(self.n_train, 16),
            "val": make_batches(24, 16, seed=1),
        }

    def build_model(self, rng):
        return None, init_mlp(rng, 16), {}

    def forward(self, model, params, state, *, x):
        return mlp(params, x), state

    def loss(self, logits, *, y):
        return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(logits), -1))

    def learning_rate(self, group=None):
        return 0.05


class Lines(QuietLogger):
    """Keeps each (context, step, epoch, metrics) the run logs."""

    def __init__(self):
        self.lines = []

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        self.lines.append((context, step, epoch, dict(metrics)))

    def steps(self, context):
        return [step for c, step, _, _ in self.lines if c == context]


class Saves(nx.Checkpointer):
    """A checkpointer that notes the (epoch, step) of every record it is given."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.saved = []

    def save(self, *, epoch, step, **kw):
        self.saved.append((epoch, step))
        return super().save(epoch=epoch, step=step, **kw)


def same_params(a, b):
    leaves = zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True)
    return all(np.array_equal(x, y) for x, y in leaves)


def test_max_steps_alone_trains_the_epochs_it_needs_and_ends_mid_epoch():
    nitro = nx.Nitro(Open(), max_steps=10, **quiet())
    assert nitro.config.max_epochs == 3
    assert nitro.config.sources["max_epochs"] == "max_steps"
    assert nitro.prepared.total_steps == 10
    nitro.train()
    assert (nitro.current_step, nitro.current_epoch) == (10, 3)
    assert nitro.stop_reason == "completed"
    # The part-epoch has its row: validated after step 10.
    assert [(r["epoch"], r["step"]) for r in nitro.history] == [(1, 4), (2, 8), (3, 10)]
    assert "loss" in nitro.history[-1]


@pytest.mark.parametrize(
    ("max_steps", "end"), [(5, (5, 2)), (20, (8, 2))], ids=["steps-first", "epochs"]
)
def test_with_max_epochs_whichever_comes_first_ends_the_run(max_steps, end):
    nitro = nx.Nitro(Tiny(max_epochs=2), max_steps=max_steps, **quiet())
    assert nitro.config.max_epochs == 2  # a field: it bounds the run
    assert nitro.prepared.total_steps == min(max_steps, 8)
    nitro.train()
    assert (nitro.current_step, nitro.current_epoch) == end
    assert nitro.stop_reason == "completed"
    assert nitro.history[-1]["step"] == end[0]


def test_reaching_max_steps_mid_epoch_checkpoints_and_a_longer_resume_is_exact(
    tmp_path,
):
    straight = nx.Nitro(Tiny(max_epochs=2), **quiet())
    straight.train()
    first = nx.Nitro(Tiny(max_epochs=2), run_dir=str(tmp_path), max_steps=6)
    first.train()
    assert (first.current_step, first.current_epoch) == (6, 2)
    last = nx.read_manifest(str(tmp_path))[-1]
    assert (last.epoch, last.step, last.stop_reason) == (2, 6, "completed")
    with pytest.warns(nx.NitroWarning, match="at step 6 and max_steps is 6"):
        first.train()
    again = nx.Nitro(
        Tiny(max_epochs=2), run_dir=str(tmp_path), resume="auto", max_steps=8
    )
    again.train()
    assert again.current_step == 8
    assert same_params(again.train_state, straight.train_state)
    assert again.history[-1]["train_loss"] == straight.history[-1]["train_loss"]


def test_val_every_n_steps_validates_mid_epoch_and_at_each_epoch_end():
    lines = Lines()
    nitro = nx.Nitro(
        Tiny(max_epochs=2), val_every_n_steps=3, logger=lines, checkpointer=None
    )
    nitro.train()
    # 4 steps an epoch: steps 3 and 6 mid-epoch, 4 and 8 at the epoch ends.
    assert lines.steps("validate") == [3, 4, 6, 8]
    assert [e for c, _, e, _ in lines.lines if c == "validate"] == [1, 1, 2, 2]
    assert len(nitro.history) == 2  # one row per epoch
    # The mid-epoch validation measured the weights of step 3, not the epoch's end.
    losses = [m["loss"] for c, _, _, m in lines.lines if c == "validate"]
    assert losses[0] != losses[1]


def test_early_stopping_patience_counts_validations_not_epochs():
    class Worse(Tiny):
        def learning_rate(self, group=None):
            return 30.0  # diverges slowly: the val loss stops improving

    lines = Lines()
    nitro = nx.Nitro(
        Worse(max_epochs=20, n_train=128),
        val_every_n_steps=2,
        early_stop=nx.EarlyStopping(patience=1),
        logger=lines,
        checkpointer=None,
        check_divergence=False,
    )
    nitro.train()
    assert nitro.stop_reason == "early_stop"
    validated = lines.steps("validate")
    assert validated == list(range(2, nitro.current_step + 1, 2))
    assert nitro.current_epoch <= 2  # it needed validations, not whole epochs


def test_checkpoint_every_n_steps_writes_records_at_those_steps(tmp_path):
    ckpt = Saves(keep=[nx.Last(20)])
    nx.Nitro(
        Tiny(max_epochs=2, n_train=128),
        run_dir=str(tmp_path),
        checkpoint_every_n_steps=3,
        checkpointer=ckpt,
        logger=None,
    ).train()
    # 8 steps an epoch: 3 and 6 mid-epoch 1, its end (8), 9, 12, 15 and 16.
    assert ckpt.saved == [(1, 3), (1, 6), (1, 8), (2, 9), (2, 12), (2, 15), (2, 16)]


@pytest.mark.parametrize(
    ("accum", "killed_at", "resumed_at", "total"),
    [(1, 11, (9, 2), 16), (2, 7, (6, 2), 8)],
    ids=["accum1", "accum2"],
)
def test_a_resume_from_a_mid_epoch_step_record_is_bitwise_exact(
    tmp_path, accum, killed_at, resumed_at, total
):
    recipe = {"max_epochs": 2, "n_train": 128}
    straight = nx.Nitro(Tiny(**recipe), accum=accum, **quiet())
    straight.train()

    class Killed(QuietLogger):
        def log_metrics(self, metrics, *, step, epoch, context, **kw):
            if context == "train" and step == killed_at:
                raise RuntimeError("killed")

    first = nx.Nitro(
        Tiny(**recipe),
        run_dir=str(tmp_path),
        accum=accum,
        checkpoint_every_n_steps=3,
        logger=Killed(),
        log_every_n_steps=1,
    )
    with pytest.raises(RuntimeError, match="killed"):
        first.train()
    again = nx.Nitro(
        Tiny(**recipe), run_dir=str(tmp_path), accum=accum, resume="auto", logger=None
    )
    # The newest record is the last step record, written partway into epoch 2.
    assert (again.current_step, again.current_epoch) == resumed_at
    again.train()
    assert again.current_step == total
    assert same_params(again.train_state, straight.train_state)
    assert again.history[-1]["train_loss"] == straight.history[-1]["train_loss"]


def test_the_schedules_horizon_is_max_steps():
    horizons = []

    def linear(total):
        horizons.append(total)
        return lambda t: 0.05 * (1 - t / total)

    lines = Lines()
    nitro = nx.Nitro(
        Open(),
        max_steps=6,
        schedules={"learning_rate": linear},
        logger=lines,
        checkpointer=None,
        log_every_n_steps=1,
    )
    nitro.train()
    assert horizons == [6]
    lrs = [
        value
        for c, _, _, m in lines.lines
        if c == "train"
        for key, value in m.items()
        if key.startswith("schedule/")
    ]
    # The last step (t = 5) runs the schedule's last value before its end.
    assert len(lrs) == 6 and lrs[-1] == pytest.approx(0.05 / 6)


@pytest.mark.parametrize("name", ["max_steps", "val_every_n_steps"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be >= 1, got 0"),
        (-3, "must be >= 1, got -3"),
        (2.5, "must be an int, got 2.5"),
        ("4", "must be an int, got '4'"),
        (True, "must be an int, got True"),
    ],
)
def test_bad_step_counts_are_refused_by_name(name, value, message):
    with pytest.raises(nx.ConfigError, match=f"{name} {message}"):
        nx.Nitro(Tiny(), **{name: value}, **quiet())


def test_checkpoint_every_n_steps_zero_is_refused():
    with pytest.raises(nx.ConfigError, match="checkpoint_every_n_steps must be >= 1"):
        nx.Nitro(Tiny(), checkpoint_every_n_steps=0, **quiet())


def test_val_every_n_steps_without_a_val_split_is_refused_at_setup():
    class NoVal(Tiny):
        def build_data(self, dist):
            return {"train": make_batches(64, 16)}

    with pytest.raises(nx.ConfigError, match="val_every_n_steps=2 needs a val split"):
        nx.Nitro(NoVal(), val_every_n_steps=2, **quiet())


def test_max_steps_is_an_accessor_of_the_experiment():
    class Budget(Open):
        max_steps: int = 5

    nitro = nx.Nitro(Budget(), **quiet())
    assert nitro.config.max_steps == 5 and nitro.config.sources["max_steps"] == "field"
    assert nitro.config.max_epochs == 2


def test_a_stop_at_a_validation_step_counts_that_validation_once(tmp_path):
    # A Plateau that cuts the rate at every validation it counts: the weights tell
    # how many were counted.
    schedules = {"learning_rate": nx.Plateau(0.05, patience=0, threshold=10.0)}
    recipe = {"max_epochs": 2, "n_train": 128}  # 8 steps an epoch
    straight = nx.Nitro(
        Tiny(**recipe), val_every_n_steps=3, schedules=schedules, **quiet()
    )
    straight.train()
    stopper = StopsAtStep(5)  # read back at step 6: the stop ends step 6
    first = nx.Nitro(
        Tiny(**recipe),
        run_dir=str(tmp_path),
        val_every_n_steps=3,
        schedules=schedules,
        logger=stopper,
        log_every_n_steps=1,
    )
    stopper.nitro = first
    first.train()
    assert (first.current_step, first.stop_reason) == (6, "requested")
    again = nx.Nitro(
        Tiny(**recipe),
        run_dir=str(tmp_path),
        val_every_n_steps=3,
        schedules=schedules,
        resume="auto",
        logger=None,
    )
    again.train()
    assert again.current_step == 16
    assert same_params(again.train_state, straight.train_state)


def test_the_progress_line_returns_to_the_train_stretch_after_a_mid_epoch_validation():
    seen = []
    previous = nx.progress_reporter(
        lambda verb, label, total, epoch, max_epochs: seen.append((verb, label))
    )
    try:
        nx.Nitro(Tiny(max_epochs=1), val_every_n_steps=2, **quiet()).train()
    finally:
        nx.progress_reporter(previous)
    stretches = [label for verb, label in seen if verb == "begin"]
    training = stretches[stretches.index("train") :]  # setup's stretches before
    assert training == ["train", "val", "train", "val"]
    # The train stretch resumes where it stood: 2 steps, then the last 2.
    steps = [label for verb, label in seen if verb == "step" and label == "train"]
    assert len(steps) == 2 + 4
