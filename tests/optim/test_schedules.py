"""Schedules bound by name to rule fields, Device fields and the gradient rule, and
Plateau: binding refusals, what compiles (nothing) and what is logged.
"""

import json
import logging
import math
import re

import jax
import numpy as np
import optax
import pytest
from experiments import Tiny
from optim_reference import Grouped, Level2, OneBatch, quiet

import jaxnitro as nx


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
        log_every_n_steps=1,
        steps_per_call=1,  # "auto" (an accelerator's default) compiles a call of k
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


class AdamGroups(Tiny):
    """Tiny in two groups on a level-1 Adam, the encoder at a tenth of the rate."""

    def param_group(self, keypath):
        return "encoder" if keypath[0] in ("w1", "b1") else "default"

    def learning_rate(self, group=None):
        return 0.005 if group == "encoder" else 0.05

    def optimizer(self):
        return optax.adam


@pytest.mark.parametrize("steps_per_call", [1, 2])
def test_which_keys_a_run_schedules_compiles_nothing(steps_per_call):
    """Every group's schedulable rule fields are inputs of the training program
    from the first program on: a run that schedules other keys, other groups' keys
    or none reuses it."""
    varying = lambda total: lambda t: 0.01 / (t + 1)  # noqa: E731
    runs = [
        {},
        {"learning_rate": varying},
        {"opt.encoder.learning_rate": varying},
        {"b1": varying},
        {"opt.encoder.b1": 0.8, "opt.default.eps": 1e-6},
        {"b2": 0.99, "eps_root": 1e-9},
        {},
    ]

    def run(schedules):
        kw = quiet(schedules=schedules, steps_per_call=steps_per_call)
        nitro = nx.Nitro(AdamGroups(max_epochs=1), **kw)
        nitro.train()
        return nitro

    run(runs[0])
    before = nx.cache_stats()["misses"]
    for schedules in runs[1:]:
        run(schedules)
        assert nx.cache_stats()["misses"] == before, schedules


def test_a_schedule_of_a_fields_default_trains_as_no_schedule_bitwise():
    """An unscheduled rule field reaches the rule as its default, the same slot a
    schedule writes: scheduling the default changes nothing, bit for bit."""

    def weights(schedules):
        nitro = nx.Nitro(AdamGroups(max_epochs=1), **quiet(schedules=schedules))
        nitro.train()
        return [np.asarray(x) for x in jax.tree.leaves(nitro.train_state.params)]

    plain = weights({})
    same = weights({"b1": 0.9, "opt.encoder.b2": 0.999, "eps": 1e-8})
    for a, b in zip(plain, same, strict=True):
        np.testing.assert_array_equal(a, b)


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
            log_every_n_steps=1,
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
        log_every_n_steps=1,
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
