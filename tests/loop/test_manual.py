"""Manual mode: the experiment's own train_step, two networks on two optimizers."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compile_counts import kinds_compiled
from experiments import N_CLASSES, N_FEATURES, QuietLogger, Tiny

import jaxnitro as nx
from jaxnitro.compile.packed import ACCELERATOR_PACKING
from jaxnitro.loop import calls


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


def xent(logits, y):
    return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(logits), -1))


class TwoNets(Tiny):
    """An encoder and a head, each trained by its own optimizer in train_step."""

    def build_model(self, rng):
        k1, k2 = jax.random.split(rng)
        params = {
            "enc": {"w": jax.random.normal(k1, (N_FEATURES, 16)) * 0.3},
            "head": {"w": jax.random.normal(k2, (16, N_CLASSES)) * 0.3},
        }
        return None, params, {}

    def forward(self, model, params, state, *, x):
        hidden = jax.nn.relu(x @ params["enc"]["w"])
        return hidden @ params["head"]["w"], state

    def setup_optimizers(self, model, params, state, mesh):
        return {
            "enc": nx.setup_optimizer(optax.sgd(0.1), params["enc"]),
            "head": nx.setup_optimizer(optax.adam(0.02), params["head"]),
        }

    def train_step(self, model, params, opt_state, state, *, x, y):
        def enc_loss(enc, head, x, y):
            return xent(jax.nn.relu(x @ enc["w"]) @ head["w"], y)

        def head_loss(head, enc, x, y):
            return enc_loss(enc, head, x, y)

        loss, g_enc = nx.backward(enc_loss, params["enc"], params["head"], x, y)
        _, g_head = nx.backward(head_loss, params["head"], params["enc"], x, y)
        opt_enc, enc = nx.step_optimizer(opt_state["enc"], params["enc"], g_enc)
        opt_head, head = nx.step_optimizer(opt_state["head"], params["head"], g_head)
        return {
            "loss": loss,
            "params": {"enc": enc, "head": head},
            "state": state,
            "opt_state": {"enc": opt_enc, "head": opt_head},
            "stats": {"enc_grad_norm": optax.tree.norm(g_enc)},
        }


def leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


class Lines(QuietLogger):
    """Keeps every metrics line it is given."""

    def __init__(self):
        self.lines = []

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        self.lines.append((dict(metrics), step, context))


def test_two_networks_on_two_optimizers_train_and_log_their_stats():
    logger = Lines()
    nitro = nx.Nitro(
        TwoNets(max_epochs=8), logger=logger, checkpointer=None, log_every_n_steps=1
    )
    before = leaves(nitro.train_state.opt_state)
    nitro.train()
    losses = [row["train_loss"] for row in nitro.history]
    assert losses[-1] < 0.6 * losses[0]
    assert nitro.stop_reason == "completed" and nitro.current_step == 32
    # Both optimizers stepped: Adam's count advanced 32 times; SGD keeps no arrays.
    opt = nitro.train_state.opt_state
    assert isinstance(opt["enc"], nx.OptState) and isinstance(opt["head"], nx.OptState)
    assert int(opt["head"].inner[0].count) == 32
    assert any(
        not np.array_equal(a, b) for a, b in zip(before, leaves(opt), strict=True)
    )
    train_lines = [m for m, _, ctx in logger.lines if ctx == "train"]
    assert train_lines and all("enc_grad_norm" in m for m in train_lines)
    assert all(np.isfinite(m["enc_grad_norm"]) for m in train_lines)
    assert "loss" in nitro.history[-1]  # validation ran on forward + loss


SGD, ADAM, ADAM_FAST = optax.sgd(0.1), optax.adam(0.02), optax.adam(0.05)


class Shared(TwoNets):
    """TwoNets whose transformations are module-level objects: the same rule for
    every handle, so a second handle's step is a cache hit."""

    fast: int = 0

    def setup_optimizers(self, model, params, state, mesh):
        return {
            "enc": nx.setup_optimizer(SGD, params["enc"]),
            "head": nx.setup_optimizer(
                ADAM_FAST if self.fast else ADAM, params["head"]
            ),
        }


