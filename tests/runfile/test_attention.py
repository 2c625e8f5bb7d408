"""`gpt`'s attention (`nn_modules.ATTENTIONS`, `:attention`): "xla" traces the
written-out program as before; "auto", the default, compiles to it on this CPU and
to the kernel on a TPU; "flash", the Pallas TPU flash attention kernel run
here through Pallas's TPU interpret mode, gives the written-out values and
gradients; unknown names are refused, and "flash" off a TPU when the parameters are
built, never while a run file is checked."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from gpt_params import (
    OFF_BACKEND,
    TINY,
    assert_gradients_close,
    loss_fn,
    random_params,
    tokens,
)
from jax.experimental.pallas import tpu as pltpu
from jax.extend import core as jcore
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxnitro.cli import main
from jaxnitro.runfile.check import check_file
from jaxnitro.runfile.engine import compile_run, graph_key
from jaxnitro.runfile.evaluator import evaluate_file
from jaxnitro.runfile.nn_attention import check_attention_backend
from jaxnitro.runfile.nn_flash import flash_causal_attention
from jaxnitro.runfile.nn_modules import (
    ATTENTION_FUNCTIONS,
    ATTENTIONS,
    GPT,
    check_attention,
)
from jaxnitro.runfile.source import RunfileError
from jaxnitro.runfile.stdlib_nn import ATTENTION

from .conftest import MINIMAL

EXAMPLES = Path(__file__).parents[2] / "examples" / "runfiles"


interpreted = pytest.mark.skipif(
    jax.default_backend() == "tpu",
    reason="a TPU multiplies float32 in bfloat16 passes, so the written-out side "
    "is less exact there: the compiled kernel is compared instead (below)",
)
"""A comparison of the interpreted kernel with float32 references."""


def written_out(q, k, v):
    """Causal softmax attention of [batch, time, heads, head_dim] in NumPy (float64)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    time, head_dim = q.shape[1], q.shape[3]
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(head_dim)
    scores = np.where(np.tril(np.ones((time, time), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


def test_the_attentions_are_the_run_files():
    assert tuple(ATTENTIONS) == ATTENTION == ("auto", "xla", "flash", "cudnn")
    assert TINY.attention == "auto"
    assert GPT(32, 1, 8, 2, 4, rngs=nnx.Rngs(0)).attention == "auto"


def pallas_calls(attention: str, remat: str = "none") -> int:
    """The Pallas kernels the tiny model's forward and backward pass trace, counted
    through every nested program (the text of a jaxpr shows a repeated one once)."""
    spec = dataclasses.replace(TINY, attention=attention, remat=remat)
    jaxpr = jax.make_jaxpr(jax.grad(loss_fn(spec)))(random_params(TINY, 0), tokens(2))

    def count(jaxpr: jcore.Jaxpr) -> int:
        found = 0
        for eqn in jaxpr.eqns:
            found += eqn.primitive.name == "pallas_call"
            for value in eqn.params.values():
                for sub in value if isinstance(value, tuple | list) else (value,):
                    if isinstance(sub, jcore.ClosedJaxpr):
                        found += count(sub.jaxpr)
                    elif isinstance(sub, jcore.Jaxpr):
                        found += count(sub)
        return found

    return count(jaxpr.jaxpr)


def test_xla_traces_the_written_out_program_and_flash_two_kernels_a_block():
    # "xla" has no kernel in it; under "flash" each block's attention is the
    # kernel's forward pass and its fused backward one (dq, dk and dv together);
    # "auto" traces both, the kernel's branch for a TPU.
    assert pallas_calls("xla") == 0
    assert pallas_calls("flash") == pallas_calls("auto") == 2 * TINY.layers
    # Rematerialised, a block's forward pass runs again in the backward pass, the
    # kernel with it (the interpret mode cannot run under `checkpoint`, so the
    # values of this combination are compared on a TPU only, below).
    assert pallas_calls("flash", "blocks") == pallas_calls("flash", "dots") == 6


@pytest.mark.skipif(
    jax.default_backend() == "tpu", reason="on a TPU, auto compiles to the kernel"
)
def test_auto_compiles_to_the_written_out_attention_here_and_to_the_kernel_on_a_tpu():
    params, batch = random_params(TINY, 2), tokens(2)
    found = {}
    for attention in ("xla", "auto"):
        spec = dataclasses.replace(TINY, attention=attention)
        step = jax.jit(jax.value_and_grad(loss_fn(spec)))
        found[attention] = (step(params, batch), step.lower(params, batch))
    (loss, grads), lowered = found["auto"]
    (want, want_grads), _ = found["xla"]
    # The same program once lowered for this backend: equal to the last bit.
    assert np.asarray(loss) == np.asarray(want)
    for name in want_grads:
        np.testing.assert_array_equal(grads[name], want_grads[name], err_msg=name)
    assert "tpu_custom_call" not in lowered.as_text()
    # Lowered for a TPU (no TPU needed to lower): the kernel's forward and
    # backward calls, each one function of the module that every block calls.
    auto = jax.jit(jax.value_and_grad(loss_fn(TINY)))
    for_tpu = auto.trace(params, batch).lower(lowering_platforms=("tpu",))
    assert for_tpu.as_text().count("tpu_custom_call") == 2


@pytest.mark.needs_devices(4)
@pytest.mark.parametrize("attention", ["flash", "auto"])
def test_under_data_parallelism_each_device_runs_the_kernel_on_its_examples(attention):
    # XLA cannot partition a Mosaic kernel, and lowering one for several devices
    # raises; the kernel is mapped over the mesh's batch shards instead. Lowered
    # for a TPU here (no TPU needed): the module's two kernels, in a shard_map.
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    split = NamedSharding(mesh, PartitionSpec("data"))
    q, k, v = (
        jax.device_put(jax.random.normal(key, (8, 128, 2, 16)), split)
        for key in jax.random.split(jax.random.key(4), 3)
    )
    attend = ATTENTION_FUNCTIONS[attention]
    step = jax.jit(jax.value_and_grad(lambda *a: jnp.sum(attend(*a)), (0, 1, 2)))
    assert "shard_map" in str(jax.make_jaxpr(step)(q, k, v))
    lowered = step.trace(q, k, v).lower(lowering_platforms=("tpu",))
    assert lowered.as_text().count("tpu_custom_call") == 2
    # Inside a shard_map of the caller's, q is already one device's: no map of
    # its own (a second map over the same axis would split the batch again).
    mapped = jax.jit(
        jax.shard_map(
            lambda *a: attend(*a) * 2,
            mesh=mesh,
            in_specs=PartitionSpec("data"),
            out_specs=PartitionSpec("data"),
            check_vma=False,  # a Pallas kernel's output carries no varying axes
        )
    )
    assert str(jax.make_jaxpr(mapped)(q, k, v)).count("shard_map") == 1
    lowered = mapped.trace(q, k, v).lower(lowering_platforms=("tpu",))
    assert lowered.as_text().count("tpu_custom_call") == 1
    # A batch of 2 over 4 devices: the kernel runs whole on each, still lowered.
    two = [
        jax.device_put(x[:2], NamedSharding(mesh, PartitionSpec())) for x in (q, k, v)
    ]
    lowered = step.trace(*two).lower(lowering_platforms=("tpu",))
    assert lowered.as_text().count("tpu_custom_call") == 2


@interpreted
@pytest.mark.parametrize("time", [64, 128, 200])
def test_the_kernel_matches_a_direct_computation(time):
    # 64 and 200 are padded to the kernel's tile (128, 256 positions); 200 spans
    # two tiles, so the blocks above the diagonal are skipped.
    q, k, v = (
        jax.random.normal(key, (2, time, 2, 16))
        for key in jax.random.split(jax.random.key(time), 3)
    )
    cotangent = jax.random.normal(jax.random.key(1), q.shape)

    def xla(q, k, v):
        scale = q.shape[3] ** 0.5
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / scale
        causal = jnp.tril(jnp.ones((time, time), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        return jnp.einsum("bhqk,bkhd->bqhd", weights, v)

    def flash(q, k, v, cotangent):
        out, backward = jax.vjp(flash_causal_attention, q, k, v)
        return out, backward(cotangent)

    # Jitted: run eagerly, the interpreter's callbacks (which dispatch JAX ops of
    # their own) and the main thread's next op can deadlock on a 2-core CPU.
    with pltpu.force_tpu_interpret_mode():
        out, grads = jax.jit(flash)(q, k, v, cotangent)
    # Measured (f32): the outputs within 4.8e-7 of float64, the gradients within
    # 9.6e-7 of the written-out attention's (entries up to 6).
    np.testing.assert_allclose(out, written_out(q, k, v), rtol=1e-5, atol=2e-6)
    expected = jax.vjp(xla, q, k, v)[1](cotangent)
    for name, grad, want in zip("qkv", grads, expected, strict=True):
        np.testing.assert_allclose(grad, want, rtol=1e-5, atol=5e-6, err_msg=name)


def test_the_kernel_keeps_the_compute_dtype():
    q = jax.ShapeDtypeStruct((2, 64, 2, 16), jnp.bfloat16)
    assert jax.eval_shape(flash_causal_attention, q, q, q) == q
    spec = dataclasses.replace(TINY, attention="flash")
    params = {
        n: jax.ShapeDtypeStruct(s, jnp.bfloat16)
        for n, s in TINY.parameter_shapes().items()
    }
    inputs = jax.ShapeDtypeStruct((2, 64), jnp.int32)
    logits = jax.eval_shape(lambda p, x: spec.apply(p, x, None), params, inputs)
    assert logits == jax.ShapeDtypeStruct((2, 64, 256), jnp.bfloat16)


@interpreted
def test_flash_gives_the_written_out_loss_and_gradient():
    params, batch = random_params(TINY, 3), tokens(2)
    xla = jax.jit(jax.value_and_grad(loss_fn(TINY)))
    # Jitted, as above: eager interpreted kernels can deadlock on a 2-core CPU.
    flash = jax.jit(
        jax.value_and_grad(loss_fn(dataclasses.replace(TINY, attention="flash")))
    )
    with pltpu.force_tpu_interpret_mode():
        loss, grads = flash(params, batch)
    expected, expected_grads = xla(params, batch)
    # Measured (f32): the same loss to the last bit, every gradient within 1.2e-6
    # of its largest entry; the key biases, whose gradient is zero in exact
    # arithmetic, differ by rounding alone (1.7e-9).
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert_gradients_close(grads, expected_grads)


@pytest.mark.skipif(
    jax.default_backend() != "tpu",
    reason="the compiled kernel runs on a TPU only (scripts/device/tests.sh)",
)
@pytest.mark.parametrize("remat", ["none", "blocks"])
def test_on_a_tpu_the_compiled_kernel_gives_the_written_out_loss_and_gradient(remat):
    params, batch = random_params(TINY, 3), tokens(2)
    found = {}
    for attention in ("xla", "flash"):
        spec = dataclasses.replace(TINY, attention=attention, remat=remat)
        found[attention] = jax.jit(jax.value_and_grad(loss_fn(spec)))(params, batch)
    (loss, grads), (expected, expected_grads) = found["flash"], found["xla"]
    # Loose on purpose: a TPU multiplies float32 in bfloat16 passes by default, and
    # each attention rounds its own way; a wrong layout or scale is off by far more.
    np.testing.assert_allclose(loss, expected, rtol=1e-2)
    flat = jnp.concatenate([grads[n].ravel() for n in sorted(grads)])
    want = jnp.concatenate([expected_grads[n].ravel() for n in sorted(grads)])
    assert float(jnp.linalg.norm(flat - want) / jnp.linalg.norm(want)) < 2e-2


def test_the_module_refuses_an_unknown_attention():
    with pytest.raises(ValueError) as caught:
        GPT(32, 1, 8, 2, 4, attention="splash", rngs=nnx.Rngs(0))
    assert str(caught.value) == (
        "GPT(attention=...) must be one of 'auto', 'xla', 'flash', 'cudnn', got "
        "'splash': it names how each block computes its causal attention "
        '("auto": "flash" on a TPU, "xla" elsewhere; "xla": written out in JAX, '
        'on any backend; "flash": the Pallas TPU flash attention kernel, on a TPU '
        'only; "cudnn": cuDNN\'s fused attention, on an NVIDIA GPU only). Pass '
        'one of them, e.g. attention="xla".'
    )
    assert check_attention("flash", "x", "y") == "flash"
    with pytest.raises(ValueError, match="E.attention must be one of .* got None"):
        check_attention(None, "E.attention", 'attention="xla"')


@pytest.mark.parametrize(
    ("attention", "module", "backends", "what", "where"), OFF_BACKEND
)
def test_a_kernel_is_refused_off_its_backend_when_asked_and_only_then(
    monkeypatch, attention, module, backends, what, where
):
    # Building the module asks nothing (a run file builds it before its processes
    # join); the fronts ask when they build the parameters.
    assert GPT(32, 1, 8, 2, 4, attention=attention, rngs=nnx.Rngs(0)).attention
    for anywhere in ("xla", "auto"):
        check_attention_backend(anywhere, "GPT(attention=...)", 'attention="xla"')
    with pytest.raises(ValueError) as caught:
        check_attention_backend(attention, "GPT(attention=...)", 'attention="xla"')
    backend = jax.default_backend()
    assert str(caught.value) == (
        f'GPT(attention=...) is "{attention}": {what}, and this run\'s JAX backend '
        f'is {backend!r}. Pass attention="xla" (the same attention written out in '
        f"JAX, which XLA compiles on any backend), or run on {where}."
    )
    monkeypatch.setattr(module, backends, (*getattr(module, backends), backend))
    check_attention_backend(attention, "GPT(attention=...)", 'attention="xla"')


def with_model(text: str) -> str:
    return MINIMAL.replace("(gpt :vocab 32 :layers 2 :dim 32 :heads 2)", text)


def test_the_run_file_passes_attention_to_the_module(write):
    model = evaluate_file(
        write(
            with_model("(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :attention :flash)")
        )
    ).value("model")
    assert model.attention == "flash"
    module = model.build(nnx.Rngs(0))
    assert module.attention == module.blocks[1].attn.attention == "flash"
    assert (
        model.parameter_shapes()
        == dataclasses.replace(model, attention="xla").parameter_shapes()
    )
    default = evaluate_file(write(MINIMAL, "plain.sx")).value("model")
    assert default.attention == "auto"


@pytest.mark.parametrize(
    "value, shown", [(":splash", ":splash"), ('"flash"', '"flash"'), ("1", "1")]
)
def test_the_run_file_refuses_an_unknown_attention(write, value, shown):
    path = write(
        with_model(f"(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :attention {value})")
    )
    with pytest.raises(RunfileError) as caught:
        evaluate_file(path)
    assert caught.value.codes == ["E-EVAL-007"]
    message = str(caught.value)
    assert (
        "`:attention` of `gpt` is :auto, :xla, :flash, :cudnn (how each block "
        f"computes its causal attention), got {shown}"
    ) in message
    assert "write :attention :xla for the attention written out in JAX" in message
    assert "or leave it out (:auto, :flash on a TPU and :xla elsewhere)" in message


def test_attention_moves_the_graph_key(write):
    keys = {}
    for attention in ATTENTION:
        model = f"(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :attention :{attention})"
        keys[attention] = compile_run(write(with_model(model), f"{attention}.sx")).graph
    assert len(set(keys.values())) == len(ATTENTION)
    # Leaving it out is :auto exactly: the same programs, served from the cache.
    assert graph_key(evaluate_file(write(MINIMAL, "plain.sx"))) == keys["auto"]


@pytest.mark.parametrize(
    ("attention", "module", "backends", "what", "where"), OFF_BACKEND
)
def test_run_refuses_a_kernel_off_its_backend_where_check_accepts_it(
    tmp_path, capsys, attention, module, backends, what, where
):
    path = tmp_path / f"{attention}.sx"
    path.write_text(
        with_model(
            f"(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :attention :{attention})"
        )
    )
    (tmp_path / "data").mkdir()
    shutil.copy(EXAMPLES / "data" / "tiny-train.jsonl.gz", tmp_path / "data")
    # check traces the kernel on any backend, asking for none.
    assert check_file(str(path)).parameters == 32
    assert main(["run", str(path), "--run-dir", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    line = next(n for n, text in enumerate(MINIMAL.splitlines(), 1) if "gpt :" in text)
    assert err.startswith(f"{path}:{line}:9: E-RUN-012 ")
    assert (
        f"E-RUN-012 `:attention :{attention}` of `gpt` is {what}, and this run's JAX "
        f"backend is {jax.default_backend()}"
    ) in err
    assert "fix: write :attention :xla" in err and f"or run on {where}" in err
    assert "Traceback" not in err
