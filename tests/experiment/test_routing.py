"""Required hooks, keyword routing, training(), outputs, loss terms."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from experiments import Tiny, make_batches, mlp

import jaxnitro as nx


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


@pytest.mark.parametrize("missing", ["build_model", "build_data", "forward", "loss"])
def test_missing_required_hook_raises_naming_it(missing):
    hooks = {
        "build_model": lambda self, rng: Tiny.build_model(self, rng),
        "build_data": lambda self, dist: Tiny.build_data(Tiny(), dist),
        "forward": Tiny.forward,
        "loss": Tiny.loss,
    }
    del hooks[missing]
    cls = type(
        "Partial",
        (nx.Experiment,),
        {**hooks, "__annotations__": {"width": int}, "width": 4},
    )
    with pytest.raises(
        nx.HookError, match=f"does not define the required hook `{missing}`"
    ):
        nx.Nitro(cls(), **quiet())


def test_missing_required_field_names_hook_and_field():
    class NeedsMask(Tiny):
        def loss(self, logits, *, y, mask):
            return Tiny.loss(self, logits, y=y)

    with pytest.raises(nx.RoutingError) as info:
        nx.Nitro(NeedsMask(), **quiet())
    message = str(info.value)
    assert "`loss` declares the batch field `mask`" in message
    assert "The batch has: x, y" in message


class Optional(Tiny):
    def forward(self, model, params, state, *, x, scale=None):
        out = mlp(params, x)
        return (out if scale is None else out * scale[:, None]), state


def test_defaulted_keyword_is_optional_and_routed_when_present():
    nitro = nx.Nitro(Optional(), **quiet())
    x = np.ones((4, 8), np.float32)
    plain = nitro.predict({"x": x})
    scaled = nitro.predict({"x": x, "scale": np.full(4, 2.0, np.float32)})
    np.testing.assert_allclose(scaled, 2 * plain, rtol=1e-5)


def test_var_keyword_receives_every_field():
    seen = {}

    class TakesAll(Tiny):
        def loss(self, logits, **batch):
            seen["fields"] = sorted(batch)
            return Tiny.loss(self, logits, y=batch["y"])

    nitro = nx.Nitro(TakesAll(max_epochs=1), **quiet())
    nitro.train()
    assert seen["fields"] == ["x", "y"]


class StaticHooks(Tiny):
    @staticmethod
    def loss(logits, *, y):
        return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(logits), -1))

    @classmethod
    def metrics(cls, logits, *, y):
        return {"acc": ((logits.argmax(-1) == y.argmax(-1)).sum(), len(y))}

    def monitor(self):
        return ("acc", "max")


def test_staticmethod_and_classmethod_hooks_get_only_their_fields():
    nitro = nx.Nitro(StaticHooks(max_epochs=1), **quiet())
    nitro.train()
    assert set(nitro.validate()) == {"acc"}  # metrics replace the loss


def test_an_edited_staticmethod_hook_compiles_a_new_program():
    def scaled(scale):
        class Scaled(Tiny):
            @staticmethod
            def loss(logits, *, y):
                return scale * -jnp.mean(jnp.sum(y * jax.nn.log_softmax(logits), -1))

        return Scaled

    once = nx.Nitro(scaled(1.0)(), **quiet()).validate()["loss"]
    twice = nx.Nitro(scaled(2.0)(), **quiet()).validate()["loss"]
    assert twice == pytest.approx(2 * once, rel=1e-5)


def test_an_undeclared_field_is_never_transferred():
    class WithNames(Tiny):
        def build_data(self, dist):
            return {
                "train": make_batches(32, 16, extra=True),
                "val": make_batches(20, 16, seed=1, extra=True),
            }

    from jaxnitro.compile.cache import program_cache

    nx.compile.cache_reset()
    nitro = nx.Nitro(WithNames(max_epochs=1), **quiet())
    nitro.train()
    nitro.predict(make_batches(16, 16, extra=True)[0])
    inputs = {key.kind: str(key.signature[0]) for key in program_cache().program_keys()}
    assert "{'x': *, 'y': *}" in inputs["train_step"]
    assert "{'x': *}" in inputs["eval_forward"]
    assert not [text for text in inputs.values() if "'name'" in text]
    assert np.isfinite(nitro.history[-1]["loss"])


def test_training_mode_is_visible_at_trace_time():
    modes = []

    class Recorder(Tiny):
        def forward(self, model, params, state, *, x):
            modes.append(nx.training())
            return mlp(params, x), state

    nitro = nx.Nitro(Recorder(max_epochs=1), **quiet())
    nitro.train()
    assert True in modes and False in modes
    assert nx.training() is False


def test_outputs_without_batch_dimension_raise_on_eval():
    class Reduced(Tiny):
        def forward(self, model, params, state, *, x):
            logits = mlp(params, x)
            return {"logits": logits, "mean": logits.mean()}, state

        def loss(self, out, *, y):
            return Tiny.loss(self, out["logits"], y=y)

    nitro = nx.Nitro(Reduced(), **quiet())
    with pytest.raises(nx.HookError, match=r"output leaf \['mean'\] has shape \(\)"):
        nitro.validate()


def test_dict_outputs_pass_unchanged_to_loss_and_metrics():
    class TwoHeads(Tiny):
        def forward(self, model, params, state, *, x):
            logits = mlp(params, x)
            return {"logits": logits, "energy": jnp.sum(logits**2, -1)}, state

        def loss(self, out, *, y):
            return Tiny.loss(self, out["logits"], y=y) + 0.0 * out["energy"].mean()

        def metrics(self, out, *, y):
            assert set(out) == {"logits", "energy"} and out["energy"].shape == (len(y),)
            return {"energy": (out["energy"].sum(), len(y))}

        def monitor(self):
            return ("energy", "min")

    nitro = nx.Nitro(TwoHeads(max_epochs=1), **quiet())
    nitro.train()
    out = nitro.predict({"x": np.ones((3, 8), np.float32)})
    assert out["logits"].shape == (3, 3) and out["energy"].shape == (3,)
    assert "energy" in nitro.history[-1]


def test_loss_terms_are_logged_from_the_gradient_program(tmp_path):
    class WithTerms(Tiny):
        def loss(self, logits, *, y):
            ce = Tiny.loss(self, logits, y=y)
            reg = 0.01 * jnp.mean(logits**2)
            return ce + reg, {"ce": ce, "reg": reg}

    nitro = nx.Nitro(
        WithTerms(max_epochs=1),
        run_dir=str(tmp_path),
        checkpointer=None,
        log_every_n_steps=1,
    )
    nitro.train()
    lines = [
        json.loads(line)
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    train = [line for line in lines if line.get("context") == "train"]
    assert len(train) == 4
    assert {"loss", "loss/ce", "loss/reg"} <= set(train[0])
    assert train[0]["loss"] == pytest.approx(
        train[0]["loss/ce"] + train[0]["loss/reg"], rel=1e-5
    )


def test_forward_must_return_outputs_and_state():
    class NoState(Tiny):
        def forward(self, model, params, state, *, x):
            return mlp(params, x)

    with pytest.raises(
        nx.HookError, match=r"`forward` must return \(outputs, new_state\)"
    ):
        nx.Nitro(NoState(), **quiet()).predict({"x": np.ones((2, 8), np.float32)})


def test_a_non_numeric_declared_field_is_refused_at_setup():
    class Strings(Tiny):
        def build_data(self, dist):
            batches = make_batches(32, 16)
            for b in batches:
                b["x"] = np.array(["a"] * 16)
            return {"train": batches}

    with pytest.raises(
        nx.ConfigError, match="Batch field `x` of split `train` is not a numeric array"
    ):
        nx.Nitro(Strings(), **quiet())


def test_one_shot_iterator_is_refused():
    class OneShot(Tiny):
        def build_data(self, dist):
            return {"train": iter(make_batches(32, 16))}

    with pytest.raises(nx.ConfigError, match="Split `train` is a one-shot iterator"):
        nx.Nitro(OneShot(), **quiet())