def test_the_manual_step_is_cached_and_keyed_by_its_optimizers():
    nitro = nx.Nitro(Shared(max_epochs=2), **quiet())
    kinds = kinds_compiled(nitro.train)
    assert "manual_step" in kinds and "train_step" not in kinds
    # Another handle with the same rules: nothing compiles for training.
    assert "manual_step" not in kinds_compiled(nx.Nitro(Shared(), **quiet()).train)
    # Another rule is another program: the transformation is in the key.
    fast = nx.Nitro(Shared(fast=1), **quiet())
    assert "manual_step" in kinds_compiled(fast.train)


@pytest.mark.parametrize("packed", [False, True])
def test_rules_built_anew_by_each_handle_compile_the_manual_step_once(
    monkeypatch, packed
):
    """TwoNets calls optax.sgd(0.1) and optax.adam(0.02) in setup_optimizers, for
    each handle: the rules compare by what they compute, so a second handle reuses
    the first one's manual step; with the state packed too (an accelerator's path,
    where the program is keyed by the packed tree's repr: on the TPU a second handle
    compiled again until the rules' repr followed their key)."""
    monkeypatch.setattr(
        calls, "pack_rule", lambda: ACCELERATOR_PACKING if packed else None
    )
    first = nx.Nitro(TwoNets(max_epochs=1), **quiet())
    first.train()
    again = nx.Nitro(TwoNets(max_epochs=1), **quiet())
    assert again.train_state.opt_state["head"].tx is not (
        first.train_state.opt_state["head"].tx
    )
    assert "manual_step" not in kinds_compiled(again.train)


def test_manual_training_false_keeps_the_automatic_loop():
    class Automatic(TwoNets):
        def manual_training(self):
            return False

    nitro = nx.Nitro(Automatic(max_epochs=1), **quiet())
    assert not nitro.prepared.manual
    assert "train_step" in kinds_compiled(nitro.train)
    assert nx.Nitro(TwoNets(), **quiet()).prepared.manual


def test_a_train_step_without_setup_optimizers_is_refused_at_setup():
    class NoSetup(Tiny):
        def train_step(self, model, params, opt_state, state, *, x, y):
            raise AssertionError("never called")

    with pytest.raises(nx.HookError, match="does not define setup_optimizers"):
        nx.Nitro(NoSetup(), **quiet())


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ({"loss": 1}, "missing: params, state, opt_state, stats"),
        ("extra", "unexpected: extra"),
    ],
)
def test_a_return_missing_or_adding_a_key_is_named(returned, message):
    class BadReturn(TwoNets):
        def train_step(self, model, params, opt_state, state, *, x, y):
            out = TwoNets.train_step(self, model, params, opt_state, state, x=x, y=y)
            if returned == "extra":
                return {**out, "extra": out["loss"]}
            return {"loss": out["loss"]}

    nitro = nx.Nitro(BadReturn(), **quiet())
    with pytest.raises(nx.HookError, match=message):
        nitro.train()
    assert nitro.current_step == 0 and nitro.stop_reason == "error"


def test_a_python_scalar_in_the_return_is_named_by_key_path():
    class Frozen(TwoNets):
        def train_step(self, model, params, opt_state, state, *, x, y):
            out = TwoNets.train_step(self, model, params, opt_state, state, x=x, y=y)
            return {**out, "stats": {"lr": 0.1}}

    with pytest.raises(nx.HookError, match=r"Python float \(0.1\) at stats\['lr'\]"):
        nx.Nitro(Frozen(), **quiet()).train()


def test_a_params_tree_whose_structure_changed_is_named():
    class Dropped(TwoNets):
        def train_step(self, model, params, opt_state, state, *, x, y):
            out = TwoNets.train_step(self, model, params, opt_state, state, x=x, y=y)
            return {**out, "params": {"enc": out["params"]["enc"]}}

    with pytest.raises(nx.HookError, match=r"missing params\['head'\]\['w'\]"):
        nx.Nitro(Dropped(), **quiet()).train()


