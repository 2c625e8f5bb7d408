"""steps_per_call: several optimizer steps per dispatch, bitwise the steps of k=1.

Every comparison here is exact (`assert_array_equal`, `==` on JSON lines): on CPU a
scanned call computes the same parameters, optimizer state, EMA and logged values as
one program per step.
"""

import json
import time

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from experiments import QuietLogger, StopsAtStep, Tiny, make_batches, samples
from handle_parts import parts_of
from jax.sharding import PartitionSpec as P

import jaxnitro as nx
import jaxnitro.loop.calls as calls
from jaxnitro.loop import step_programs
from jaxnitro.loop.call_count import steps_per_call
from jaxnitro.loop.calls import call_length
from jaxnitro.loop.step_programs import call_inputs
from jaxnitro.run.training import epoch_context


class Everything(Tiny):
    """Tiny with dropout keyed by step_rng, a loss term drawn from it, device
    train_metrics, SAM, an EMA and clipping: every per-step input a call stacks."""

    n_train: int = 16 * 10

    def forward(self, model, params, state, *, x):
        hidden = jax.nn.relu(x @ params["w1"] + params["b1"][None, :])
        if nx.training():
            keep = jax.random.bernoulli(nx.step_rng(), 0.75, hidden.shape)
            hidden = jnp.where(keep, hidden / 0.75, 0.0)
        return hidden @ params["w2"] / self.temperature, state

    def loss(self, logits, *, y):
        draw = jax.random.uniform(nx.step_rng())
        return super().loss(logits, y=y), {"u": draw}

    def train_metrics(self, logits, *, y):
        return {"acc": jnp.mean(logits.argmax(-1) == y.argmax(-1))}

    def grad_rule(self):
        return nx.SAM(0.05)


def schedules(total):
    return {
        "learning_rate": optax.warmup_cosine_decay_schedule(0.0, 0.05, 3, total),
        "smoothing": optax.linear_schedule(0.0, 0.2, total),
    }


def lines(run_dir, context):
    rows = []
    for text in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(text)
        if row.get("context") == context:
            rows.append({k: v for k, v in row.items() if k != "run_id"})
    return rows


def train(tmp_path, name, experiment, **kw):
    run_dir = tmp_path / name
    nitro = nx.Nitro(
        experiment,
        run_dir=str(run_dir),
        checkpointer=None,
        log_every_n_steps=1,
        **kw,
    )
    nitro.train()
    return nitro, run_dir


def assert_same_state(a, b):
    for x, y in zip(
        jax.tree.leaves(a.train_state.weights),
        jax.tree.leaves(b.train_state.weights),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("accum", [1, 2])
def test_every_per_step_input_trains_bitwise_as_one_step_per_call(
    tmp_path, monkeypatch, accum, packed
):
    """Packed around each step (a small state on a CPU, `compile/packed.py`) and
    passed as it is (a larger one): each the same bits at every steps_per_call."""
    if not packed:
        monkeypatch.setattr(calls, "pack_rule", lambda: None)
    steps = 2 * 10 // accum  # two epochs; 10 (or 5) steps each: k=3, 4 leave tails
    kw = {
        "accum": accum,
        "gradient_clip_norm": 0.5,
        "ema": nx.EMA(0.9),
        "schedules": schedules(steps),
    }
    base, base_dir = train(tmp_path, "k1", Everything(), steps_per_call=1, **kw)
    for k in (3, 4):
        got, run_dir = train(tmp_path, f"k{k}", Everything(), steps_per_call=k, **kw)
        assert got.current_step == steps
        assert_same_state(base, got)
        train_lines = lines(run_dir, "train")
        assert len(train_lines) == steps
        assert train_lines == lines(base_dir, "train")  # loss, loss/u, acc, schedules
        # each epoch's summary: its mean loss and the mean of its steps' acc,
        # summed from the calls' stacked outputs (a tail call's unused rows left
        # out) as the unscanned loop sums its steps'
        summary = lines(run_dir, "train_epoch")
        assert [(x["step"], sorted(x)) for x in summary] == [
            (n, ["acc", "context", "epoch", "loss", "step", "type"])
            for n in (steps // 2, steps)
        ]
        assert summary == lines(base_dir, "train_epoch")
        half = steps // 2
        for x, first in zip(summary, (0, half), strict=True):
            accs = [y["acc"] for y in train_lines[first : first + half]]
            assert x["acc"] == pytest.approx(np.mean(accs), rel=1e-6)
            assert x["acc"] != pytest.approx(accs[-1], rel=1e-6)
        assert lines(run_dir, "validate") == lines(base_dir, "validate")
        assert [r["train_loss"] for r in got.history] == [
            r["train_loss"] for r in base.history
        ]


class Linear(nx.Experiment):
    """docs/guides/performance.md's example: a linear model under the default
    optimizer, where a one-step program fused with the packing (or a loop over a
    block of one position) rounded an update differently in the last bit."""

    max_epochs: int = 2

    def build_data(self, dist):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(256, 4)).astype(np.float32)
        y = x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32)
        return {"train": nx.ArraySource({"x": x, "y": y}, batch_size=32)}

    def build_model(self, rng):
        return None, {"w": jnp.zeros(4)}, {}

    def forward(self, model, params, state, *, x):
        return x @ params["w"], state

    def loss(self, pred, *, y):
        return jnp.mean((pred - y) ** 2)

    def learning_rate(self, group=None):
        return 0.1


