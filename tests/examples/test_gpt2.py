"""GPT-2's tiny configuration, CI's stand-in for benchmarks/gpt2.py on the same code
path: the hand-written Flax NNX + Optax loop, the Python API (examples/gpt2.py) and
the run file (examples/runfiles/gpt2.sx) start from the same weights, train the same
losses on the same batches, and a resumed Python-API run continues bit for bit."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from compile_counts import kinds_compiled
from example_scripts import example_module
from gpt_params import OFF_BACKEND

import jaxnitro as nx
from jaxnitro.runfile.check import check_file
from jaxnitro.runfile.evaluator import evaluate_file
from jaxnitro.runfile.knobs import Selection

ROOT = Path(__file__).resolve().parents[2]
RUN_FILE = ROOT / "examples" / "runfiles" / "gpt2.sx"


@pytest.fixture(scope="module")
def bench():
    """benchmarks/gpt2.py as a module (it loads examples/gpt2.py itself)."""
    with example_module("../benchmarks/gpt2.py", "gpt2_benchmark") as module:
        yield module


@pytest.fixture(scope="module")
def gpt2(bench):
    """examples/gpt2.py, the module the benchmark trains through the Python API."""
    return bench.example()


@pytest.fixture
def folder(tmp_path, bench):
    """gpt2.sx and the tiny variant's data in the test's folder; the run file."""
    return bench.prepare_folder(str(tmp_path), "tiny")


def test_the_run_file_variants_are_the_python_configurations(gpt2):
    for variant, config in ((None, "gpt2-small"), ("tiny", "tiny")):
        result = evaluate_file(str(RUN_FILE), Selection(variant=variant))
        model = result.value("model")
        sizes = gpt2.CONFIGS[config]
        assert (model.vocab, model.layers, model.dim, model.heads, model.context) == (
            sizes["vocab"],
            sizes["layers"],
            sizes["width"],
            sizes["heads"],
            sizes["seq"],
        )
        assert result.value("train-loader").batch_size == sizes["batch"]
        assert result.run.precision == "bf16"
    report = check_file(str(RUN_FILE))  # no data file is opened
    assert report.parameters == 4 + 14 * 12 and report.steps == 200
    shapes = evaluate_file(str(RUN_FILE)).value("model").parameter_shapes()
    assert (
        sum(int(np.prod(s)) for s in shapes.values()) == 163_090_176
    )  # 163M: the head is untied


def test_the_three_fronts_start_from_the_same_weights(gpt2, bench):
    from flax import nnx

    from jaxnitro.runfile.nn_modules import GPT
    from jaxnitro.runfile.stdlib_nn import GPTSpec

    sizes = {k: v for k, v in gpt2.CONFIGS["tiny"].items() if k != "batch"}
    experiment = gpt2.GPT2(**sizes)
    spec = GPTSpec(
        vocab=256, layers=2, dim=64, heads=2, context=64
    )  # the run file's `gpt`

    def reference(seed):
        module = GPT(
            **bench._positional(sizes), rngs=nnx.Rngs(params=jax.random.key(seed))
        )
        return bench.by_name(nnx.state(module, nnx.Param))

    _, params, _ = experiment.build_model(jax.random.key(1))
    python_api = bench.by_name(params)
    run_file = {k: np.asarray(v) for k, v in spec.init(jax.random.key(1)).items()}
    ref, other = reference(1), reference(2)
    assert python_api.keys() == run_file.keys() == ref.keys()
    for name, value in ref.items():
        np.testing.assert_array_equal(python_api[name], value)
        np.testing.assert_array_equal(run_file[name], value)
    assert not np.array_equal(other["model.head.weight"], ref["model.head.weight"])


def test_remat_is_a_checked_graphconst_of_the_experiment(gpt2):
    sizes = {k: v for k, v in gpt2.CONFIGS["tiny"].items() if k != "batch"}
    assert gpt2.GPT2(**sizes).remat == "none"
    assert gpt2.GPT2.config_metadata()["remat"].kind == "graphconst"
    with pytest.raises(nx.ConfigError) as caught:
        gpt2.GPT2(**sizes, remat="all")
    assert str(caught.value) == (
        "GPT2.remat must be one of 'none', 'blocks', 'dots', got 'all': it names "
        'what the backward pass keeps of each block ("none": everything, "blocks": '
        'only its input, "dots": the outputs of its linear layers). Pass one of '
        'them, e.g. remat="dots".'
    )
    model, params, _ = gpt2.GPT2(**sizes, remat="dots").build_model(jax.random.key(0))
    from flax import nnx

    assert nnx.merge(model, params).remat == "dots"
    # The run file's knob reaches its `gpt` the same way.
    selection = Selection(variant="tiny", sets=(("remat", ":blocks"),))
    assert evaluate_file(str(RUN_FILE), selection).value("model").remat == "blocks"
    assert evaluate_file(str(RUN_FILE)).value("model").remat == "none"


def test_attention_is_a_checked_graphconst_of_the_experiment(gpt2):
    sizes = {k: v for k, v in gpt2.CONFIGS["tiny"].items() if k != "batch"}
    assert gpt2.GPT2(**sizes).attention == "auto"
    assert gpt2.GPT2.config_metadata()["attention"].kind == "graphconst"
    with pytest.raises(nx.ConfigError) as caught:
        gpt2.GPT2(**sizes, attention="splash")
    assert str(caught.value) == (
        "GPT2.attention must be one of 'auto', 'xla', 'flash', 'cudnn', got "
        "'splash': it names how each block computes its causal attention "
        '("auto": "flash" on a TPU, "xla" elsewhere; "xla": written out in JAX, '
        'on any backend; "flash": the Pallas TPU flash attention kernel, on a TPU '
        'only; "cudnn": cuDNN\'s fused attention, on an NVIDIA GPU only). Pass '
        'one of them, e.g. attention="xla".'
    )
    assert gpt2.GPT2(**sizes, attention="flash").attention == "flash"  # any backend
    # The run file's knob reaches its `gpt` the same way.
    selection = Selection(variant="tiny", sets=(("attention", ":flash"),))
    assert evaluate_file(str(RUN_FILE), selection).value("model").attention == "flash"
    assert evaluate_file(str(RUN_FILE)).value("model").attention == "auto"


@pytest.mark.parametrize(
    ("attention", "module", "backends", "what", "where"), OFF_BACKEND
)
def test_a_kernel_is_refused_off_its_backend_when_the_model_is_built(
    gpt2, bench, attention, module, backends, what, where
):
    del module, backends  # the backends the flash and cudnn tests widen
    sizes = {k: v for k, v in gpt2.CONFIGS["tiny"].items() if k != "batch"}
    experiment = gpt2.GPT2(**sizes, attention=attention)  # any backend
    with pytest.raises(nx.ConfigError) as caught:
        experiment.build_model(jax.random.key(0))
    backend = jax.default_backend()
    assert str(caught.value) == (
        f'GPT2.attention is "{attention}": {what}, and this run\'s JAX backend is '
        f'{backend!r}. Pass attention="xla" (the same attention written out in JAX, '
        f"which XLA compiles on any backend), or run on {where}."
    )
    # The benchmark stops before any side runs, with the module's message.
    work = bench.Workload("tiny", batch=4, steps=8, cadence=4, attention=attention)
    with pytest.raises(SystemExit, match=f'^--attention is "{attention}": .* Pass '):
        bench.refuse_attention(work)
    bench.refuse_attention(bench.Workload("tiny", batch=4, steps=8, cadence=4))


def test_the_benchmark_sets_the_attention_on_the_jaxnitro_sides_only(bench):
    work = bench.Workload("tiny", batch=4, steps=8, cadence=4, attention="flash")
    assert ("attention", ":flash") in work.selection().sets
    assert work.attention_line() == "attention flash (the reference's: xla)"
    plain = bench.Workload("tiny", batch=4, steps=8, cadence=4)
    assert ("attention", ":auto") in plain.selection().sets
    assert plain.attention_line() == "attention auto: xla on cpu"
    assert plain.target() == "target >= 0.98"
    # jaxnitro's default compiles to the kernel on a TPU: no target against xla.
    tpu = dataclasses.replace(plain, platform="tpu")
    assert tpu.attention_line() == "attention auto: flash on tpu (the reference's: xla)"
    assert tpu.target() == "no target: flash attention against the reference's xla"
    like = dataclasses.replace(tpu, attention="xla")
    assert like.attention_line() == "attention xla"
    assert like.target() == "target >= 0.98"


def test_loss_chunks_is_a_checked_graphconst_of_the_experiment(gpt2):
    from flax import nnx

    sizes = {k: v for k, v in gpt2.CONFIGS["tiny"].items() if k != "batch"}
    assert gpt2.GPT2(**sizes).loss_chunks == 0
    assert gpt2.GPT2.config_metadata()["loss_chunks"].kind == "graphconst"
    with pytest.raises(nx.ConfigError) as caught:
        gpt2.GPT2(**sizes, loss_chunks=5)
    assert str(caught.value) == (
        "GPT2.loss_chunks must be 0 (off) or a positive integer dividing the context "
        "64, got 5: it is the number of chunks the training loss cuts the positions "
        "into, computing the head's logits one chunk at a time. Pass a divisor of "
        "64, e.g. loss_chunks=4, or 0 for the whole logits at once."
    )
    model, params, _ = gpt2.GPT2(**sizes, loss_chunks=4).build_model(jax.random.key(0))
    assert nnx.merge(model, params).loss_chunks == 4


def test_the_benchmark_sets_the_loss_chunks_on_the_jaxnitro_sides_only(bench):
    work = bench.Workload("tiny", batch=4, steps=8, cadence=4, loss_chunks=4)
    assert ("loss-chunks", "4") in work.selection().sets
    assert work.loss_line() == "loss chunks 4 (the reference's: 0)"
    assert work.target() == (
        "no target: loss in 4 chunks against the reference's whole logits"
    )
    both = dataclasses.replace(work, attention="flash")
    assert both.target() == (
        "no target: flash attention against the reference's xla; loss in 4 chunks "
        "against the reference's whole logits"
    )
    plain = bench.Workload("tiny", batch=4, steps=8, cadence=4)
    assert ("loss-chunks", "0") in plain.selection().sets
    assert plain.loss_line() == "loss chunks 0"
    assert plain.target() == "target >= 0.98"
    # The benchmark stops before any side runs, with the module's message.
    bench.refuse_loss_chunks(work)
    with pytest.raises(SystemExit, match="^--loss-chunks must be 0 .* got 5: .* e.g. "):
        bench.refuse_loss_chunks(dataclasses.replace(work, loss_chunks=5))


def _trained_f32(experiment, run_dir):
    """`experiment` trained one epoch in f32 from seed 1, nothing written."""
    return nx.Nitro(
        experiment,
        seed=1,
        max_epochs=1,
        precision="f32",
        run_dir=str(run_dir),
        logger=None,
        checkpointer=None,
    ).train()


def test_loss_chunks_compile_their_own_step_train_the_same_and_predict_logits(
    gpt2, bench, folder, tmp_path
):
    work = bench.Workload("tiny", batch=4, steps=4, cadence=4, precision="f32")
    _, tokens = bench.run_batches(folder, work)
    sizes = {k: v for k, v in gpt2.CONFIGS["tiny"].items() if k != "batch"}
    # Two windows a batch: the remat test's programs (four) stay uncompiled.
    batches = [{"tokens": t[:2]} for t in tokens]
    trained, predicted = {}, {}
    for chunks in (0, 4):
        experiment = gpt2.GPT2(**sizes, loss_chunks=chunks, train=batches)

        def train(experiment=experiment, chunks=chunks):
            nitro = _trained_f32(experiment, tmp_path / str(chunks))
            # Prediction is forward in eval mode: the logits, chunked or not.
            logits, _ = nitro.predict(batches[0])
            predicted[chunks] = logits
            nitro.release()
            trained[chunks] = nitro

        assert "train_step" in kinds_compiled(train)  # a key of its own
    plain, chunked = trained[0], trained[4]
    loss, expected = chunked.history[-1]["train_loss"], plain.history[-1]["train_loss"]
    params = bench.by_name(chunked.train_state.params)
    expected_params = bench.by_name(plain.train_state.params)
    # Measured (f32, 4 steps): the epoch's loss within 6.4e-8 (relative), the
    # parameters within 1.2e-7 (one float32 ulp of a norm scale near 1); the
    # attention key biases, which get rounding noise only (Adam scales it up:
    # bench.NO_GRADIENT), within 1.2e-6; the predicted logits within 2.4e-7.
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert bench.largest_difference(params, expected_params)[0] < 1e-6
    assert bench.largest_difference(params, expected_params, noise=True)[0] < 1e-5
    assert predicted[4].shape == predicted[0].shape == (2, 64, 256)
    np.testing.assert_allclose(predicted[4], predicted[0], rtol=1e-5, atol=1e-5)


def test_each_remat_policy_compiles_its_own_step_and_trains_the_same(
    gpt2, bench, folder, tmp_path
):
    work = bench.Workload("tiny", batch=4, steps=4, cadence=4, precision="f32")
    _, tokens = bench.run_batches(folder, work)
    sizes = {k: v for k, v in gpt2.CONFIGS["tiny"].items() if k != "batch"}
    trained = {}
    for remat in ("none", "blocks", "dots"):
        experiment = gpt2.GPT2(
            **sizes, remat=remat, train=[{"tokens": t} for t in tokens]
        )

        def train(experiment=experiment, remat=remat):
            nitro = _trained_f32(experiment, tmp_path / remat)
            nitro.release()
            trained[remat] = nitro

        assert "train_step" in kinds_compiled(train)  # a key of its own
    plain = trained["none"]
    for remat in ("blocks", "dots"):
        nitro = trained[remat]
        np.testing.assert_allclose(
            nitro.history[-1]["train_loss"], plain.history[-1]["train_loss"], rtol=1e-6
        )
        for a, b in zip(
            jax.tree.leaves(nitro.train_state.params),
            jax.tree.leaves(plain.train_state.params),
            strict=True,
        ):
            # 1e-5: the attention key biases, whose gradient is zero in exact
            # arithmetic, drift by rounding alone (1.4e-6 apart on a TPU).
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


# (precision, relative loss tolerance, absolute parameter tolerance). Measured on 2
# CPU cores over 12 steps: f32 losses within 9e-8 (the run file's equal), parameters
# within 1.2e-7 (one float32 ulp of the norm scales near 1); bf16 losses within
# 1.5e-5, parameters within 6e-5. bf16 takes twice f32's time: the slow tier.
TOLERANCES = [
    ("f32", 1e-6, 1e-6),
    pytest.param("bf16", 1e-4, 5e-4, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("precision", "rtol", "atol"), TOLERANCES)
def test_the_three_fronts_train_the_same_losses(bench, folder, precision, rtol, atol):
    work = bench.Workload("tiny", batch=4, steps=12, cadence=4, precision=precision)
    source, tokens = bench.run_batches(folder, work)
    assert len(tokens) == 12 and tokens[0].shape == (4, 65)
    ref = bench.reference(work, tokens)
    api = bench.python_api(work, source, str(Path(folder).parent / "api"), log_every=1)
    run = bench.run_file_side(folder, work, str(Path(folder).parent / "run"))
    steps = list(range(1, 13))
    assert sorted(api.logged) == steps and sorted(run.logged) == [4, 8, 12]
    expected = np.array([ref.logged[s] for s in steps])
    assert expected[-1] < expected[0] - 0.1  # it learns
    np.testing.assert_allclose([api.logged[s] for s in steps], expected, rtol=rtol)
    np.testing.assert_allclose(
        [run.logged[s] for s in (4, 8, 12)], expected[3::4], rtol=rtol
    )
    for side in (api, run):
        np.testing.assert_allclose(side.block_means, ref.block_means, rtol=rtol)
        # Every parameter a gradient reaches; the attention key biases get rounding
        # noise only, which Adam scales up (bench.NO_GRADIENT).
        assert bench.largest_difference(side.params, ref.params)[0] < atol


@pytest.mark.parametrize(
    "precision", ["f32", pytest.param("bf16", marks=pytest.mark.slow)]
)
def test_a_resumed_python_api_run_continues_bitwise(
    gpt2, bench, folder, tmp_path, precision
):
    work = bench.Workload("tiny", batch=4, steps=8, cadence=4)
    _, tokens = bench.run_batches(folder, work)
    sizes = {k: v for k, v in gpt2.CONFIGS["tiny"].items() if k != "batch"}
    experiment = gpt2.GPT2(**sizes, train=[{"tokens": t} for t in tokens[:4]])

    def train(run_dir, epochs, **kwargs):
        nitro = nx.Nitro(
            experiment,
            seed=1,
            max_epochs=epochs,
            precision=precision,
            run_dir=str(tmp_path / run_dir),
            logger=None,
            **kwargs,
        ).train()
        nitro.release()
        return nitro

    straight = train("straight", 2)
    stopped = train("stopped", 1)
    head = bench.by_name(stopped.train_state.params)["model.head.weight"]
    resumed = train("stopped", 2, resume="auto")
    assert resumed.current_step == straight.current_step == 8
    assert resumed.history[-1]["train_loss"] == straight.history[-1]["train_loss"]
    for a, b in zip(
        jax.tree.leaves(resumed.train_state.params),
        jax.tree.leaves(straight.train_state.params),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The first epoch alone ends elsewhere: equality says the resume continued.
    straight_head = bench.by_name(straight.train_state.params)["model.head.weight"]
    assert not np.array_equal(head, straight_head)


@pytest.mark.slow
def test_the_benchmark_runs_the_tiny_configuration(bench, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setattr(
        "sys.argv",
        [
            "gpt2.py",
            "--config",
            "tiny",
            "--steps",
            "8",
            "--cadence",
            "4",
            "--resume-check",
        ],
    )
    bench.main()
    out = capsys.readouterr().out
    assert "python api / reference tokens/s: " in out
    assert "run file / reference tokens/s: " in out
    assert "MFU unknown: no peak on record for 'cpu'" in out
    assert ", bf16, remat none, attention auto: xla on cpu, loss chunks 0\n" in out
    assert "by the wall clock (target >= 0.98)" in out
    assert "run file resumed at step 4: final parameters bitwise equal" in out


@pytest.fixture(scope="module")
def search():
    """benchmarks/_largest_batch.py as a module."""
    with example_module("../benchmarks/_largest_batch.py", "largest_batch") as module:
        yield module


def fits_up_to(limit, tried):
    """A probe that runs out of memory above `limit` the way XLA says it, wrapped
    as a framework would wrap it; it records each batch tried."""

    def probe(batch):
        tried.append(batch)
        if batch > limit:
            try:
                raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in hbm")
            except RuntimeError as error:
                raise ValueError("the step failed") from error
        return f"measured at {batch}"

    return probe


@pytest.mark.parametrize(
    ("limit", "start", "cap", "largest", "tried", "stopped"),
    [
        (40, 16, 256, 40, [16, 32, 64, 48, 40, 44, 42, 41], "41 runs out of memory"),
        (1000, 4, 256, 256, [4, 8, 16, 32, 64, 128, 256], "reached the cap, 256"),
        (1000, 48, 100, 100, [48, 96, 100], "reached the cap, 100"),
        (5, 16, 256, 5, [16, 8, 4, 6, 5], "6 runs out of memory"),
        (0, 4, 256, None, [4, 2, 1], "even batch 1 runs out of memory"),
        (1000, 1, 2**20, 512, [2**i for i in range(10)], "stopped after 10 probes"),
    ],
)
def test_the_largest_batch_doubles_then_bisects(
    search, limit, start, cap, largest, tried, stopped
):
    seen: list[int] = []
    found = search.largest_batch(fits_up_to(limit, seen), start=start, cap=cap)
    assert found.batch == largest and seen == tried
    assert [p.batch for p in found.probes] == tried and found.stopped == stopped
    assert found.result == (None if largest is None else f"measured at {largest}")
    assert all(p.fits == (p.batch <= limit) for p in found.probes)
    failed = [p for p in found.probes if not p.fits]
    assert all(p.error == "the step failed" for p in failed)
    assert found.describe().endswith(f"; {stopped}")


def test_the_largest_batch_search_lets_other_errors_through(search):
    def probe(batch):
        raise TypeError("a bug, not memory")

    with pytest.raises(TypeError, match="a bug, not memory"):
        search.largest_batch(probe, start=4, cap=8)
    with pytest.raises(ValueError, match="got start=0, cap=8, max_probes=10"):
        search.largest_batch(probe, start=0, cap=8)
    assert not search.is_out_of_memory(ValueError("RESOURCE_EXHAUSTE"))
    assert search.is_out_of_memory(RuntimeError("XLA: Out of memory allocating"))


@pytest.mark.slow
def test_the_benchmark_finds_each_sides_largest_batch(bench, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    real = bench.probe_side

    def probe_side(name, path, work, folder):
        if name == "python api" and work.batch > 6:  # a device of that size
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying")
        return real(name, path, work, folder)

    monkeypatch.setattr(bench, "probe_side", probe_side)
    monkeypatch.setattr(
        "sys.argv",
        [
            "gpt2.py",
            "--config",
            "tiny",
            "--max-batch",
            "--max-batch-cap",
            "8",
            "--sides",
            "reference,python-api",
            "--remat",
            "blocks",
            "--precision",
            "f32",
        ],
    )
    bench.main()
    out = capsys.readouterr().out
    assert "largest batch: tiny, 64 tokens a window, f32, remat blocks" in out
    assert re.search(
        r" reference: largest batch 8, step program [0-9.]+ GiB \(XLA's analysis\), "
        r"[0-9.]+ tokens/s \(4 ok, 8 ok; reached the cap, 8\)",
        out,
    )
    assert re.search(
        r"python api: largest batch 6, .* \(4 ok, 8 out of memory, 6 ok, 7 out of "
        r"memory; 7 runs out of memory\)",
        out,
    )
    assert "python api / reference largest batch: 0.750 (target >= 0.95)" in out
    assert "run file" not in out.split("largest batch: tiny")[1]


def test_cudnn_trains_a_bf16_run_as_the_written_out_attention(
    gpt2, bench, folder, tmp_path, monkeypatch
):
    """The Python API's bf16 run reaches cuDNN's attention with bfloat16 heads and
    trains as the written-out attention; a float32 run is refused when its step is
    traced. JAX traces cuDNN's kernel only where cuDNN is found: a stand-in answers
    for it with JAX's written-out form (the function the kernel computes)."""
    from jaxnitro.runfile import nn_cudnn

    asked = []
    real = jax.nn.dot_product_attention

    def stand_in(q, k, v, **kwargs):
        asked.append((q.dtype, kwargs["implementation"]))
        return real(q, k, v, **{**kwargs, "implementation": "xla"})

    monkeypatch.setattr(jax.nn, "dot_product_attention", stand_in)
    monkeypatch.setattr(nn_cudnn, "CUDNN_BACKENDS", (jax.default_backend(),))
    work = bench.Workload("tiny", batch=4, steps=4, cadence=4)
    _, tokens = bench.run_batches(folder, work)
    sizes = {k: v for k, v in gpt2.CONFIGS["tiny"].items() if k != "batch"}
    batches = [{"tokens": t[:2]} for t in tokens]

    def trained(attention, precision):
        return nx.Nitro(
            gpt2.GPT2(**sizes, attention=attention, train=batches),
            seed=1,
            max_epochs=1,
            precision=precision,
            run_dir=str(tmp_path / f"{attention}-{precision}"),
            logger=None,
            checkpointer=None,
        ).train()

    cudnn = trained("cudnn", "bf16")
    assert asked and set(asked) == {(np.dtype("bfloat16"), "cudnn")}
    plain = trained("xla", "bf16")
    np.testing.assert_allclose(
        cudnn.history[-1]["train_loss"], plain.history[-1]["train_loss"], rtol=2e-2
    )
    with pytest.raises(ValueError, match='attention "cudnn" .* in float32'):
        trained("cudnn", "f32")
