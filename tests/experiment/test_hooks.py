"""The stale-handle report: a handle keeps what it froze and says so."""

import numpy as np
import pytest
from experiments import Tiny

import jaxnitro as nx


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


def fresh_class():
    return type("Fresh", (Tiny,), {"__module__": __name__})


def test_nothing_changed_reports_nothing():
    cls = fresh_class()
    nitro = nx.Nitro(cls(max_epochs=1), accum=2, **quiet())
    nitro.train()  # warnings are errors in this suite: silence is the assertion
    nitro.validate()


def test_redefined_accessor_is_reported_and_the_handle_keeps_its_value():
    cls = fresh_class()
    nitro = nx.Nitro(cls(max_epochs=1), **quiet())
    cls.accum = lambda self: 4
    with pytest.warns(nx.StaleHandleWarning) as record:
        nitro.train()
    message = str(record[0].message)
    assert (
        "Fresh has values fixed at construction that have since been redefined"
        in message
    )
    assert (
        "`accum()` was redefined: it returned 1 at construction and returns 4 now"
        in message
    )
    assert "This handle still uses 1; rebuild to pick up 4." in message
    assert nitro.current_step == 4  # 4 batches at accum 1, not 1 step at accum 4
    assert nitro.frozen()["accum"] == 1


def test_a_keyword_is_not_mistaken_for_a_stale_accessor():
    cls = fresh_class()
    nitro = nx.Nitro(cls(max_epochs=1), accum=2, **quiet())
    nitro.train()
    assert nitro.current_step == 2


def test_an_accessor_redefined_after_its_keyword_was_passed_is_not_reported():
    cls = fresh_class()
    nitro = nx.Nitro(cls(max_epochs=1), accum=2, **quiet())
    cls.accum = lambda self: 4
    nitro.train()  # warnings are errors in this suite: silence is the assertion
    assert nitro.current_step == 2


def test_a_monitor_spelled_val_loss_is_not_reported_as_redefined():
    cls = fresh_class()
    cls.monitor = lambda self: ("val_loss", "min")
    with pytest.warns(DeprecationWarning, match='spelled "loss"'):
        nitro = nx.Nitro(cls(max_epochs=1), **quiet())
    nitro.train()  # no StaleHandleWarning: the pair is the same once read


def test_redefined_hook_is_reported_and_the_old_code_keeps_running():
    cls = fresh_class()
    nitro = nx.Nitro(cls(), **quiet())
    expected = nx.Nitro(Tiny(), **quiet()).validate()["loss"]

    def loss(self, logits, *, y):
        return 100.0 * Tiny.loss(self, logits, y=y)

    cls.loss = loss
    with pytest.warns(
        nx.StaleHandleWarning,
        match=r"hooks were redefined after this `Nitro` was built \(loss\)",
    ):
        result = nitro.validate()
    assert result["loss"] == pytest.approx(expected, rel=1e-6)
    rebuilt = nx.Nitro(cls(), **quiet()).validate()["loss"]
    assert rebuilt == pytest.approx(100 * expected, rel=1e-5)


def test_validate_checks_seed_and_run_dir_only():
    cls = fresh_class()
    nitro = nx.Nitro(cls(), **quiet())
    cls.accum = lambda self: 4
    nitro.validate()  # accum is not validate's concern
    cls.seed = lambda self: 7
    with pytest.warns(
        nx.StaleHandleWarning, match="`seed\\(\\)` was redefined: it returned 42"
    ):
        nitro.evaluate(split="test")


def test_set_config_report_silences_it():
    cls = fresh_class()
    nitro = nx.Nitro(cls(), **quiet())
    cls.seed = lambda self: 7
    previous = nx.observe.set_config_report(False)
    try:
        nitro.validate()
    finally:
        nx.observe.set_config_report(previous)


def test_repr_lists_the_frozen_values(tmp_path):
    nitro = nx.Nitro(
        Tiny(max_epochs=3),
        accum=2,
        gradient_clip_norm=1.0,
        run_dir=str(tmp_path / "r"),
        **quiet(),
    )
    text = repr(nitro)
    assert text.startswith("Nitro(Tiny) values fixed at construction")
    for piece in (
        "seed 42",
        "accum 2",
        "max_epochs 3",
        "total 6",
        "clip 1.0",
        f"run_dir {tmp_path / 'r'}",
        "step 0",
        "epoch 0",
    ):
        assert piece in text