@pytest.mark.parametrize("packed", [True, False])
def test_a_linear_model_trains_bitwise_at_every_steps_per_call(
    tmp_path, monkeypatch, packed
):
    if not packed:
        monkeypatch.setattr(calls, "pack_rule", lambda: None)
    runs = {}
    for k in (1, 2, 3, 8):
        nitro = nx.Nitro(
            Linear(),
            run_dir=str(tmp_path / f"k{k}"),
            checkpointer=None,
            logger=None,
            steps_per_call=k,
        )
        nitro.train()
        assert nitro.current_step == 16
        runs[k] = nitro
    for k in (2, 3, 8):
        assert_same_state(runs[1], runs[k])


@pytest.mark.parametrize("accum", [1, 2])
def test_a_short_block_travels_without_its_padding(tmp_path, monkeypatch, accum):
    """On an accelerator a block cut short by the epoch's end is sent as its own
    batches and padded on the device (no call reads the padding): the same
    training, bit for bit. (The loop sends its blocks, but the second epoch's
    first, which the first epoch read ahead: `loop/read_ahead.py`.)"""
    import jaxnitro.loop.assembly as assembly
    import jaxnitro.loop.feed as feed

    # Two epochs of 10 steps (blocks of 8, then 2) or of 5 (one block of 5: a
    # block never holds more steps than the epoch).
    steps = 2 * 10 // accum
    kw = {"accum": accum, "schedules": schedules(steps)}
    base, _ = train(tmp_path, "k1", Everything(), steps_per_call=1, **kw)
    monkeypatch.setattr(feed, "stages_on_device", lambda: True)
    sent = []

    def spy(arrays, sharding=None, **kw):
        placed = transfer(arrays, sharding, **kw)
        sent.append(
            (kw.get("rows"), {a.shape[0] for a in arrays.values()}, placed["x"].shape)
        )
        return placed

    transfer = calls.transfer
    monkeypatch.setattr(calls, "transfer", spy)
    monkeypatch.setattr(assembly, "transfer", spy)
    got, _ = train(tmp_path, "k4", Everything(), steps_per_call=4, **kw)
    assert_same_state(base, got)
    x = (16, 8) if accum == 1 else (2, 16, 8)
    per_epoch = (
        [(8, {8}, (8, *x)), (8, {2}, (8, *x))] if accum == 1 else [(5, {5}, (5, *x))]
    )
    assert sent == 2 * per_epoch


def test_a_stop_lands_on_a_call_boundary_and_the_resume_is_exact(tmp_path):
    straight, _ = train(tmp_path, "straight", Tiny(n_train=16 * 7), steps_per_call=1)
    stopper = StopsAtStep(2)  # read back while the call of steps 4-6 runs
    first = nx.Nitro(
        Tiny(n_train=16 * 7),
        run_dir=str(tmp_path / "stopped"),
        logger=stopper,
        log_every_n_steps=1,
        steps_per_call=3,
    )
    stopper.nitro = first
    first.train()
    assert (first.current_epoch, first.current_step) == (1, 6)
    assert first.stop_reason == "requested"
    for k in (3, 1):  # the rest of epoch 1 (one step), then epoch 2 in calls
        again = nx.Nitro(
            Tiny(n_train=16 * 7),
            run_dir=str(tmp_path / "stopped"),
            logger=None,
            resume="auto",
            steps_per_call=k,
        )
        assert again.current_step == 6
        again.train()
        assert again.current_step == 14
        assert_same_state(straight, again)
        assert again.history[-1]["train_loss"] == straight.history[-1]["train_loss"]
        if k == 3:
            break


