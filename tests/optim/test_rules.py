"""Optimization: groups, levels, decay, schedules, Plateau, early stopping, SAM, EMA.

Every formula is checked against a direct Optax or NumPy computation of the same
steps on the same data.
"""

import dataclasses
import json
import logging
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from experiments import Tiny, make_batches, mlp

import jaxnitro as nx
from jaxnitro.compile.boundary import Weights
from jaxnitro.compile.cache import program_cache


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


class OneBatch(Tiny):
    """Tiny with one train batch of 16 and no val split: one step per epoch."""

    def build_data(self, dist):
        return {"train": make_batches(16, 16)}


def loss_of(e, params, batch):
    return Tiny.loss(e, mlp(params, jnp.asarray(batch["x"])), y=jnp.asarray(batch["y"]))


def reference(tx, steps, batch, params0, smoothing=0.0):
    """Run `steps` steps of a hand-written Optax loop from `params0`."""
    e = Tiny(smoothing=smoothing)
    params, state = params0, tx.init(params0)
    for _ in range(steps):
        grads = jax.grad(lambda p: loss_of(e, p, batch))(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params


def initial_params(width=16, seed=42):
    from experiments import init_mlp

    return init_mlp(jax.random.key(seed), width)


def assert_trees_close(a, b, rtol=2e-5, atol=1e-6):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


BATCH = make_batches(16, 16)[0]


class Grouped(OneBatch):
    """Two groups: the first layer is the encoder at a tenth of the rate, decayed."""

    def param_group(self, keypath):
        return "encoder" if keypath[0] in ("w1", "b1") else "default"

    def learning_rate(self, group=None):
        return 0.01 if group == "encoder" else 0.1

    def weight_decay(self, group=None):
        return 0.5 if group == "encoder" else 0.0


def test_groups_ratios_and_decay_match_optax():
    nitro = nx.Nitro(Grouped(max_epochs=3), **quiet())
    assert nitro.prepared.plan.layout.names == ("default", "encoder")
    nitro.train()
    labels = {"w1": "encoder", "b1": "encoder", "w2": "default"}
    mask = {"w1": True, "b1": False, "w2": True}  # default_no_decay: no 1-D leaves
    tx = optax.multi_transform(
        {
            "default": optax.radam(0.1),
            "encoder": optax.chain(
                optax.radam(0.01), decay_toward_zero(0.5 * 0.01, mask)
            ),
        },
        labels,
    )
    expected = reference(tx, 3, BATCH, initial_params())
    assert_trees_close(nitro.parameters, expected)


def decay_toward_zero(coefficient, mask):
    """update <- update - coefficient * w on the masked leaves (by hand)."""

    def init(params):
        return optax.EmptyState()

    def update(updates, state, params):
        new = {
            k: u - coefficient * params[k]
            if mask[k] and not isinstance(u, optax.MaskedNode)
            else u
            for k, u in updates.items()
        }
        return new, state

    return optax.GradientTransformation(init, update)


def test_decay_toward_w0_is_l2_sp():
    class Anchored(OneBatch):
        def weight_decay(self, group=None):
            return 0.3

        def decay_anchor(self, group=None):
            return "w0"

        def no_decay(self, keypath, leaf):
            return False  # decay every leaf, biases included

        def learning_rate(self, group=None):
            return 0.05

    nitro = nx.Nitro(Anchored(max_epochs=3), **quiet())
    w0 = initial_params()
    nitro.train()

    def init(params):  # by hand: update -= lam * lr * (w - w0)
        return optax.EmptyState()

    def update(updates, state, params):
        return jax.tree.map(
            lambda u, p, a: u - 0.3 * 0.05 * (p - a), updates, params, w0
        ), state

    tx = optax.chain(optax.radam(0.05), optax.GradientTransformation(init, update))
    expected = reference(tx, 3, BATCH, w0)
    assert_trees_close(nitro.parameters, expected)
    assert "default" in nitro.prepared.anchor_sums


def test_learning_rate_zero_is_refused():
    class Zero(OneBatch):
        def learning_rate(self, group=None):
            return 0.0

    with pytest.raises(nx.ConfigError, match="learning_rate\\(\\) returned 0.0"):
        nx.Nitro(Zero(), **quiet())


def test_level1_rule_called_by_name_with_a_scheduled_field():
    class Momentum(OneBatch):
        def optimizer(self):
            return optax.sgd

        def learning_rate(self, group=None):
            return 0.1

    schedules = {
        "momentum": 0.9,
        "learning_rate": lambda total: lambda t: 0.1 / (1 + t),
    }
    nitro = nx.Nitro(Momentum(max_epochs=3), schedules=schedules, **quiet())
    nitro.train()
    lr = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1, momentum=0.9)
    params, state = initial_params(), lr.init(initial_params())
    for t in range(3):
        state.hyperparams["learning_rate"] = jnp.asarray(0.1 / (1 + t))
        grads = jax.grad(lambda p: loss_of(Tiny(), p, BATCH))(params)
        updates, state = lr.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    assert_trees_close(nitro.parameters, params)