def test_an_autoreload_style_patch_does_not_change_a_built_handle():
    cls = fresh_class()

    def forward(self, model, params, state, *, x):
        return Tiny.forward(self, model, params, state, x=x), state  # wrong on purpose

    def good_forward(self, model, params, state, *, x):
        return Tiny.forward(self, model, params, state, x=x)

    cls.forward = good_forward
    nitro = nx.Nitro(cls(), **quiet())
    good_forward.__code__ = forward.__code__  # what IPython's autoreload does
    with pytest.warns(nx.StaleHandleWarning, match="forward"):
        out = nitro.evaluate(split="test")
    assert np.isfinite(out["loss"])


def _scale(x):
    return x


def test_a_helper_rebound_in_its_module_after_construction_does_not_reach_the_handle():
    """A reload re-executes the module into the same globals: a handle that has not
    compiled yet must still trace the helper it was built with."""

    class ScaledLoss(Tiny):
        def loss(self, logits, *, y):
            return _scale(Tiny.loss(self, logits, y=y))

    ScaledLoss.__module__ = __name__
    nitro = nx.Nitro(ScaledLoss(), **quiet())
    expected = nx.Nitro(Tiny(), **quiet()).validate()["loss"]
    original = globals()["_scale"]
    globals()["_scale"] = lambda x: 10.0 * x
    try:
        with pytest.warns(nx.StaleHandleWarning, match=r"\(loss\)"):
            got = nitro.validate()["loss"]
    finally:
        globals()["_scale"] = original
    assert got == pytest.approx(expected)


def _make_repeat():
    def repeat(x, n):  # a recursive closure: its own cell holds it
        return x if n == 0 else repeat(x, n - 1)

    return repeat


_repeat = _make_repeat()


def test_a_hook_calling_a_recursive_closure_is_frozen_and_runs():
    class Repeats(Tiny):
        def loss(self, logits, *, y):
            return _repeat(Tiny.loss(self, logits, y=y), 3)

    Repeats.__module__ = __name__
    expected = nx.Nitro(Tiny(), **quiet()).validate()["loss"]
    assert nx.Nitro(Repeats(), **quiet()).validate()["loss"] == pytest.approx(expected)


def _head(x):
    return x


def test_a_helper_patched_in_place_after_construction_keeps_one_version_per_handle():
    """IPython's autoreload patches a helper's `__code__`: a handle that compiles a
    program after the patch must trace the helper it was built with, as its programs
    compiled before the patch do; a new handle runs the new code."""

    class HeadedLoss(Tiny):
        def loss(self, logits, *, y):
            return _head(Tiny.loss(self, logits, y=y))

    HeadedLoss.__module__ = __name__
    expected = nx.Nitro(Tiny(), **quiet()).validate()["loss"]
    nitro = nx.Nitro(HeadedLoss(), **quiet())
    original = _head.__code__
    _head.__code__ = (lambda x: 10.0 * x).__code__
    try:
        with pytest.warns(nx.StaleHandleWarning, match=r"\(loss\)"):
            got = nitro.validate()["loss"]
        rebuilt = nx.Nitro(HeadedLoss(), **quiet()).validate()["loss"]
    finally:
        _head.__code__ = original
    assert got == pytest.approx(expected)
    assert rebuilt == pytest.approx(10.0 * expected)


def test_a_redefined_optimizer_is_reported_and_the_handle_keeps_its_rule():
    import optax

    cls = fresh_class()
    cls.optimizer = lambda self: optax.sgd
    nitro = nx.Nitro(cls(max_epochs=1), **quiet())
    cls.optimizer = lambda self: optax.adam
    with pytest.warns(nx.StaleHandleWarning, match=r"\(optimizer\)"):
        nitro.train()
    assert nitro.prepared.plan.groups[0].rule.build is optax.sgd
