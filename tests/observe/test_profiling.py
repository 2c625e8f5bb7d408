"""The profile= run keyword: a jax.profiler trace of chosen optimizer steps."""

import gzip
import json
from pathlib import Path

import pytest
from experiments import Tiny

import jaxnitro as nx
from jaxnitro.observe.profiling import StepProfiler, check_profile


def traced_files(directory: Path) -> tuple[list[Path], list[Path]]:
    return sorted(directory.rglob("*.xplane.pb")), sorted(
        directory.rglob("*.trace.json.gz")
    )


def test_profile_traces_the_chosen_steps_and_names_the_step_program(tmp_path):
    # Tiny trains 4 steps an epoch for 2 epochs: steps 3 to 6 cross the epoch end.
    nitro = nx.Nitro(Tiny(), run_dir=str(tmp_path), logger=None, profile=(3, 4))
    nitro.train()
    assert nitro.status.profiler.traced
    xplanes, perfetto = traced_files(tmp_path / "profile")
    assert len(xplanes) == 1 and len(perfetto) == 1
    assert b"train_step" in xplanes[0].read_bytes()  # XLA's module jit_train_step
    events = json.loads(gzip.decompress(perfetto[0].read_bytes()))
    names = {e.get("name", "") for e in events["traceEvents"]}
    assert any("train_step" in name for name in names)


def test_a_run_that_ends_before_the_last_traced_step_still_writes_the_trace(tmp_path):
    nitro = nx.Nitro(Tiny(), run_dir=str(tmp_path), logger=None, profile=(7, 50))
    nitro.train()  # 8 steps in all: 7 and 8 are traced, then the run ends
    xplanes, _ = traced_files(tmp_path / "profile")
    assert len(xplanes) == 1


def test_steps_a_run_never_reaches_write_no_trace(tmp_path):
    nx.Nitro(Tiny(), run_dir=str(tmp_path), logger=None, profile=(100, 2)).train()
    assert not (tmp_path / "profile").exists()


@pytest.mark.parametrize(
    "value", [(0, 2), (3,), (1.5, 2), "10,5", (True, 2), (2, 0), [1, 2, 3]]
)
def test_a_bad_profile_is_refused_at_construction(value):
    with pytest.raises(
        nx.ConfigError, match=r"profile must be \(first_step, n_steps\)"
    ):
        nx.Nitro(Tiny(), logger=None, checkpointer=None, profile=value)


def test_check_profile_accepts_a_list_and_none():
    assert check_profile([2, 3]) == (2, 3)
    assert check_profile(None) is None


def test_a_second_trace_in_the_process_is_a_warning_not_a_failure(tmp_path):
    import jax

    jax.profiler.start_trace(str(tmp_path / "theirs"))
    try:
        profiler = StepProfiler(1, 1, str(tmp_path / "ours"))
        with pytest.warns(nx.NitroWarning, match="could not start a trace of steps 1"):
            profiler.at_step(0, None)
        profiler.at_step(1, None)  # nothing to stop, nothing raised
    finally:
        jax.profiler.stop_trace()