def test_a_rule_that_decays_by_itself_is_refused():
    class DoubleDecay(OneBatch):
        def optimizer(self):
            return optax.adamw

    with pytest.raises(
        nx.ConfigError, match="optax.adamw, which decays the weights by itself"
    ) as info:
        nx.Nitro(DoubleDecay(), **quiet())
    assert "optax.adam for optax.adamw" in str(info.value)


class Level2(OneBatch):
    def optimizer(self, group, hp):
        return optax.chain(
            optax.sgd(hp["learning_rate"], momentum=hp["momentum"]),
            nx.Decay(hp["weight_decay"], hp["anchor"], hp["no_decay_mask"]),
        )

    def weight_decay(self, group=None):
        return 0.1


def test_level2_builds_the_chain_from_hp():
    nitro = nx.Nitro(Level2(max_epochs=2), schedules={"momentum": 0.5}, **quiet())
    nitro.train()
    mask = {"w1": True, "b1": False, "w2": True}
    tx = optax.chain(optax.sgd(0.05, momentum=0.5), decay_toward_zero(0.1 * 0.05, mask))
    expected = reference(tx, 2, BATCH, initial_params())
    assert_trees_close(nitro.parameters, expected)


def test_level2_decay_not_last_is_refused():
    class Misplaced(Level2):
        def optimizer(self, group, hp):
            return optax.chain(
                nx.Decay(hp["weight_decay"], hp["anchor"], hp["no_decay_mask"]),
                optax.adam(hp["learning_rate"]),
            )

    with pytest.raises(nx.HookError, match="does not end with jaxnitro.Decay"):
        nx.Nitro(Misplaced(), **quiet())


def test_level2_scheduled_field_that_is_never_read_is_refused():
    class Ignores(Level2):
        def optimizer(self, group, hp):
            return optax.chain(
                optax.sgd(hp["learning_rate"], momentum=0.9),
                nx.Decay(hp["weight_decay"], hp["anchor"], hp["no_decay_mask"]),
            )

    with pytest.raises(nx.ConfigError, match="never reads it"):
        nx.Nitro(Ignores(), schedules={"momentum": 0.5}, **quiet())


@pytest.mark.parametrize(
    "schedules, message",
    [
        ({"lr": 0.1}, "Schedule `lr` binds nowhere"),
        ({"learnin_rate": 0.1}, "Did you mean `learning_rate`?"),
        ({"width": 1.0}, "`width` names a GraphConst field of the experiment"),
        ({"n_train": 1.0}, "`n_train` names a Host field.*Mark `n_train` Device"),
        (
            {"opt": {"nope": {"learning_rate": 1.0}}},
            "there is no parameter group 'nope'",
        ),
        ({"device": {"width": 1.0}}, "`width` is not a Device field"),
        ({"nesterov": 1.0}, "`nesterov` of group 'default'"),
        ({"learning_rate": "fast"}, "Schedule `learning_rate` is 'fast'"),
    ],
)
def test_schedule_binding_errors(schedules, message):
    with pytest.raises(nx.ConfigError, match=message):
        nx.Nitro(OneBatch(), schedules=schedules, **quiet())


@pytest.mark.parametrize("key", ["anchor", "no_decay_mask"])
@pytest.mark.parametrize("level", [0, 2])
def test_scheduling_a_decay_field_is_refused_at_binding(level, key):
    experiment, schedules = (Level2(), {"momentum": 0.5}) if level else (OneBatch(), {})
    hook = "decay_anchor\\(group\\)" if key == "anchor" else "no_decay\\(keypath"
    with pytest.raises(
        nx.ConfigError,
        match=f"Schedule `{key}` = 3.0: `{key}` is a non-schedulable Decay field "
        f".*Set it with {hook}.*remove this schedule",
    ):
        nx.Nitro(experiment, schedules={**schedules, key: 3.0}, **quiet())


def test_a_declared_nonschedulable_field_is_refused():
    def clipped_sgd(learning_rate, max_norm=1.0):
        parts = [optax.clip_by_global_norm(max_norm)] if max_norm > 0 else []
        return optax.chain(*parts, optax.sgd(learning_rate))

    class Clipped(OneBatch):
        def optimizer(self):
            return clipped_sgd

    assert nx.nonschedulable(clipped_sgd) == ()
    assert nx.declare_nonschedulable(clipped_sgd, "max_norm") is clipped_sgd
    assert nx.nonschedulable(clipped_sgd) == ("max_norm",)
    with pytest.raises(
        nx.ConfigError,
        match=r"Schedule `max_norm` = 0.5: `max_norm` of group 'default''s rule is "
        r"not schedulable: .*clipped_sgd declares it non-schedulable .*"
        r"functools.partial\(.*clipped_sgd, max_norm=...\)",
    ):
        nx.Nitro(Clipped(), schedules={"max_norm": 0.5}, **quiet())
    nx.declare_nonschedulable(clipped_sgd)  # a declaration replaces the last one
    assert nx.nonschedulable(clipped_sgd) == ()
    with pytest.raises(
        nx.ConfigError, match=r"clipped_sgd has no parameter `max_nrom`.*max_norm\."
    ):
        nx.declare_nonschedulable(clipped_sgd, "max_nrom")
    with pytest.raises(nx.ConfigError, match="name each field by a string"):
        nx.declare_nonschedulable(clipped_sgd, 3)
    with pytest.raises(nx.ConfigError, match="the first argument is the rule"):
        nx.declare_nonschedulable(optax.sgd(0.1), "momentum")