def test_a_host_number_in_an_optimizer_state_is_refused_by_key_path():
    class HostCount(TwoNets):
        def setup_optimizers(self, model, params, state, mesh):
            states = TwoNets.setup_optimizers(self, model, params, state, mesh)
            return {**states, "step": 0}

    with pytest.raises(
        nx.HookError, match=r"host Python int \(0\) at opt_state\['step'\]"
    ):
        nx.Nitro(HostCount(), **quiet())


def test_an_optimizer_state_without_opt_states_is_refused():
    class Bare(TwoNets):
        def setup_optimizers(self, model, params, state, mesh):
            return {"enc": optax.sgd(0.1).init(params["enc"])}

    with pytest.raises(nx.HookError, match="with no OptState in it"):
        nx.Nitro(Bare(), **quiet())


def test_a_nan_loss_stops_at_the_first_step_and_checkpoints_nothing(tmp_path):
    class Diverges(TwoNets):
        def train_step(self, model, params, opt_state, state, *, x, y):
            out = TwoNets.train_step(self, model, params, opt_state, state, x=x, y=y)
            return {**out, "loss": out["loss"] * jnp.nan}

    nitro = nx.Nitro(Diverges(), run_dir=str(tmp_path), logger=None)
    with pytest.raises(nx.DivergenceError, match="The training loss is nan at step 1"):
        nitro.train()
    assert not list(tmp_path.glob("*.safetensors"))


def test_accum_and_perturb_rules_are_refused_with_the_reason():
    with pytest.raises(nx.ConfigError, match="accum=2 is refused"):
        nx.Nitro(TwoNets(n_train=128), accum=2, **quiet())

    class Sharp(TwoNets):
        def grad_rule(self):
            return nx.SAM(0.05)

    with pytest.raises(nx.ConfigError, match="supports the SingleGrad grad rule only"):
        nx.Nitro(Sharp(), **quiet())


def test_train_metrics_in_manual_mode_says_it_is_unused():
    class WithMetrics(TwoNets):
        def train_metrics(self, logits, *, y):
            return {"acc": jnp.mean(logits.argmax(-1) == y.argmax(-1))}

    with pytest.warns(nx.NitroWarning, match="train_metrics is unused"):
        nitro = nx.Nitro(WithMetrics(max_epochs=1), **quiet())
    nitro.train()