def test_events_fall_at_their_exact_steps(tmp_path):
    kw = {"val_every_n_steps": 4, "checkpoint_every_n_steps": 5, "max_steps": 13}
    base = nx.Nitro(
        Tiny(n_train=16 * 7), run_dir=str(tmp_path / "k1"), log_every_n_steps=1, **kw
    )
    base.train()
    got = nx.Nitro(
        Tiny(n_train=16 * 7),
        run_dir=str(tmp_path / "k4"),
        log_every_n_steps=1,
        steps_per_call=4,
        **kw,
    )
    got.train()
    assert got.current_step == 13
    assert_same_state(base, got)
    validated = [r["step"] for r in lines(tmp_path / "k4", "validate")]
    assert validated == [r["step"] for r in lines(tmp_path / "k1", "validate")]
    assert validated == [4, 7, 8, 12, 13]  # every 4, and each epoch's end (7, 13)
    assert lines(tmp_path / "k4", "train") == lines(tmp_path / "k1", "train")
    steps = sorted(e.step for e in got.checkpointer.entries())
    assert steps == sorted(e.step for e in base.checkpointer.entries())
    # Calls of 4, cut to 3, 2 and 1 at events and epoch ends: one program serves
    # every length.
    kinds = [kind for kind, _ in got.executables.compiled()]
    assert kinds.count("train_step") == 1


def test_early_stopping_and_plateau_decide_at_the_same_steps(tmp_path):
    kw = {
        "max_epochs": 4,
        "val_every_n_steps": 3,
        "early_stop": nx.EarlyStopping(patience=2, min_delta=10.0),
        "schedules": {"learning_rate": nx.Plateau(0.05, patience=1, factor=0.5)},
    }
    base = nx.Nitro(Tiny(n_train=16 * 7), run_dir=str(tmp_path / "k1"), **kw)
    base.train()
    got = nx.Nitro(
        Tiny(n_train=16 * 7), run_dir=str(tmp_path / "k4"), steps_per_call=4, **kw
    )
    got.train()
    assert got.stop_reason == base.stop_reason == "early_stop"
    # Validations at 3, 6 and 7 (the epoch end): two without a gain of 10 stop it.
    assert got.current_step == base.current_step == 7
    assert_same_state(base, got)
    assert lines(tmp_path / "k4", "validate") == lines(tmp_path / "k1", "validate")


@pytest.mark.parametrize("logged", [False, True], ids=["no-logger", "logged"])
@pytest.mark.parametrize("per_call", [4, 1])
def test_a_divergence_names_its_own_step_inside_a_call(tmp_path, per_call, logged):
    # At one step a call the losses of the calls between two reads are settled
    # together; a non-finite one among them is then settled call by call. Logged
    # every 3 steps, step 5 diverges in the call of steps 5-8 whose step 6 is
    # logged: the steps before the logged one, settled together, refuse the value
    # and settle one by one, which names step 5; step 3's line is written.
    batches = make_batches(16 * 7, 16)
    batches[4] = {**batches[4], "x": np.full_like(batches[4]["x"], np.nan)}

    class Poisoned(Tiny):
        def build_data(self, dist):
            return {"train": batches}

    kw = {"run_dir": str(tmp_path), "log_every_n_steps": 3} if logged else {}
    if not logged:
        kw["logger"] = None
    nitro = nx.Nitro(Poisoned(), checkpointer=None, steps_per_call=per_call, **kw)
    with pytest.raises(
        nx.DivergenceError, match=r"at step 5 of epoch 1 \(batch 4 .*already non-finite"
    ):
        nitro.train()
    if logged:
        assert [line["step"] for line in lines(tmp_path, "train")] == [3]