def test_level2_that_returns_no_chain_is_refused_at_setup():
    class Named(OneBatch):  # no decay, no schedule: nothing else probes the hook
        def optimizer(self, group, hp):
            return "sgd"

    with pytest.raises(
        nx.HookError,
        match=r"optimizer\(self, 'default', hp\) returned str \('sgd'\); it must "
        r"return an Optax GradientTransformation",
    ):
        nx.Nitro(Named(), **quiet())


def test_an_ambiguous_key_names_both_places():
    class Ambiguous(OneBatch):
        momentum: nx.Device[float] = 0.0

        def optimizer(self):
            return optax.sgd

    with pytest.raises(
        nx.ConfigError, match="binds to 2 places: opt.momentum, device.momentum"
    ):
        nx.Nitro(Ambiguous(), schedules={"momentum": 0.9}, **quiet())
    nx.Nitro(Ambiguous(), schedules={"device": {"momentum": 0.9}}, **quiet())


def test_scheduling_decay_and_per_group_decay_is_refused():
    with pytest.raises(nx.ConfigError, match="also defines weight_decay\\(group\\)"):
        nx.Nitro(Grouped(), schedules={"weight_decay": 0.1}, **quiet())


def test_weight_decay_may_be_a_field():
    class FieldDecay(OneBatch):
        weight_decay: float = 0.0

    class MethodDecay(OneBatch):
        def weight_decay(self, group=None):
            return 0.1

    by_field = nx.Nitro(FieldDecay(max_epochs=2, weight_decay=0.1), **quiet())
    assert [(g.weight_decay, g.decays) for g in by_field.prepared.plan.groups] == [
        (0.1, True)
    ]
    by_field.train()
    by_method = nx.Nitro(MethodDecay(max_epochs=2), **quiet())
    by_method.train()
    assert_trees_close(by_field.parameters, by_method.parameters, rtol=0, atol=0)


def test_a_field_named_like_a_hook_is_refused():
    class Field(OneBatch):
        grad_rule: object = None

    with pytest.raises(
        nx.ConfigError, match="has a field `grad_rule`, but `grad_rule` is a hook"
    ):
        nx.Nitro(Field(), **quiet())


def test_schedules_reads_no_field():
    class Field(OneBatch):
        schedules: object = None

    table = {"learning_rate": lambda total: lambda t: 7.0}
    for kw in ({}, {"schedules": table}):
        with pytest.raises(
            nx.ConfigError, match="reads no field of the experiment.*def schedules"
        ):
            nx.Nitro(Field(schedules=table), **quiet(**kw))


