"""setup_devices: the process's backend and n_devs pin, and how a run's n_devs
resolves (keyword > pin > the experiment's accessor > 1)."""

import re

import jax
import pytest
from experiments import Tiny
from mesh_experiments import quiet, unpinned

import jaxnitro as nx
from jaxnitro.devices import process


@pytest.fixture(autouse=True)
def _unpinned(monkeypatch):
    unpinned(monkeypatch)


class TwoDevices(Tiny):
    n_devs: int = 2


def test_called_with_no_arguments_it_only_reports():
    report = nx.setup_devices()
    assert report == {
        "backend": jax.default_backend(),  # cpu, 4 devices: "cpu:0" ... "cpu:3"
        "visible": [str(d) for d in jax.local_devices()],
        "n_devs": 1,
        "pinned": None,
    }
    assert process.current_setup() == process.DeviceSetup()


@pytest.mark.needs_devices(2)
def test_a_pin_is_reported_and_kept_for_the_process():
    backend = jax.default_backend()  # another one would move the default device
    assert nx.setup_devices(backend=backend, n_devs=2)["pinned"] == 2
    report = nx.setup_devices()
    assert (report["backend"], report["n_devs"], report["pinned"]) == (backend, 2, 2)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        (
            {"n_devs": 8},
            "setup_devices(...): n_devs=8, but only {visible} {backend} device(s) are "
            "visible to this process. Pass n_devs <= {visible}, or make more devices "
            "visible before the process starts (CUDA_VISIBLE_DEVICES on a GPU host; "
            "on a CPU host XLA_FLAGS=--xla_force_host_platform_device_count=8).",
        ),
        (
            {"n_devs": "2"},
            "setup_devices(...): n_devs must be a whole number >= 1, got '2'. Pass "
            "e.g. n_devs=2 (n_devs=1 runs on one device, without a mesh).",
        ),
        (
            {"n_devs": 1.5},
            "setup_devices(...): n_devs must be a whole number >= 1, got 1.5. Pass "
            "e.g. n_devs=2 (n_devs=1 runs on one device, without a mesh).",
        ),
        (
            {"backend": "metal"},
            "setup_devices(backend='metal'): the backend is one of cpu, gpu, cuda, "
            "rocm, tpu, or None to keep the current one ({backend}).",
        ),
    ],
)
def test_a_bad_choice_is_refused_and_changes_nothing(keywords, message):
    # Fewer than 8 devices (4 fake CPU ones, or a TPU chip's 1).
    visible, backend = len(jax.local_devices()), jax.default_backend()
    message = message.format(visible=visible, backend=backend)
    nx.setup_devices(n_devs=visible)
    with pytest.raises(nx.ConfigError, match=f"^{re.escape(message)}$"):
        nx.setup_devices(**keywords)
    assert nx.setup_devices()["pinned"] == visible


def test_a_backend_the_process_has_no_devices_for_is_refused():
    backend = jax.default_backend()
    absent = "cuda" if backend == "tpu" else "tpu"
    with pytest.raises(
        nx.ConfigError,
        match=f"^setup_devices\\(backend='{absent}'\\): this process has no "
        f"{absent} devices \\(its backend is {backend}: .*\\). A process "
        "initializes its XLA client once: set JAX_PLATFORMS",
    ):
        nx.setup_devices(backend=absent)


@pytest.mark.needs_devices(4)
def test_the_keyword_beats_the_pin_which_beats_the_experiment():
    def resolved(**kw):
        config = nx.Nitro(TwoDevices(), **quiet(**kw)).config
        return config.n_devs, config.sources["n_devs"]

    assert resolved() == (2, "field")
    nx.setup_devices(n_devs=4)
    assert resolved() == (4, "pin")
    assert resolved(n_devs=1) == (1, "keyword")
    report = nx.Nitro(TwoDevices(), **quiet()).binding_report()
    assert re.search("^  n_devs +4 +from pin$", report, re.MULTILINE)


def test_a_run_asking_for_more_devices_than_visible_is_refused_before_setup():
    class Eight(Tiny):
        n_devs: int = 8

        def build_data(self, dist):
            raise AssertionError("setup built the data before refusing n_devs")

    visible, backend = len(jax.local_devices()), jax.default_backend()
    with pytest.raises(
        nx.ConfigError,
        match=f"^Nitro\\(...\\) \\(n_devs from the field\\): n_devs=8, but only "
        f"{visible} {backend} device\\(s\\) are visible",
    ):
        nx.Nitro(Eight(), **quiet())
