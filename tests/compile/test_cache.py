"""The compile cache: what moves a key, and what never does."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compile_counts import kinds_compiled
from experiments import HostBuilt, QuietLogger, Tiny, make_batches

import jaxnitro as nx
from jaxnitro.keys.host_cpus import usable_cpus

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def xla_compiles():
    """Record every XLA backend compile (our programs and eager ops alike)."""
    events: list[str] = []

    def listen(name, duration, **kwargs):
        if name == BACKEND_COMPILE:
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


class StepRecorder(QuietLogger):
    """A logger recording the cache misses at every logged line."""

    def __init__(self):
        self.lines = []

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        self.lines.append((context, epoch, step, nx.cache_stats()["misses"]))


def test_two_epochs_compile_nothing_after_the_first_step():
    nx.compile.cache_reset()
    recorder = StepRecorder()
    nitro = nx.Nitro(
        Tiny(max_epochs=2, width=20),
        logger=recorder,
        checkpointer=None,
        log_every_n_steps=1,
        steps_per_call=1,  # "auto" (an accelerator's default) compiles a call of k
    )
    with xla_compiles() as events:
        nitro.train()
    train = [line for line in recorder.lines if line[0] == "train"]
    assert [line[3] for line in train if line[1] == 1] == [1, 1, 1, 1]  # train_step
    after_validation = [line for line in recorder.lines if line[0] == "validate"][0][3]
    # + eval forward, + the eval loss at the full width (16) and at the short last
    # batch's real size (8), since the loss must never see padding.
    assert after_validation == 4
    assert {line[3] for line in recorder.lines if line[1] == 2} == {after_validation}
    # And XLA itself compiled nothing in the second epoch: rerun one more epoch.
    more = nx.Nitro(Tiny(max_epochs=1, width=20), **quiet())
    count = len(events)
    with xla_compiles() as again:
        more.train()
    assert again == [] and count > 0


def test_second_nitro_device_sweep_and_run_settings_compile_nothing(tmp_path):
    nx.Nitro(Tiny(max_epochs=1), **quiet()).train()
    misses = nx.cache_stats()["misses"]
    for smoothing in (0.0, 0.05, 0.1, 0.2):
        nx.Nitro(Tiny(max_epochs=1, smoothing=smoothing), **quiet()).train()
    nx.Nitro(
        Tiny(max_epochs=3),
        seed=7,
        run_dir=str(tmp_path / "elsewhere"),
        logger=None,
        steps_per_call=1,  # "auto" (an accelerator's default) compiles a call of k
    ).train()
    assert nx.cache_stats()["misses"] == misses


def test_graphconst_change_compiles_new_programs():
    nx.Nitro(Tiny(max_epochs=1, width=16), **quiet()).train()
    kinds = kinds_compiled(
        lambda: nx.Nitro(Tiny(max_epochs=1, width=24), **quiet()).train()
    )
    assert kinds == ["eval_forward", "eval_loss", "train_step"]
    kinds = kinds_compiled(
        lambda: nx.Nitro(Tiny(max_epochs=1, width=24), accum=2, **quiet()).train()
    )
    assert kinds == ["train_step"]  # one program runs the micro-batches and the step


class Offsets(Tiny):
    offsets: nx.GraphConst[tuple] = (1, 2)

    def forward(self, model, params, state, *, x):
        logits, state = Tiny.forward(self, model, params, state, x=x)
        offsets = jnp.asarray(self.offsets)[None, :]
        rows = jnp.ones((x.shape[0], 1), offsets.dtype)
        # 1 / -0.0 is -inf: the inverse shows the sign of a baked zero.
        return {
            "logits": logits,
            "offsets": rows * offsets,
            "inverse": rows / offsets,
        }, state

    def loss(self, out, *, y):
        return Tiny.loss(self, out["logits"], y=y)


def test_graphconst_values_python_calls_equal_compile_apart():
    # (1, 2) == (True, 2.0) and 0.0 == -0.0, with equal hashes, yet each bakes
    # another constant: a shared key would serve the first program for both.
    batch = make_batches(4, 4)[0]

    def predict(value):
        return nx.Nitro(Offsets(offsets=value), **quiet()).predict(batch)

    ints, mixed = predict((1, 2))["offsets"], predict((True, 2.0))["offsets"]
    assert ints.dtype == np.int32 and mixed.dtype == np.float32
    zero, negative_zero = predict((0.0, 1.0)), predict((-0.0, 1.0))
    assert zero["inverse"][0, 0] == np.inf and negative_zero["inverse"][0, 0] == -np.inf
    misses = nx.cache_stats()["misses"]
    assert predict((1, 2))["offsets"].dtype == np.int32
    assert nx.cache_stats()["misses"] == misses  # each value hits its own program


def test_clip_threshold_compiles_nothing_and_switching_it_on_only_the_train_step():
    def run(clip, accum):
        nx.Nitro(
            Tiny(max_epochs=1), gradient_clip_norm=clip, accum=accum, **quiet()
        ).train()

    run(0.0, 2)
    assert kinds_compiled(lambda: run(1.0, 2)) == ["train_step"]
    assert kinds_compiled(lambda: run(2.5, 2)) == []  # the threshold is an input
    run(1.0, 1)
    assert kinds_compiled(lambda: run(0.5, 1)) == []


def test_accum_recompiles_only_the_train_step():
    nx.Nitro(Tiny(max_epochs=1), accum=2, **quiet()).train()
    accum = kinds_compiled(
        lambda: nx.Nitro(Tiny(max_epochs=1), accum=4, **quiet()).train()
    )
    assert accum == ["train_step"]


def test_cache_reset_empties_and_counts():
    nx.Nitro(Tiny(), **quiet()).validate()
    assert nx.cache_stats()["entries"] > 0
    nx.compile.cache_reset()
    assert nx.cache_stats() == {"hits": 0, "misses": 0, "entries": 0}
    nx.Nitro(Tiny(), **quiet()).validate()
    assert nx.cache_stats()["misses"] == 3  # forward; the loss at widths 16 and 8


def test_persistent_cache_directory_follows_the_environment(tmp_path, monkeypatch):
    from jaxnitro.compile import cache

    monkeypatch.setattr(cache, "_persistent_configured", False)
    monkeypatch.setenv("JAXNITRO_COMPILATION_CACHE", str(tmp_path / "xla"))
    previous = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        kept = str(tmp_path / "xla" / f"cpus-{usable_cpus()}")
        assert cache.configure_persistent_cache() == kept
        assert jax.config.jax_compilation_cache_dir == kept
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)


def test_the_persistent_cache_is_on_before_build_model_runs(tmp_path, monkeypatch):
    # A second process's parameter initializers (eager ops in build_model) then
    # read their programs from the cache, and so does every compile of 10 ms or
    # more, not only the step's.
    from jaxnitro.compile import cache

    seen = {}

    class Records(HostBuilt):
        def build_model(self, rng):
            seen["dir"] = jax.config.jax_compilation_cache_dir
            seen["min"] = jax.config.jax_persistent_cache_min_compile_time_secs
            return super().build_model(rng)

    monkeypatch.setattr(cache, "_persistent_configured", False)
    monkeypatch.setenv("JAXNITRO_COMPILATION_CACHE", str(tmp_path / "xla"))
    previous = (
        jax.config.jax_compilation_cache_dir,
        jax.config.jax_persistent_cache_min_compile_time_secs,
    )
    jax.random.key(0)  # compiled before the cache is on: setup compiles nothing
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        nx.Nitro(Records(), data={"train": make_batches(32, 16)}, **quiet())
    finally:
        jax.config.update("jax_compilation_cache_dir", previous[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", previous[1])
    kept = str(tmp_path / "xla" / f"cpus-{usable_cpus()}")
    assert seen == {"dir": kept, "min": 0.01}


def test_compile_options_are_part_of_every_program_key():
    options = {"xla_embed_ir_in_executable": True}
    nx.Nitro(Tiny(max_epochs=1), **quiet()).train()
    kinds = kinds_compiled(
        lambda: nx.Nitro(Tiny(max_epochs=1), compile_options=options, **quiet()).train()
    )
    assert kinds == ["eval_forward", "eval_loss", "train_step"]
    again = kinds_compiled(
        lambda: nx.Nitro(Tiny(max_epochs=1), compile_options=options, **quiet()).train()
    )
    assert again == []


def test_an_unknown_compile_option_is_refused_before_any_program_compiles():
    class NoData(Tiny):
        def build_data(self, dist):
            raise AssertionError("setup built the data before refusing the options")

    nx.compile.cache_reset()
    with pytest.raises(
        nx.ConfigError, match="^compile_options were refused by XLA: .*xla_no_such"
    ):
        nx.Nitro(NoData(), compile_options={"xla_no_such_option": True}, **quiet())
    assert nx.cache_stats() == {"hits": 0, "misses": 0, "entries": 0}


@pytest.mark.needs_devices(4)
def test_a_mesh_run_keys_its_programs_by_the_devices_and_compiles_them_once():
    def run(**kw):
        nx.Nitro(Tiny(max_epochs=1), n_devs=4, **quiet(**kw)).train()

    nx.Nitro(Tiny(max_epochs=1), **quiet()).train()
    assert kinds_compiled(run) == ["eval_forward", "eval_loss", "train_step"]
    assert kinds_compiled(run) == []  # the placed state keys as it did
    assert kinds_compiled(lambda: run(sharding="fsdp")) == [
        "eval_forward",
        "eval_loss",
        "train_step",
    ]


_PINNED_CHILD = """
import os, sys
if sys.argv[1] == "one":
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
import jax, jax.numpy as jnp
from jaxnitro.compile import cache
cache.configure_persistent_cache()
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
step = jax.jit(lambda a, b: jnp.maximum(a * 0.9 + b * 0.1, 0.0))
x = jnp.ones((784, 1024))
text = step.lower(x, x).compile().as_text()
print("split" if "outer_dimension_partitions" in text else "unsplit")
"""


@pytest.mark.needs_processes
def test_a_program_compiled_on_one_cpu_is_not_served_to_a_process_with_more(
    tmp_path,
):
    """XLA's CPU compiler splits an elementwise loop over the CPUs the process may
    use; JAX's persistent cache key does not hold that count, so the cache is kept
    per count (`cpus-N`): a pinned run must not leave its one-thread programs to
    the processes after it."""
    import os
    import subprocess
    import sys

    if usable_cpus() < 2:
        pytest.skip("this machine lets the tests use one CPU: nothing to split over")
    env = {**os.environ, "JAXNITRO_COMPILATION_CACHE": str(tmp_path)}

    def child(cpus):
        done = subprocess.run(
            [sys.executable, "-c", _PINNED_CHILD, cpus],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout.split()[-1]

    assert child("one") == "unsplit"  # pinned: its loops run on one thread
    assert child("all") == "split"  # not the pinned process's program
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {"cpus-1", f"cpus-{usable_cpus()}"}
    )