def test_schedules_compile_nothing_and_are_logged(tmp_path):
    def cosine(total):
        assert total == 3 * 4  # max_epochs * (batches // accum)
        return optax.cosine_decay_schedule(0.05, total)

    nx.Nitro(Tiny(max_epochs=1), **quiet()).train()
    before = nx.cache_stats()["misses"]
    nitro = nx.Nitro(
        Tiny(max_epochs=3),
        schedules={
            "learning_rate": cosine,
            "smoothing": optax.linear_schedule(0.0, 0.2, 12),
        },
        run_dir=str(tmp_path),
        checkpointer=None,
    )
    nitro.train()
    assert nx.cache_stats()["misses"] == before
    lines = [
        json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    train = [x for x in lines if x.get("context") == "train"]
    expected = [float(optax.cosine_decay_schedule(0.05, 12)(t)) for t in range(12)]
    # A rule value is logged per group (one group here), a Device field bare.
    np.testing.assert_allclose(
        [x["schedule/default/learning_rate"] for x in train], expected, rtol=1e-6
    )
    assert train[-1]["schedule/smoothing"] == pytest.approx(0.2 * 11 / 12)
    assert nitro.device_value("smoothing") == pytest.approx(0.2 * 11 / 12)


def test_rule_schedules_are_logged_per_group_after_scaling(tmp_path):
    class TwoGroups(OneBatch):
        def param_group(self, keypath):
            return "encoder" if keypath[0] in ("w1", "b1") else "default"

        def learning_rate(self, group=None):
            return 0.01 if group == "encoder" else 0.1

    def train_lines(schedules, run):
        nx.Nitro(
            TwoGroups(max_epochs=2),
            schedules=schedules,
            run_dir=str(tmp_path / run),
            checkpointer=None,
        ).train()
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [
            {k: v for k, v in json.loads(x).items() if k.startswith("schedule/")}
            for x in lines
            if json.loads(x).get("context") == "train"
        ]

    ramp = lambda total: lambda t: 0.1 * (t + 1)  # noqa: E731
    decay = lambda total: lambda t: 0.5 * (t + 1)  # noqa: E731
    lines = train_lines({"learning_rate": ramp, "weight_decay": decay}, "bare")
    assert len(lines) == 2
    for t, line in enumerate(lines):
        lr = 0.1 * (t + 1)
        assert line == pytest.approx(
            {
                "schedule/default/learning_rate": lr,
                "schedule/encoder/learning_rate": 0.1 * lr,
                "schedule/default/weight_decay": 0.5 * (t + 1) * lr,
                "schedule/encoder/weight_decay": 0.5 * (t + 1) * 0.1 * lr,
            }
        )
    lines = train_lines({"opt": {"encoder": {"learning_rate": ramp}}}, "group")
    assert len(lines) == 2
    for t, line in enumerate(lines):  # the encoder's ratio applies to its own path
        assert line == pytest.approx({"schedule/encoder/learning_rate": 0.01 * (t + 1)})


def pytorch_plateau(
    metrics, factor=0.1, patience=2, cooldown=1, threshold=1e-4, mode="min"
):
    """PyTorch's ReduceLROnPlateau (rel threshold), reimplemented directly."""
    best = math.inf if mode == "min" else -math.inf
    bad, cool, lr, out = 0, 0, 1.0, []
    for m in metrics:
        better = (
            m < best * (1 - threshold) if mode == "min" else m > best * (1 + threshold)
        )
        if better:
            best, bad = m, 0
        else:
            bad += 1
        if cool > 0:
            cool -= 1
            bad = 0
        if bad > patience:
            lr, cool, bad = max(lr * factor, 0.0), cooldown, 0
        out.append(lr)
    return out


def test_plateau_follows_pytorch_rule():
    sequence = [
        1.0,
        0.9,
        0.95,
        0.92,
        0.91,
        0.9,
        0.89,
        0.895,
        0.9,
        0.9,
        0.9,
        0.7,
        0.71,
        0.72,
    ]
    state = nx.Plateau(1.0, patience=2, cooldown=1).state_for(("loss", "min"))
    scales = []
    for value in sequence:
        state.update(value)
        scales.append(state.scale)
    np.testing.assert_allclose(scales, pytorch_plateau(sequence), rtol=1e-12)


def test_plateau_scales_the_learning_rate_and_is_logged(tmp_path):
    nitro = nx.Nitro(
        Tiny(max_epochs=4),
        schedules={"learning_rate": nx.Plateau(0.05, patience=0, threshold=10.0)},
        run_dir=str(tmp_path),
        checkpointer=None,
    )
    nitro.train()
    lines = [
        json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    validate = [x for x in lines if x.get("context") == "validate"]
    # threshold 10 (relative) means no epoch ever improves after the first.
    assert [x["schedule/plateau/learning_rate"] for x in validate] == pytest.approx(
        [1.0, 0.1, 0.01, 0.001]
    )
    train = [x for x in lines if x.get("context") == "train"]
    assert train[4]["schedule/default/learning_rate"] == pytest.approx(0.05)  # epoch 2
    assert train[8]["schedule/default/learning_rate"] == pytest.approx(0.005)


def test_plateau_reductions_are_reported_at_info(caplog):
    plateau = nx.Plateau(0.05, patience=0, threshold=10.0)  # epoch 2 reduces
    with caplog.at_level(logging.INFO, logger="jaxnitro"):
        nx.Nitro(
            Tiny(max_epochs=2), schedules={"learning_rate": plateau}, **quiet()
        ).train()
    reports = [m for r in caplog.records if (m := r.getMessage()).startswith("Plateau")]
    assert len(reports) == 1
    assert re.fullmatch(
        r"Plateau on schedule `learning_rate`: `loss` stopped improving \([0-9.]+ at "
        r"epoch 2\); scale reduced to 0.1 from the next epoch.",
        reports[0],
    )


def test_plateau_needs_a_val_split():
    with pytest.raises(
        nx.ConfigError, match="Plateau on schedule `learning_rate` needs a val split"
    ):
        nx.Nitro(OneBatch(), schedules={"learning_rate": nx.Plateau(0.01)}, **quiet())


def test_early_stopping_stops_validates_and_checkpoints(tmp_path):
    policy = nx.EarlyStopping(patience=1, min_delta=10.0)  # nothing improves by 10
    nitro = nx.Nitro(
        Tiny(max_epochs=10), early_stop=policy, run_dir=str(tmp_path), logger=None
    )
    nitro.train()
    assert nitro.stop_reason == "early_stop" and nitro.current_epoch == 2
    assert len(nitro.history) == 2 and "loss" in nitro.history[-1]
    assert nx.read_manifest(str(tmp_path))[-1].stop_reason == "early_stop"
    assert policy.wait == 0 and math.isnan(
        policy.best
    )  # the instance passed is untouched


def test_early_stopping_counters_resume(tmp_path):
    kw = {"run_dir": str(tmp_path), "logger": None}
    first = nx.Nitro(
        Tiny(max_epochs=1),
        early_stop=nx.EarlyStopping(patience=2, min_delta=10.0),
        **kw,
    )
    first.train()
    assert first.prepared.stopper.wait == 0
    resumed = nx.Nitro(
        Tiny(max_epochs=10),
        early_stop=nx.EarlyStopping(patience=2, min_delta=10.0),
        resume="auto",
        **kw,
    )
    assert resumed.prepared.stopper.best == pytest.approx(first.prepared.stopper.best)
    resumed.train()
    assert resumed.current_epoch == 3  # epochs 2 and 3 fail to improve


@pytest.mark.parametrize("value", ["0.93", b"0.5", np.str_("0.5"), 0.5 + 1j])
def test_a_control_readback_refuses_what_is_not_a_real_number(value):
    message = rf"`acc` is {re.escape(repr(value))}, not a real number \(it is a "
    with pytest.raises(nx.CheckpointError, match=message):
        nx.check_control_readback(value, "checkpoint metric", "acc")
    stopper = nx.EarlyStopping(metric="acc", mode="max", patience=1)
    with pytest.raises(nx.CheckpointError, match=message):
        stopper.should_stop(1, {"acc": value})
    for real in (True, 2, np.float32(0.5), jnp.asarray(0.5, jnp.bfloat16)):
        assert nx.check_control_readback(real, "checkpoint metric", "acc") == real


def test_the_handle_holds_its_own_copy_of_the_stopping_policy():
    policy = nx.EarlyStopping(patience=3)
    nitro = nx.Nitro(Tiny(), early_stop=policy, **quiet())
    held = nitro.early_stop
    assert held is not policy and policy.metric is None  # the instance is untouched
    assert (held.metric, held.mode, held.patience) == ("loss", "min", 3)
    assert nx.Nitro(Tiny(), **quiet()).early_stop is None


def test_a_custom_stopping_policy():
    class AfterTwo:
        def should_stop(self, epoch, metrics):
            return epoch >= 2

    nitro = nx.Nitro(Tiny(max_epochs=5), early_stop=AfterTwo(), **quiet())
    nitro.train()
    assert nitro.stop_reason == "early_stop" and nitro.current_epoch == 2


def test_early_stopping_refusals():
    with pytest.raises(nx.ConfigError, match="early_stop needs a val split"):
        nx.Nitro(OneBatch(), early_stop=nx.EarlyStopping(), **quiet())
    with pytest.raises(nx.ConfigError, match="patience=0\\) must be an int >= 1"):
        nx.EarlyStopping(patience=0)
    with pytest.raises(
        nx.ConfigError, match="EarlyStopping watches `acc`, but Tiny defines no metrics"
    ):
        nx.Nitro(
            Tiny(), early_stop=nx.EarlyStopping(metric="acc", mode="max"), **quiet()
        )


@pytest.mark.parametrize("given", [{"metric": "acc"}, {"mode": "max"}])
@pytest.mark.parametrize("owner", ["EarlyStopping", "Plateau"])
def test_half_a_metric_and_mode_is_refused(owner, given):
    half = "a metric without its mode" if "metric" in given else "a mode without"
    with pytest.raises(nx.ConfigError, match=f"{owner}\\(metric=.*gives {half}"):
        if owner == "EarlyStopping":
            nx.EarlyStopping(**given)
        else:
            nx.Plateau(0.01, **given)


def sam_reference(rule, steps, params0, lr=0.05):
    """SAM / ASAM by hand: gradient at w + eps, RAdam on it."""
    tx = optax.radam(lr)
    params, state = params0, tx.init(params0)
    e = Tiny()
    for _ in range(steps):
        grad_fn = jax.grad(lambda p: loss_of(e, p, BATCH))
        g = grad_fn(params)
        if rule == "sam":
            norm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g)))
            eps = jax.tree.map(lambda x, n=norm: 0.05 * x / (n + 1e-12), g)
        else:
            t = {
                k: (jnp.abs(w) + 0.01 if w.ndim >= 2 else jnp.ones_like(w))
                for k, w in params.items()
            }
            tg = {k: t[k] * g[k] for k in g}
            norm = jnp.sqrt(sum(jnp.sum(x * x) for x in tg.values()))
            eps = {k: 0.5 * t[k] * t[k] * g[k] / (norm + 1e-12) for k in g}
        g2 = grad_fn(jax.tree.map(lambda p, d: p + d, params, eps))
        updates, state = tx.update(g2, state, params)
        params = optax.apply_updates(params, updates)
    return params