def test_checkpoint_and_resume_equal_an_uninterrupted_run_bitwise(tmp_path):
    straight = nx.Nitro(TwoNets(max_epochs=4), run_dir=str(tmp_path / "a"), logger=None)
    straight.train()
    first = nx.Nitro(TwoNets(max_epochs=2), run_dir=str(tmp_path / "b"), logger=None)
    first.train()
    resumed = nx.Nitro(
        TwoNets(max_epochs=4),
        run_dir=str(tmp_path / "b"),
        logger=None,
        resume="auto",
    )
    assert (resumed.current_epoch, resumed.current_step) == (2, 8)
    resumed.train()
    for a, b in zip(
        leaves(resumed.parameters), leaves(straight.parameters), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    mine, theirs = resumed.train_state.opt_state, straight.train_state.opt_state
    assert jax.tree.structure(mine) == jax.tree.structure(
        jax.tree.map(lambda a: a, mine)
    )
    for a, b in zip(leaves(mine), leaves(theirs), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(mine["head"].inner[0].count) == 16
    assert [r["train_loss"] for r in resumed.history] == [
        r["train_loss"] for r in straight.history[3:]
    ]


def test_a_resume_from_a_stop_mid_epoch_equals_an_uninterrupted_run_bitwise(
    tmp_path,
):
    """A stop at step 6 cuts epoch 2 (4 steps an epoch); the record written then
    resumes the epoch at its next batch, with every optimizer state."""
    from experiments import StopsAtStep

    straight = nx.Nitro(TwoNets(max_epochs=3), run_dir=str(tmp_path / "a"), logger=None)
    straight.train()
    stopper = StopsAtStep(6)
    first = nx.Nitro(
        TwoNets(max_epochs=3),
        run_dir=str(tmp_path / "b"),
        logger=stopper,
        log_every_n_steps=1,
        # A stop lands at a call's end: one step a call, where an accelerator's
        # default ("auto") would run the epoch's 4 steps in one.
        steps_per_call=1,
    )
    stopper.nitro = first
    first.train()
    assert first.stop_reason == "requested"
    assert (first.current_epoch, first.current_step) == (2, 7)
    resumed = nx.Nitro(
        TwoNets(max_epochs=3), run_dir=str(tmp_path / "b"), logger=None, resume="auto"
    )
    resumed.train()
    assert resumed.current_step == straight.current_step == 12
    for a, b in zip(
        leaves((resumed.parameters, resumed.train_state.opt_state)),
        leaves((straight.parameters, straight.train_state.opt_state)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def test_a_stop_request_in_manual_mode_ends_at_the_step_boundary():
    from experiments import StopsAtStep

    stopper = StopsAtStep(2)
    nitro = nx.Nitro(
        TwoNets(max_epochs=3), logger=stopper, checkpointer=None, log_every_n_steps=1
    )
    stopper.nitro = nitro
    nitro.train()
    assert nitro.stop_reason == "requested" and nitro.current_step == 3


def test_a_closure_captured_traced_value_gets_no_gradient():
    """backward differentiates its arguments only: an objective that reads the
    traced parameters from an enclosing scope instead of its argument gets a zero
    gradient with no error, while its loss is still correct."""
    x = jnp.array([1.0, 2.0])

    @jax.jit
    def both(head):
        def captured(h, x):  # reads `head` from the closure, ignoring `h`
            return jnp.sum(head * x)

        def explicit(h, x):
            return jnp.sum(h * x)

        return nx.backward(captured, head, x), nx.backward(explicit, head, x)

    (loss_c, g_c), (loss_e, g_e) = both(jnp.array([3.0, -1.0]))
    assert float(loss_c) == float(loss_e) == 1.0
    np.testing.assert_array_equal(g_c, [0.0, 0.0])  # silently no gradient
    np.testing.assert_array_equal(g_e, x)
    # consts are constants: no gradient flows into them, only into the first.
    _, g = nx.backward(lambda h, x: jnp.sum(h * x), jnp.ones(2), x)
    np.testing.assert_array_equal(g, x)


def test_strip_and_merge_rules_round_trip_the_bare_states():
    params = {"w": jnp.ones(3)}
    combined = {"a": nx.setup_optimizer(optax.adam(0.1), params)}
    bare = nx.strip_rules(combined)
    assert not any(isinstance(s, nx.OptState) for s in jax.tree.leaves(bare))
    merged = nx.merge_rules(combined, bare)
    assert merged["a"].tx is combined["a"].tx
    assert jax.tree.structure(merged) == jax.tree.structure(combined)


def test_manual_training_flipped_after_construction_is_reported_and_frozen():
    cls = type("Flipped", (TwoNets,), {"__module__": __name__})
    nitro = nx.Nitro(cls(max_epochs=1), **quiet())
    cls.manual_training = lambda self: False
    with pytest.warns(nx.StaleHandleWarning, match="manual_training"):
        kinds = kinds_compiled(nitro.train)
    assert nitro.prepared.manual and "manual_step" in kinds


INJECTED_SGD = optax.inject_hyperparams(optax.sgd)(learning_rate=1.0)
INJECTED_ADAM = optax.inject_hyperparams(optax.adam)(learning_rate=1.0)


class Scheduled(TwoNets):
    """TwoNets whose rules expose their hyperparameters, with a learning-rate
    schedule set on both: `lr0` at step 0, halving each step."""

    lr0: float = 0.1

    def setup_optimizers(self, model, params, state, mesh):
        return {
            "enc": nx.setup_optimizer(INJECTED_SGD, params["enc"]),
            "head": nx.setup_optimizer(INJECTED_ADAM, params["head"]),
        }

    def schedules(self):
        return {"opt.learning_rate": lambda total: lambda t: self.lr0 * 0.5**t}


def test_an_opt_schedule_binds_into_every_rule_with_the_field_absolutely():
    lines = train_lines(Seen(max_epochs=1))
    seen = [(m["learning_rate_enc"], m["learning_rate_head"]) for m in lines]
    expected = [0.1 * 0.5**t for t in range(4)]
    np.testing.assert_allclose([s[0] for s in seen], expected, rtol=1e-6)
    np.testing.assert_allclose([s[1] for s in seen], expected, rtol=1e-6)
    # Another schedule value is an input, not a program: nothing compiles.
    again = nx.Nitro(Seen(max_epochs=1, lr0=0.3), **quiet())
    assert "manual_step" not in kinds_compiled(again.train)


def test_an_opt_schedule_no_rule_exposes_is_refused():
    class Plain(TwoNets):
        def schedules(self):
            return {"learning_rate": 0.01}

    with pytest.raises(nx.ConfigError, match="build the rule with optax.inject"):
        nx.Nitro(Plain(), **quiet())


class Seen(Scheduled):
    """Scheduled, reporting each state's learning rate and b1 as it entered the step."""

    def train_step(self, model, params, opt_state, state, *, x, y):
        out = Scheduled.train_step(self, model, params, opt_state, state, x=x, y=y)
        stats = {
            f"{name}_{k}": s.inner.hyperparams[name]
            for k, s in opt_state.items()
            for name in ("learning_rate", "b1")
            if name in s.inner.hyperparams
        }
        return {**out, "stats": stats}


def train_lines(e, **kw):
    logger = Lines()
    nitro = nx.Nitro(e, logger=logger, checkpointer=None, log_every_n_steps=1, **kw)
    nitro.train()
    return [m for m, _, ctx in logger.lines if ctx == "train"]


def test_an_opt_schedule_on_a_subtree_path_binds_into_that_subtree_only():
    class Path(Seen):
        def schedules(self):
            return {
                "opt.head.learning_rate": lambda total: lambda t: 0.01 * (t + 1),
                "opt.b1": 0.5,  # a field only adam exposes: every rule that has it
            }

    lines = train_lines(Path(max_epochs=1))
    np.testing.assert_allclose(
        [m["learning_rate_head"] for m in lines], [0.01, 0.02, 0.03, 0.04], rtol=1e-6
    )
    # The enc subtree keeps the value its rule was built with.
    assert [m["learning_rate_enc"] for m in lines] == [1.0] * 4
    assert [m["b1_head"] for m in lines] == [0.5] * 4
    # A varying value is logged as it binds: schedule/<subtree>/<field>.
    np.testing.assert_allclose(
        [m["schedule/head/learning_rate"] for m in lines], [0.01, 0.02, 0.03, 0.04]
    )


class Exposed(Scheduled):
    """Scheduled's injected rules, with no schedule of its own."""

    def schedules(self):
        return {}


def test_which_opt_keys_a_manual_run_schedules_compiles_nothing():
    """Every hyperparameter the optimizer states expose is an input of the manual
    step from the first program on, scheduled or not: a run that schedules another
    key (or none) reuses the program."""
    varying = lambda total: lambda t: 0.01 * (t + 1)  # noqa: E731
    runs = [
        {},
        {"learning_rate": varying},
        {"opt.head.learning_rate": varying},
        {"opt.enc.learning_rate": 0.3, "opt.b1": 0.5},
        {},
    ]
    nx.Nitro(Exposed(max_epochs=1), **quiet(schedules=runs[0])).train()
    before = nx.cache_stats()["misses"]
    for schedules in runs[1:]:
        nitro = nx.Nitro(Exposed(max_epochs=1), **quiet(schedules=schedules))
        nitro.train()
        assert nx.cache_stats()["misses"] == before, schedules


def test_an_unscheduled_exposed_hyperparameter_keeps_the_value_its_state_holds():
    """A hyperparameter no schedule sets reaches train_step as the state holds it,
    bitwise, and a schedule of that same value trains the same weights."""

    def weights(**kw):
        nitro = nx.Nitro(Seen(max_epochs=1), **quiet(**kw))
        nitro.train()
        return leaves(nitro.train_state.params)

    lines = train_lines(Seen(max_epochs=1), schedules={"opt.enc.learning_rate": 0.5})
    assert [m["learning_rate_head"] for m in lines] == [1.0] * 4
    assert [m["b1_head"] for m in lines] == [np.float32(0.9)] * 4
    plain = weights(schedules={})
    same = weights(schedules={"opt.learning_rate": 1.0})
    for a, b in zip(plain, same, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_subtree_path_beats_the_bare_key_there():
    class Both(Seen):
        def schedules(self):
            return {"opt.learning_rate": 0.2, "opt.enc.learning_rate": 0.05}

    (first, *_) = train_lines(Both(max_epochs=1))
    assert first["learning_rate_enc"] == pytest.approx(0.05)
    assert first["learning_rate_head"] == pytest.approx(0.2)


@pytest.mark.parametrize(
    "key, message",
    [
        (
            "opt.body.learning_rate",
            "no subtree of the optimizer states holding an OptState 'body'. The "
            "subtrees are: enc, head",
        ),
        ("opt.enc.b1", "no rule of 'enc' has a field `b1`. The rule fields are: "),
    ],
)
def test_a_subtree_path_that_binds_nowhere_is_refused(key, message):
    class Path(Scheduled):
        def schedules(self):
            return {key: 0.5}

    with pytest.raises(nx.ConfigError) as info:
        nx.Nitro(Path(), **quiet())
    assert message in str(info.value)


def test_early_stopping_ends_a_manual_run_on_its_validation_loss():
    nitro = nx.Nitro(
        TwoNets(max_epochs=10),
        early_stop=nx.EarlyStopping(patience=2, min_delta=10.0),  # nothing improves
        **quiet(),
    )
    nitro.train()
    assert nitro.stop_reason == "early_stop" and nitro.current_epoch == 3
    assert [row["epoch"] for row in nitro.history] == [1, 2, 3]


def test_manual_mode_refuses_a_reduced_precision():
    with pytest.raises(nx.ConfigError, match='precision="bf16" cannot reach the step'):
        nx.Nitro(TwoNets(), precision="bf16", **quiet())


class Dropout(Scheduled):
    """Scheduled with dropout keyed by step_rng(): every per-step input a call of
    several manual steps stacks (the schedule's value, the step's rng)."""

    def train_step(self, model, params, opt_state, state, *, x, y):
        keep = jax.random.bernoulli(nx.step_rng(), 0.8, x.shape)
        return super().train_step(
            model, params, opt_state, state, x=jnp.where(keep, x / 0.8, 0.0), y=y
        )


@pytest.mark.parametrize(
    ("k", "n_devs"),
    [(3, 1), (4, 1), pytest.param(3, 2, marks=pytest.mark.needs_devices(2))],
)
def test_manual_steps_in_calls_of_several_train_bitwise_as_one(tmp_path, k, n_devs):
    """Manual mode runs in the one hot loop: its own train_step, k steps a call
    (the epoch's 4 steps as calls of 3 and 1, or one of 4), bit for bit, on one
    device and on a mesh."""

    def run(per_call):
        run_dir = tmp_path / f"k{per_call}"
        nitro = nx.Nitro(
            Dropout(max_epochs=2),
            run_dir=str(run_dir),
            checkpointer=None,
            log_every_n_steps=1,
            steps_per_call=per_call,
            n_devs=n_devs,
        )
        kinds = kinds_compiled(nitro.train)
        text = (run_dir / "metrics.jsonl").read_text().splitlines()
        return nitro, kinds, [line for line in text if '"train"' in line]

    base, _, base_lines = run(1)
    got, kinds, got_lines = run(k)
    assert got.current_step == base.current_step == 8
    assert kinds.count("manual_step") <= 1  # k=3 and 4 share a block of 8 steps
    pairs = zip(
        leaves(base.train_state.weights), leaves(got.train_state.weights), strict=True
    )
    for a, b in pairs:
        np.testing.assert_array_equal(a, b)
    strip = [json_without_run_id(line) for line in got_lines]
    assert strip == [json_without_run_id(line) for line in base_lines]
    assert len(strip) == 8 and "enc_grad_norm" in strip[0]


def json_without_run_id(line):
    row = json.loads(line)
    row.pop("run_id", None)
    return row