@pytest.mark.parametrize("accum", [1, 2])
def test_a_train_line_inside_a_call_is_the_line_of_one_step_a_call(tmp_path, accum):
    # A call of 4 steps carrying only losses, with a logged step among them: its
    # other steps settle together, the logged one alone (loop/settling.py). The
    # lines and the epochs' means are bitwise those of one step a call.
    got = {}
    for per_call in (1, 4):
        run_dir = tmp_path / f"k{per_call}"
        nitro = nx.Nitro(
            Tiny(n_train=16 * 14, max_epochs=2),
            run_dir=str(run_dir),
            checkpointer=None,
            log_every_n_steps=3,
            accum=accum,
            steps_per_call=per_call,
        )
        nitro.train()
        got[per_call] = (
            lines(run_dir, "train"),
            [row["train_loss"] for row in nitro.history],
        )
    train_lines, means = got[4]
    steps = 2 * 14 // accum
    assert [line["step"] for line in train_lines] == list(range(3, steps + 1, 3))
    assert got[4] == got[1]
    assert all(np.isfinite(means))


@pytest.mark.parametrize(
    ("change", "first", "changed"),
    [("shape", 5, [5]), ("dtype", 5, [5]), ("dtype", 4, [4, 5, 6])],
)
def test_a_batch_that_changes_a_field_mid_call_is_refused_by_name(
    change, first, changed
):
    # The epoch's 7 batches make one block of 8 steps, stacked before any call runs:
    # [4, 5, 6] stack alike (int32) and the program refuses the block.
    batches = make_batches(16 * 7, 16)
    for i in changed:
        x = batches[i]["x"]
        batches[i] = {
            **batches[i],
            "x": x[:, :4] if change == "shape" else x.astype(np.int32),
        }

    class Changing(Tiny):
        def build_data(self, dist):
            return {"train": batches}

    nitro = nx.Nitro(Changing(), logger=None, checkpointer=None, steps_per_call=4)
    with pytest.raises(
        nx.ConfigError, match=f"Batch {first} of split `train` .*changes the {change}"
    ):
        nitro.train()
    assert nitro.current_step == 0  # refused before any call of its block ran


def test_host_train_metrics_see_each_micro_batch(tmp_path):
    class HostMetrics(Tiny):
        def train_metrics(self, logits, *, y):
            return {"acc": float(np.mean(logits.argmax(-1) == y.argmax(-1)))}

        def metrics_residency(self, hook):
            return "host"

    base, base_dir = train(tmp_path, "k1", HostMetrics(n_train=96), accum=2)
    got, run_dir = train(
        tmp_path, "k2", HostMetrics(n_train=96), accum=2, steps_per_call=2
    )
    assert lines(run_dir, "train") == lines(base_dir, "train")
    assert_same_state(base, got)


class Streamed(Tiny):
    """Tiny through the prefetch stream's fan-out (workers build the batches)."""

    def build_data(self, dist):
        train = grain.MapDataset.source(samples(16 * 7)).shuffle(seed=3).batch(16)
        return {"train": nx.data.PrefetchIterator(train, workers=2)}


def test_the_prefetch_stream_feeds_calls_as_it_feeds_steps():
    base = nx.Nitro(Streamed(), logger=None, checkpointer=None)
    base.train()
    got = nx.Nitro(Streamed(), logger=None, checkpointer=None, steps_per_call=3)
    got.train()
    assert got.current_step == base.current_step == 14
    assert_same_state(base, got)


def test_the_binding_report_shows_steps_per_call_with_its_source():
    nitro = nx.Nitro(Tiny(), logger=None, checkpointer=None, steps_per_call=8)
    assert "steps_per_call 8 (keyword)" in nitro.binding_report()
    assert nitro.config.steps_per_call == 8


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "steps_per_call must be >= 1, got 0"),
        ("fast", "steps_per_call must be a whole number >= 1 or \"auto\", got 'fast'"),
        (2.0, 'steps_per_call must be a whole number >= 1 or "auto", got 2.0'),
    ],
)
def test_a_bad_steps_per_call_is_refused_at_construction(value, message):
    with pytest.raises(nx.ConfigError, match=message):
        nx.Nitro(Tiny(), logger=None, checkpointer=None, steps_per_call=value)