@pytest.mark.parametrize("rule", ["sam", "asam"])
def test_sam_and_asam_match_a_direct_implementation(rule):
    class Sharp(OneBatch):
        def grad_rule(self):
            return nx.SAM(0.05) if rule == "sam" else nx.ASAM(0.5, eta=0.01)

    nitro = nx.Nitro(Sharp(max_epochs=3), **quiet())
    nitro.train()
    assert_trees_close(
        nitro.parameters, sam_reference(rule, 3, initial_params()), rtol=1e-4
    )


def test_rho_is_an_input_and_schedulable():
    class Sharp(OneBatch):
        def grad_rule(self):
            return nx.SAM(0.05)

    nx.Nitro(Sharp(max_epochs=1), **quiet()).train()
    before = nx.cache_stats()["misses"]
    nx.Nitro(
        Sharp(max_epochs=1),
        schedules={"rho": lambda total: lambda t: 0.01 * t},
        **quiet(),
    ).train()
    assert nx.cache_stats()["misses"] == before


def test_a_custom_perturb_rule_is_keyed_by_its_code_and_fields():
    def shift_rule(scale):
        # Every rule this makes has the same qualname; only the closure differs.
        @dataclasses.dataclass(frozen=True)
        class Shift(nx.PerturbRule):
            def perturbation(self, grads, params, masks, values):
                return jax.tree.map(lambda g: scale * jnp.sign(g), grads)

        return Shift

    class Plain(nx.PerturbRule):  # not a dataclass: its attributes are its fields
        def __init__(self, scale):
            self.scale = scale

        def perturbation(self, grads, params, masks, values):
            return jax.tree.map(lambda g: self.scale * jnp.sign(g), grads)

    def trained(rule):
        class Sharp(OneBatch):
            def grad_rule(self):
                return rule

        nitro = nx.Nitro(Sharp(max_epochs=2), **quiet())
        nitro.train()
        return nitro.parameters

    plain = nx.Nitro(OneBatch(max_epochs=2), **quiet())
    plain.train()
    for zero, big in [(shift_rule(0.0)(), shift_rule(5.0)()), (Plain(0.0), Plain(5.0))]:
        assert_trees_close(trained(zero), plain.parameters)  # eps = 0: one pass's
        before = nx.cache_stats()["misses"]
        moved = trained(big)
        assert nx.cache_stats()["misses"] == before + 1
        assert not np.allclose(moved["w1"], plain.parameters["w1"])