@pytest.mark.needs_devices(2)
@pytest.mark.parametrize(("accum", "sharding"), [(1, "replicated"), (2, "fsdp")])
def test_on_a_mesh_several_steps_per_call_train_bitwise_as_one(
    tmp_path, accum, sharding
):
    """The calls loop on a mesh: blocks split along their batch axis, the state laid
    out as the run says, every per-step input as on one device."""
    steps = 2 * 10 // accum
    kw = {
        "accum": accum,
        "n_devs": 2,
        "sharding": sharding,
        "gradient_clip_norm": 0.5,
        "ema": nx.EMA(0.9),
        "schedules": schedules(steps),
    }
    base, base_dir = train(tmp_path, "k1", Everything(), steps_per_call=1, **kw)
    got, run_dir = train(tmp_path, "k4", Everything(), steps_per_call=4, **kw)
    assert got.current_step == steps
    assert_same_state(base, got)
    assert lines(run_dir, "train") == lines(base_dir, "train")
    assert lines(run_dir, "validate") == lines(base_dir, "validate")
    block = 1 if accum == 1 else 2  # the block's batch axis, past (K,) or (K, accum)
    (kind, program), *_ = got.executables.compiled()
    specs = {s.spec for s in jax.tree.leaves(program.compiled.input_shardings[0][5])}
    assert kind == "train_step" and specs == {P(*[None] * block, "data")}


@pytest.mark.parametrize(
    ("left", "until", "expected"), [(60, 100, 8), (4, 100, 4), (7, 3, 3), (9, 1, 1)]
)
def test_a_call_is_cut_at_the_block_end_or_an_event(left, until, expected):
    assert call_length(8, left, until) == expected


def test_auto_picks_the_steps_per_call_from_the_measured_step_time():
    nitro = nx.Nitro(Tiny(), logger=None, checkpointer=None, steps_per_call="auto")
    assert "steps_per_call auto (keyword)" in nitro.binding_report()
    assert epoch_context(parts_of(nitro)).steps_per_call == 1  # nothing measured
    picked = {s: steps_per_call("auto", s) for s in (10e-3, 3e-3, 1e-3, 450e-6, 1e-4)}
    assert picked == {10e-3: 1, 3e-3: 2, 1e-3: 8, 450e-6: 16, 1e-4: 16}
    # An epoch keeps at least two calls, the second block's copy overlapping the
    # first call: a 12-step epoch runs calls of 8 and 4, not one of 12.
    short = {n: steps_per_call("auto", 1e-4, n) for n in (64, 17, 16, 12, 9, 3, 2, 1)}
    assert short == {64: 16, 17: 16, 16: 8, 12: 8, 9: 8, 3: 2, 2: 1, 1: 1}
    nitro.status.auto_steps_per_call = 8  # chosen: every later epoch keeps it
    assert epoch_context(parts_of(nitro)).steps_per_call == 8


def test_auto_times_the_steps_after_the_first_call_and_chooses_once(
    tmp_path, monkeypatch
):
    """The first call of a handle's first epoch compiles its program (width 29: no
    other test compiled it): "auto" chooses from the steps after it, once."""
    import jaxnitro.loop.call_count as call_count

    asked = []

    def spy(setting, seconds, epoch_steps=None):
        asked.append((setting, seconds, epoch_steps))
        return steps_per_call(setting, seconds, epoch_steps)

    monkeypatch.setattr(call_count, "steps_per_call", spy)
    nitro, _ = train(
        tmp_path,
        "auto",
        Tiny(n_train=16 * 7, max_epochs=3, width=29),
        steps_per_call="auto",
    )
    measured = [(s, n) for setting, s, n in asked if s is not None]
    assert len(measured) == 1  # chosen after the first epoch, then kept
    ((seconds, epoch_steps),) = measured
    first = nitro.history[1]["seconds"] / 7  # epoch 1: its compile included
    assert 0 < seconds < first / 2
    assert epoch_steps == 7  # the epoch's steps, so that it keeps two calls
    chosen = nitro.status.auto_steps_per_call
    assert chosen == steps_per_call("auto", seconds, 7) and chosen < 7


class CompilesAtOneLine(QuietLogger):
    """At one train line, compiles a program whose trace takes `seconds`: the
    first epoch of a process, where the small programs the loop meets first
    compile (on a TPU 60-800 ms each)."""

    def __init__(self, step, seconds):
        self.step, self.seconds = step, seconds

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        if context == "train" and step == self.step:

            def slow_to_trace(x):
                time.sleep(self.seconds)
                return x + 1

            jax.jit(slow_to_trace)(jnp.zeros(3)).block_until_ready()


def test_auto_leaves_the_compiles_inside_its_timed_steps_out(tmp_path, monkeypatch):
    """A compile in the first epoch's timed steps is not the loop's step time:
    with it counted, a 0.6 s trace over 7 steps read as 86 ms a step, and "auto"
    chose one step a call where the steps themselves fit several."""
    import jaxnitro.loop.call_count as call_count

    asked = []

    def spy(setting, seconds, epoch_steps=None):
        asked.append(seconds)
        return steps_per_call(setting, seconds, epoch_steps)

    monkeypatch.setattr(call_count, "steps_per_call", spy)
    nitro, _ = train(
        tmp_path,
        "auto",
        Tiny(n_train=16 * 8, max_epochs=1, width=43),  # compiled by no other test
        steps_per_call="auto",
        logger=CompilesAtOneLine(step=4, seconds=0.6),
    )
    (seconds,) = [s for s in asked if s is not None]
    assert 0 < seconds < 0.6 / 7 / 4  # the trace's 86 ms a step left out
    assert nitro.status.auto_steps_per_call == steps_per_call("auto", seconds, 8)


def test_an_equal_experiment_takes_the_count_auto_chose_and_compiles_nothing(
    tmp_path, monkeypatch
):
    """A second handle of the same experiment in the process runs the same train
    program: it takes the count chosen for it, though its own first epoch timed
    differently (here: as if on the other side of a power of two)."""
    import jaxnitro.loop.call_count as call_count

    counts = iter([4, 2])
    monkeypatch.setattr(call_count, "steps_per_call", lambda *asked: next(counts))

    def auto(name):
        exp = Tiny(n_train=16 * 8, max_epochs=3, width=31)  # compiled by no other
        return train(tmp_path, name, exp, steps_per_call="auto")[0]

    first = auto("first")
    assert first.status.auto_steps_per_call == 4
    before = nx.cache_stats()
    second = auto("second")
    assert second.status.auto_steps_per_call == 4
    assert nx.cache_stats()["misses"] == before["misses"]
    assert_same_state(first, second)


def test_a_later_handle_of_the_family_runs_the_count_from_its_first_epoch(
    tmp_path, monkeypatch
):
    """A sweep's next trial (an equal experiment, other Device values) runs the
    count "auto" chose for the first from its first epoch: one train program, the
    one the first handle compiled for its later epochs; an epoch of another length
    is another family, timed afresh."""
    import jaxnitro.loop.call_count as call_count

    # Whatever this machine's step time (staged on a CPU it can pick 1): 4.
    monkeypatch.setattr(call_count, "steps_per_call", lambda *asked: 4)

    def auto(name, n_train, temperature):  # width 41: a family no other test trained
        exp = Tiny(n_train=n_train, max_epochs=2, width=41, temperature=temperature)
        return train(tmp_path, name, exp, steps_per_call="auto")[0]

    def train_programs(nitro):
        return [k for k, _ in nitro.executables.compiled()].count("train_step")

    first = auto("first", 16 * 9, 1.0)
    chosen = first.status.auto_steps_per_call
    assert chosen == 4
    # One step a call, then the chosen count; one program where a CPU packs the
    # state around each step (one-step calls run the loop's program then, over
    # the same blocks of 8 small batches).
    rule = calls.pack_rule()
    programs = 1 if rule is not None and rule.each_step else 2
    assert train_programs(first) == programs
    misses = nx.cache_stats()["misses"]
    trial = auto("trial", 16 * 9, 2.0)
    assert trial.status.auto_steps_per_call == chosen
    assert train_programs(trial) == 1
    assert nx.cache_stats()["misses"] == misses  # its one program was compiled
    other = auto("other", 16 * 5, 1.0)  # 5 steps an epoch: not the same family
    assert train_programs(other) == programs


def test_auto_trains_its_first_epoch_step_by_step_then_in_calls_bitwise(tmp_path):
    base, base_dir = train(tmp_path, "k1", Tiny(n_train=16 * 7, max_epochs=3))
    got, run_dir = train(
        tmp_path, "auto", Tiny(n_train=16 * 7, max_epochs=3), steps_per_call="auto"
    )
    # A CPU step < 8 ms: several steps a call after the first epoch; a block longer
    # than the first epoch's 8 steps is the one extra program.
    kinds = [kind for kind, _ in got.executables.compiled()]
    assert kinds.count("train_step") <= 2
    assert_same_state(base, got)
    assert lines(run_dir, "train") == lines(base_dir, "train")


def test_across_processes_auto_is_one_and_a_count_is_kept(monkeypatch):
    # Each process would measure its own step time: every rank must run one count.
    fixed = nx.Nitro(Tiny(), logger=None, checkpointer=None, steps_per_call=4)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    picked = (
        epoch_context(parts_of(fixed)).steps_per_call,
        steps_per_call("auto", 100e-6),
    )
    assert picked == (4, 1)