def test_a_rule_field_that_cannot_key_a_program_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Listed(nx.PerturbRule):
        scales: list

    class Sharp(OneBatch):
        def grad_rule(self):
            return Listed([0.1])

    with pytest.raises(nx.ConfigError, match="field `scales` = \\[0.1\\].*hashable"):
        nx.Nitro(Sharp(), **quiet())


def test_ema_tracks_the_weights_and_is_what_evaluation_reads(tmp_path):
    nitro = nx.Nitro(OneBatch(max_epochs=4), ema=nx.EMA(0.9), **quiet())
    history = []
    params = initial_params()
    expected = params
    tx = optax.radam(0.05)
    state = tx.init(params)
    for t in range(4):
        grads = jax.grad(lambda p: loss_of(Tiny(), p, BATCH))(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        d = min(0.9, (1 + t) / (10 + t))
        expected = jax.tree.map(lambda a, p, d=d: d * a + (1 - d) * p, expected, params)
        history.append(d)
    nitro.train()
    assert_trees_close(nitro.train_state.ema, expected)
    assert_trees_close(nitro.parameters, params)
    out = nitro.predict({"x": BATCH["x"]})
    np.testing.assert_allclose(
        out, np.asarray(mlp(expected, jnp.asarray(BATCH["x"]))), rtol=1e-5
    )


def test_ema_is_checkpointed_resumed_and_loadable(tmp_path):
    kw = {"run_dir": str(tmp_path), "logger": None, "ema": nx.EMA(0.9)}
    straight = nx.Nitro(Tiny(max_epochs=3), **kw)
    straight.train()
    (tmp_path / "b").mkdir()
    kw_b = {**kw, "run_dir": str(tmp_path / "b")}
    nx.Nitro(Tiny(max_epochs=1), **kw_b).train()
    resumed = nx.Nitro(Tiny(max_epochs=3), resume="auto", **kw_b)
    resumed.train()
    for a, b in zip(
        jax.tree.leaves(resumed.train_state.ema),
        jax.tree.leaves(straight.train_state.ema),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    newest = max(nx.read_manifest(str(tmp_path)), key=lambda e: e.epoch)
    loaded = nx.Nitro(
        Tiny(),
        weights=str(tmp_path / newest.file),
        load_ema=True,
        **{"logger": None, "checkpointer": None},
    )
    assert_trees_close(loaded.parameters, straight.train_state.ema, rtol=0, atol=0)
    with pytest.raises(nx.ConfigError, match='eval_weights="ema" needs an EMA'):
        nx.Nitro(Tiny(), eval_weights="ema", **quiet())


def test_no_decay_mask_changes_compile_nothing():
    class Decayed(OneBatch):
        decay_biases: bool = False  # Host: a new value is the same program

        def weight_decay(self, group=None):
            return 0.1

        def no_decay(self, keypath, leaf):
            return nx.default_no_decay(keypath, leaf) and not self.decay_biases

    first = nx.Nitro(Decayed(max_epochs=3), **quiet())
    first.train()
    before = nx.cache_stats()["misses"]
    second = nx.Nitro(Decayed(max_epochs=3, decay_biases=True), **quiet())
    second.train()
    assert nx.cache_stats()["misses"] == before
    assert float(first.prepared.plan.groups[0].mask["b1"]) == 0.0
    assert float(second.prepared.plan.groups[0].mask["b1"]) == 1.0
    # The biases start at zero, so decay moves them from the second step on.
    assert not np.array_equal(first.parameters["b1"], second.parameters["b1"])


def lowered_step(plan, params, by_hand=False):
    """The stablehlo lines of one optimizer step, from the plan or written by hand.

    By hand: RAdam, then (if the plan decays) `u - mask * (lambda * w)`, decay toward
    zero with no anchor term at all.
    """

    def step(p, state, grads, hp):
        if not by_hand:
            return plan.apply(None, Weights(p, state, None), grads, hp)[:2]
        group = hp["groups"]["default"]

        def decay_update(updates, state, p):
            def pull(u, w, m):
                return u - (m * (group["weight_decay"] * w)).astype(u.dtype)

            return jax.tree.map(pull, updates, p, group["no_decay_mask"]), state

        tx = optax.radam(group["learning_rate"])
        if plan.groups[0].decays:
            decay = optax.GradientTransformation(
                lambda p: optax.EmptyState(), decay_update
            )
            tx = optax.chain(tx, decay)
        updates, state = tx.update(grads, state, p)
        new = jax.tree.map(lambda a, u: (a + u).astype(a.dtype), p, updates)
        return new, state

    args = (params, plan.init_state(params), params, plan.step_inputs(0))
    text = jax.jit(step).lower(*args).as_text()
    return [line for line in text.splitlines() if "stablehlo." in line]


def test_zero_decay_emits_no_decay_and_zero_anchor_no_subtraction():
    class Decayed(OneBatch):
        def weight_decay(self, group=None):
            return 0.1

    nx.cache_reset()
    plain = nx.Nitro(OneBatch(max_epochs=1), **quiet())
    decayed = nx.Nitro(Decayed(max_epochs=1), **quiet())
    plain.train()
    decayed.train()
    keys = [k for k in program_cache().program_keys() if k.kind == "train_step"]
    assert len(keys) == 2
    assert len({k.baked for k in keys}) == 2  # decay is part of the program's key
    assert not plain.prepared.plan.groups[0].decays
    assert (
        decayed.prepared.plan.groups[0].decays
        and decayed.prepared.plan.groups[0].anchor is None
    )

    params = initial_params()
    # Zero decay: exactly the bare rule's program, no decay ops at all.
    bare = lowered_step(plain.prepared.plan, params)
    assert bare == lowered_step(plain.prepared.plan, params, by_hand=True)
    # Decay toward zero: exactly `u - mask * (lambda * w)`, no `w - anchor`.
    toward_zero = lowered_step(decayed.prepared.plan, params)
    assert toward_zero == lowered_step(decayed.prepared.plan, params, by_hand=True)
    # An explicit (all-zero) anchor tree does emit the subtraction, once per leaf.
    group = dataclasses.replace(
        decayed.prepared.plan.groups[0], anchor=jax.tree.map(jnp.zeros_like, params)
    )
    anchored = lowered_step(
        dataclasses.replace(decayed.prepared.plan, groups=(group,)), params
    )

    def subtractions(lines):
        return sum("stablehlo.subtract" in line for line in lines)

    leaves = len(jax.tree.leaves(params))
    assert subtractions(toward_zero) == subtractions(bare) + leaves  # u - step
    assert subtractions(anchored) == subtractions(toward_zero) + leaves  # w - anchor


def test_resume_refuses_a_different_decay_anchor(tmp_path):
    class Anchored(Tiny):
        def weight_decay(self, group=None):
            return 0.1

        def decay_anchor(self, group=None):
            return "w0"

    kw = {"run_dir": str(tmp_path), "logger": None}
    nx.Nitro(Anchored(max_epochs=1), **kw).train()
    nx.Nitro(Anchored(max_epochs=2), resume="auto", **kw).train()  # same anchor: fine
    zeros = jax.tree.map(jnp.zeros_like, initial_params())
    with pytest.raises(nx.ConfigError, match="decays toward an anchor that differs"):
        nx.Nitro(Anchored(max_epochs=3), resume="auto", w0=zeros, **kw)


def test_resuming_an_l2_sp_run_names_the_w0_tree_it_needs(tmp_path):
    class Anchored(Tiny):
        def weight_decay(self, group=None):
            return 0.1

        def decay_anchor(self, group=None):
            return "w0"

    source = str(tmp_path / "source")
    nx.Nitro(Tiny(max_epochs=1, n_train=16), run_dir=source, logger=None).train()
    weights = str(tmp_path / "source" / nx.read_manifest(source)[-1].file)
    kw = {"run_dir": str(tmp_path / "tuned"), "logger": None}
    nx.Nitro(Anchored(max_epochs=1), weights=weights, w0="weights", **kw).train()
    with pytest.raises(
        nx.ConfigError,
        match=r'w0="weights" .* a resume takes no weights=.* pass the transferred '
        r"tree itself as w0=<tree>, e\.g\. w0=Nitro\(e, weights=",
    ):
        nx.Nitro(Anchored(max_epochs=2), resume="auto", w0="weights", **kw)
    with pytest.raises(
        nx.ConfigError,
        match=r'checksum mismatch.* a run trained with w0="weights" \(L2-SP\) or '
        r"w0=<tree> resumes with that tree passed as w0=<tree>",
    ):
        nx.Nitro(Anchored(max_epochs=2), resume="auto", **kw)
    tree = nx.Nitro(Tiny(), weights=weights, **quiet()).parameters
    resumed = nx.Nitro(Anchored(max_epochs=2), resume="auto", w0=tree, **kw)
    assert resumed.current_epoch == 1


def test_w0_refusals():
    with pytest.raises(nx.ConfigError, match='w0="weights" anchors to the parameters'):
        nx.Nitro(OneBatch(), w0="weights", **quiet())
    with pytest.raises(nx.ConfigError, match="w0='latest'"):
        nx.Nitro(OneBatch(), w0="latest", **quiet())


class AnchoredAt(OneBatch):
    """OneBatch decaying toward `anchor`: "w0" or a tree."""

    anchor = "w0"

    def weight_decay(self, group=None):
        return 0.1

    def decay_anchor(self, group=None):
        return self.anchor


def test_w0_and_anchor_trees_must_match_the_parameters_leaf_for_leaf():
    scalars = {"w1": jnp.zeros(()), "b1": jnp.zeros(()), "w2": jnp.zeros((1,))}
    with pytest.raises(
        nx.ConfigError,
        match=r"w0 is a tree that does not match the parameters leaf for leaf: its "
        r"leaf \['b1'\] has shape \(\) where the parameter has shape \(16,\)\. "
        r"Pass a tree shaped like what build_model returns",
    ):
        nx.Nitro(AnchoredAt(), w0=scalars, **quiet())
    with pytest.raises(nx.ConfigError, match=r"w0 .* it has no leaf at \['w2'\]"):
        nx.Nitro(
            AnchoredAt(), w0={"w1": jnp.zeros((8, 16)), "b1": jnp.zeros(16)}, **quiet()
        )

    class TreeAnchored(AnchoredAt):
        anchor = scalars

    with pytest.raises(
        nx.ConfigError,
        match=r"decay_anchor\('default'\) returned a tree that does not match the "
        r"parameters leaf for leaf \(its leaf \['b1'\] has shape \(\)",
    ):
        nx.Nitro(TreeAnchored(), **quiet())


def test_grad_rule_with_hp_reads_bind_values():
    seen = []

    class Warming(OneBatch):
        def grad_rule(self, hp):
            seen.append(hp["bind"]["sam_warm"])
            return nx.SAM(0.05 * hp["bind"]["sam_warm"])

    schedules = {"bind": {"sam_warm": lambda total: lambda t: min(1.0, t / 2)}}
    nitro = nx.Nitro(Warming(max_epochs=3), schedules=schedules, **quiet())
    nitro.train()
    assert seen[-3:] == [0.0, 0.5, 1.0]

    class Changes(OneBatch):
        def grad_rule(self, hp):
            return nx.SAM(0.05) if hp["bind"]["flip"] < 1 else nx.ASAM(0.5)

    flip = {"bind": {"flip": lambda total: lambda t: float(t)}}
    with pytest.raises(
        nx.ConfigError, match="the rule's type and its unscheduled fields"
    ):
        nx.Nitro(Changes(max_epochs=3), schedules=flip, **quiet()).train()


def test_grad_rule_with_hp_places_the_scheduled_values():
    class Doubled(OneBatch):
        def grad_rule(self, hp):
            return nx.SAM(2.0 * hp.get("rho", 0.05))

    class Direct(OneBatch):
        def grad_rule(self):
            return nx.SAM(0.1)

    placed = nx.Nitro(Doubled(max_epochs=2), schedules={"rho": 0.05}, **quiet())
    placed.train()
    direct = nx.Nitro(Direct(max_epochs=2), **quiet())
    direct.train()
    assert_trees_close(placed.parameters, direct.parameters, rtol=0, atol=0)


def test_grad_rule_with_hp_gets_step_zero_values_at_setup():
    class Placed(OneBatch):
        def grad_rule(self, hp):
            return nx.SAM(hp["rho"] * hp["bind"]["warm"])

    schedules = {
        "rho": lambda total: lambda t: 0.05 * (1 + t),
        "bind": {"warm": lambda total: lambda t: 0.5 + t},
    }
    nitro = nx.Nitro(Placed(max_epochs=1), schedules=schedules, **quiet())
    assert nitro.prepared.plan.grad_rule == nx.SAM(0.05 * 0.5)
    with pytest.raises(
        nx.ConfigError,
        match=r"read hp\['rho'\], but no schedule sets the rule field `rho`.*"
        r"hp.get\('rho', default\)",
    ):
        nx.Nitro(Placed(), **quiet())
    with pytest.raises(
        nx.ConfigError,
        match=r"read hp\['bind'\]\['warm'\], but no schedule binds `warm` "
        r"\(bound: none\)",
    ):
        nx.Nitro(Placed(), schedules={"rho": 0.05}, **quiet())

    class Switches(OneBatch):
        def grad_rule(self, hp):
            return nx.SAM(hp["rho"]) if hp["bind"]["on"] > 0.5 else nx.SingleGrad()

    with pytest.raises(
        nx.ConfigError, match="which has no schedulable field for schedule `rho`"
    ):
        nx.Nitro(Switches(), schedules={"rho": 0.05, "bind": {"on": 0.0}}, **quiet())