def test_one_program_serves_every_steps_per_call_up_to_the_block():
    def run(k):  # width 23: programs no other test compiled
        nx.Nitro(
            Tiny(max_epochs=1, width=23),
            logger=None,
            checkpointer=None,
            steps_per_call=k,
        ).train()

    misses = nx.cache_stats()["misses"]
    run(2)
    compiled = nx.cache_stats()["misses"] - misses
    assert compiled >= 1
    for k in (3, 8):  # blocks of 8 steps: the same program, other call lengths
        before = nx.cache_stats()["misses"]
        run(k)
        assert nx.cache_stats()["misses"] == before
    before = nx.cache_stats()["misses"]
    run(1)  # one step a call: the program without the loop
    # (A CPU packs Tiny's state around each step, and then one-step calls run the
    # loop's program over the same blocks of 8: `compile/packed.py`.)
    rule = calls.pack_rule()
    single = rule is None or not rule.each_step
    assert nx.cache_stats()["misses"] == before + single


def test_a_blocks_float_step_inputs_travel_as_one_array():
    """Every rule field is a step input, scheduled or not: the float32 scalars of a
    block (two groups' learning rates and Adam fields here, and each parameter
    leaf's no-decay mask) reach the program as one `(K, n)` array, one transfer
    and one argument, not one each."""

    class Groups(Tiny):
        def param_group(self, keypath):
            return "encoder" if keypath[0] in ("w1", "b1") else "default"

        def optimizer(self):
            return optax.adam

    nitro = nx.Nitro(Groups(), logger=None, checkpointer=None)
    plan = nitro.prepared.plan
    inputs = call_inputs(nitro.prepared, plan, {}, 0, 3, 4)
    scalars = [
        leaf
        for leaf in jax.tree.leaves(plan.step_inputs(0))
        if not isinstance(leaf, jax.Array)
    ]
    leaves = len(jax.tree.leaves(nitro.train_state.weights.params))
    # learning_rate, b1, b2, eps, eps_root per group; a mask value per leaf
    assert len(scalars) == 2 * 5 + leaves
    assert inputs.hp_shared == []  # no argument of its own per parameter leaf
    (packed,) = inputs.hp_steps
    assert packed.shape == (4, len(scalars)) and packed.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(packed)[0], np.float32(scalars))


def test_the_loop_reads_losses_back_once_a_log_line_not_once_a_step(
    monkeypatch, tmp_path
):
    """64 steps at log_every_n_steps=16: the loss ring is read a call after each
    line's step and at the epoch's end, not once a step, and every step's loss
    still reaches the lines and the epoch's mean."""
    reads = []
    settle = calls.settle_calls

    def counted(log, done, accum):
        if done:
            reads.append(sum(len(call.batches) for call in done))
        settle(log, done, accum)

    monkeypatch.setattr(calls, "settle_calls", counted)
    train(tmp_path, "k1", Tiny(n_train=16 * 64, max_epochs=1))  # a line a step
    assert sum(reads) == 64  # each micro-batch settled once
    nitro = nx.Nitro(
        Tiny(n_train=16 * 64, max_epochs=1),
        run_dir=str(tmp_path / "every16"),
        checkpointer=None,
        log_every_n_steps=16,
    )
    reads.clear()
    nitro.train()
    assert sum(reads) == 64
    # A read a call after each of the lines at 16, 32, 48; the epoch's end reads
    # the last 16 steps (the line at 64 among them).
    assert reads == [16, 16, 16, 16]
    steps = [row["step"] for row in lines(tmp_path / "every16", "train")]
    assert steps == [16, 32, 48, 64]
    losses = [row["loss"] for row in lines(tmp_path / "k1", "train")]
    every16 = [row["loss"] for row in lines(tmp_path / "every16", "train")]
    assert every16 == [losses[s - 1] for s in steps]  # the same values, read late


@pytest.mark.parametrize("backend", ["cpu", "tpu"])
def test_the_default_is_auto_on_a_cpu_as_on_an_accelerator(monkeypatch, backend):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    default = nx.Nitro(Tiny(), logger=None, checkpointer=None)
    assert default.config.steps_per_call == "auto"
    assert "steps_per_call auto (default)" in default.binding_report()
    kept = nx.Nitro(Tiny(), logger=None, checkpointer=None, steps_per_call=1)
    assert kept.config.steps_per_call == 1


@pytest.mark.parametrize("k", [1, 2])
def test_a_continued_epoch_then_whole_ones_log_every_step(tmp_path, k):
    """A stopped epoch continues with a short block; the next epoch's whole blocks
    reuse the placed step inputs and still log each step's line."""
    stopper = StopsAtStep(3)
    nitro = nx.Nitro(
        Tiny(n_train=16 * 8, max_epochs=2),
        run_dir=str(tmp_path),
        checkpointer=None,
        logger=stopper,
        log_every_n_steps=1,
        steps_per_call=k,
    )
    stopper.nitro = nitro
    nitro.train()
    stopped = nitro.current_step
    assert 3 < stopped < 8
    stopper.step = None
    nitro.train()
    assert nitro.current_step == 16
    assert [row["step"] for row in nitro.history] == [8, 16]


@pytest.mark.parametrize("steps_per_call", [1, 4])
def test_the_epoch_mean_is_the_same_whether_losses_settle_together_or_one_by_one(
    tmp_path, steps_per_call
):
    # A train line at every step settles each micro-batch alone (EpochLog.settle);
    # without a logger a call's losses settle in one pass (settle_losses). The
    # epoch's mean is one running sum in order either way: bitwise the same.
    alone, _ = train(tmp_path, "alone", Tiny(), steps_per_call=steps_per_call)
    together = nx.Nitro(
        Tiny(),
        run_dir=str(tmp_path / "together"),
        checkpointer=None,
        logger=None,
        steps_per_call=steps_per_call,
    ).train()
    means = [row["train_loss"] for row in alone.history]
    assert means == [row["train_loss"] for row in together.history]
    assert len(means) == Tiny().max_epochs
    assert all(np.isfinite(means))


def test_the_train_program_is_declared_once_for_every_epoch_of_a_setup(monkeypatch):
    # Declaring it keys its constants (about 0.2 ms): once per setup, not per epoch;
    # forgotten with the setup.
    import gc

    from jaxnitro.loop import step_programs

    declared = []
    original = step_programs._step_program

    def counting(prepared, accum):
        declared.append(id(prepared))
        return original(prepared, accum)

    monkeypatch.setattr(step_programs, "_step_program", counting)
    # steps_per_call fixed: "auto" (the default off a CPU) declares a second
    # program once it has chosen its K.
    nitro = nx.Nitro(
        Tiny(max_epochs=3), logger=None, checkpointer=None, steps_per_call=1
    ).train()
    assert len(declared) == 1 and len(nitro.history) == 3
    assert declared[0] in step_programs._DECLARED
    del nitro
    gc.collect()
    assert declared[0] not in step_programs._DECLARED


def test_a_train_keys_its_program_once_and_the_next_train_checks_it_again(
    monkeypatch,
):
    """An epoch's first call finds the program an earlier epoch of its train()
    found for calls taking the same arguments; "auto" switching to its count takes
    other arguments (a longer block) and looks its program up; the next train()
    looks it up again, so the optimizer's constants are checked again there."""
    import jaxnitro.loop.call_count as call_count

    looked_up = []
    real = step_programs._looked_up

    def counting(*args, **kw):
        looked_up.append(kw["single"])  # one step a call, or several
        return real(*args, **kw)

    monkeypatch.setattr(step_programs, "_looked_up", counting)
    monkeypatch.setattr(call_count, "steps_per_call", lambda *asked: 4)
    stopper = StopsAtStep(step=20)  # in epoch 3 of 8 steps each
    nitro = nx.Nitro(
        Tiny(n_train=16 * 8, max_epochs=4, width=47),  # compiled by no other test
        logger=stopper,
        checkpointer=None,
        steps_per_call="auto",
        log_every_n_steps=1,
    )
    stopper.nitro = nitro
    nitro.train()
    assert nitro.stop_reason == "requested"
    assert nitro.status.auto_steps_per_call == 4
    # Epoch 1 at one step a call, epochs 2 and 3 at 4: one lookup each. A CPU
    # packs Tiny's state around each step, and then one-step calls run the loop's
    # program over the same blocks of 8 (`compile/packed.py`): one lookup.
    rule = calls.pack_rule()
    first = [True, False] if rule is None or not rule.each_step else [False]
    assert looked_up == first
    nitro.train()  # the rest of epoch 3, and epoch 4
    assert looked_up == [*first, False]
    assert len(nitro.history) == 4
