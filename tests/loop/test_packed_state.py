"""A small train state passed to the train program packed (compile/packed.py).

On an accelerator the calls loop passes the weights, optimizer state, model state
and accumulator as one flat buffer per dtype, unpacked and packed once around a
call's loop of steps. A CPU backend packs only a small state, around each step.
Most tests here pack as an accelerator does (`pack_rule`) and check that a packed
run trains what an unpacked one does, that an epoch starts from the last epoch's
flat buffers, and that the handle always holds the state as trees; the CPU's own
rule is checked at the end (its bitwise promise across steps_per_call in
tests/loop/test_steps_per_call.py).
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from experiments import Tiny
from handle_parts import parts_of

import jaxnitro as nx
import jaxnitro.compile.packed as packed
import jaxnitro.loop.calls as calls
import jaxnitro.loop.carried as carried
from jaxnitro.compile.packed import (
    ACCELERATOR_PACKING,
    CPU_PACK_MOST_BYTES,
    CPU_PACKING,
    PackRule,
    pack_rule,
    packing_of,
)


@pytest.fixture
def packing_on(monkeypatch):
    """Pack as on an accelerator, and count the states packed."""
    monkeypatch.setattr(calls, "pack_rule", lambda: ACCELERATOR_PACKING)
    counted = {"pack": 0}
    real = carried.packed_flats

    def counting(packing, trees):
        counted["pack"] += 1
        return real(packing, trees)

    monkeypatch.setattr(carried, "packed_flats", counting)
    carried.CARRIED.clear()
    yield counted
    carried.CARRIED.clear()


def test_a_tree_of_several_dtypes_round_trips_bit_for_bit():
    tree = {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
        "h": np.arange(4).astype(ml_dtypes.bfloat16),
        "count": np.int32(5),
        "mask": np.array([True, False]),
        "none": None,
        "v": np.float32([0.1, 0.2]),
    }
    packing = packing_of(tree)
    assert packing is not None
    flats = packing.pack(tree)
    assert len(flats) == 4  # bfloat16, int32, bool, float32: a buffer each
    back = packing.unpack(flats)
    assert back["none"] is None
    for name in ("w", "h", "count", "mask", "v"):
        assert back[name].dtype == np.asarray(tree[name]).dtype
        np.testing.assert_array_equal(np.asarray(back[name]), tree[name])


def test_a_small_state_is_packed_through_the_host_without_a_program(monkeypatch):
    tree = {
        "w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4) / 7,
        "h": jnp.ones(5, jnp.bfloat16) / 3,
        "n": jnp.int32(9),
    }
    packing = packing_of(tree)
    by_program = packed.pack_program(packing)(tree)
    compiled = []
    monkeypatch.setattr(
        carried, "pack_program", lambda p: compiled.append(p) or packed.pack_program(p)
    )
    by_host = carried.packed_flats(packing, tree)
    assert compiled == []  # no program compiled for the first step of a process
    for host, device in zip(by_host, by_program, strict=True):
        assert isinstance(host, jax.Array) and host.devices() == device.devices()
        assert host.dtype == device.dtype
        np.testing.assert_array_equal(np.asarray(host), np.asarray(device))
    # A larger state goes through the program (reading it back would cost more).
    monkeypatch.setattr(carried, "HOST_PACK_BYTES", packing.nbytes - 1)
    carried.packed_flats(packing, tree)
    assert compiled == [packing]


def test_what_is_not_packed(monkeypatch):
    assert packing_of({}) is None  # nothing to pack
    assert packing_of({"lr": 0.1}) is None  # a Python number has no buffer
    assert packing_of({"key": jax.random.key(0)}) is None  # an extended dtype
    monkeypatch.setattr(packed, "PACK_MOST_BYTES", 100)
    assert packing_of({"w": np.zeros(26, np.float32)}) is None  # 104 bytes
    assert packing_of({"w": np.zeros(25, np.float32)}) is not None


def trained(tmp_path, name, **kw):
    nitro = nx.Nitro(
        Tiny(n_train=16 * 6, max_epochs=2),
        run_dir=str(tmp_path / name),
        checkpointer=None,
        ema=nx.EMA(0.9),
        **kw,
    )
    nitro.train()
    return nitro


def assert_close_states(a, b):
    for x, y in zip(
        jax.tree.leaves((a.train_state.weights, a.train_state.accumulator)),
        jax.tree.leaves((b.train_state.weights, b.train_state.accumulator)),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("per_call", "accum"), [(1, 1), (4, 1), (1, 2), (3, 2)])
def test_a_packed_run_trains_what_an_unpacked_one_does(
    tmp_path, monkeypatch, per_call, accum
):
    monkeypatch.setattr(calls, "pack_rule", lambda: None)
    plain = trained(tmp_path, "plain", steps_per_call=per_call, accum=accum)
    monkeypatch.setattr(calls, "pack_rule", lambda: ACCELERATOR_PACKING)
    carried.CARRIED.clear()
    got = trained(tmp_path, "packed", steps_per_call=per_call, accum=accum)
    assert got.current_step == plain.current_step == 12 // accum
    assert_close_states(plain, got)
    np.testing.assert_allclose(
        [r["train_loss"] for r in got.history],
        [r["train_loss"] for r in plain.history],
        rtol=1e-6,
    )
    # The handle holds trees, never the flat buffers.
    params = got.train_state.weights.params
    assert set(params) == {"w1", "b1", "w2"}
    assert params["w1"].shape == plain.train_state.weights.params["w1"].shape


def test_an_epoch_starts_from_the_last_epochs_flat_buffers(
    tmp_path, monkeypatch, packing_on
):
    walked = []
    real = carried.packing_of
    monkeypatch.setattr(
        carried, "packing_of", lambda *args: walked.append(1) or real(*args)
    )
    nitro = trained(tmp_path, "run", steps_per_call=2)
    assert nitro.current_epoch == 2
    assert packing_on["pack"] == 1  # the first epoch packed; the second reused it
    assert len(walked) == 1  # and its packing, without walking the trees again


def test_a_state_changed_between_epochs_is_packed_again(
    tmp_path, monkeypatch, packing_on
):
    def shrink(nitro, epoch, observations):
        # What a restore does: the handle's state replaced by other trees.
        state = nitro.train_state
        halved = jax.tree.map(lambda p: p * 0.5, state.weights.params)
        parts_of(nitro).values.commit(
            state._replace(weights=state.weights._replace(params=halved))
        )

    def run(name):
        nitro = nx.Nitro(
            Tiny(n_train=16 * 4, max_epochs=2),
            run_dir=str(tmp_path / name),
            checkpointer=None,
            steps_per_call=1,
        ).on_epoch_end(shrink)
        return nitro.train()

    got = run("packed")
    assert packing_on["pack"] == 2  # the halved trees, not the stale flat buffers
    monkeypatch.setattr(calls, "pack_rule", lambda: None)
    assert_close_states(run("plain"), got)


def test_a_state_left_unpacked_is_judged_once_and_not_held(tmp_path, monkeypatch):
    walked = []
    real = carried.packing_of
    monkeypatch.setattr(
        carried, "packing_of", lambda *args: walked.append(1) or real(*args)
    )
    monkeypatch.setattr(calls, "pack_rule", lambda: PackRule(100, each_step=True))
    carried.CARRIED.clear()

    def replace(nitro, epoch, observations):
        if epoch == 2:  # other trees: judged again at the next epoch's start
            state = nitro.train_state
            params = jax.tree.map(lambda p: p * 1.0, state.weights.params)
            parts_of(nitro).values.commit(
                state._replace(weights=state.weights._replace(params=params))
            )

    nitro = nx.Nitro(
        Tiny(n_train=16 * 4, max_epochs=4),
        run_dir=str(tmp_path / "run"),
        checkpointer=None,
    ).on_epoch_end(replace)
    nitro.train()
    assert len(walked) == 2  # epochs 1 and 3: 2 and 4 took the last epoch's word
    held = carried.CARRIED["packed"]
    assert held.packing is None
    assert held.kept == held.carry == ()  # nothing of the state outlives its handle
    assert held.tree_ids == tuple(map(id, carried.state_trees(nitro.train_state)))
    # Another train() judges its own: here a small state whose trees' ids the
    # decision names (as a freed state's ids may be reused) is packed all the same.
    monkeypatch.setattr(calls, "pack_rule", lambda: CPU_PACKING)
    other = nx.Nitro(
        Tiny(n_train=16 * 2, max_epochs=1),
        run_dir=str(tmp_path / "other"),
        checkpointer=None,
    )
    real_carry_in = calls.carry_in

    def colliding(state, rule, train):
        ids = tuple(map(id, carried.state_trees(state)))
        carried.CARRIED["packed"] = held._replace(rule=rule, tree_ids=ids)
        return real_carry_in(state, rule, train)

    monkeypatch.setattr(calls, "carry_in", colliding)
    other.train()
    assert carried.CARRIED["packed"].packing is not None


def test_mid_epoch_validation_sees_the_weights_of_its_step(tmp_path, monkeypatch):
    kw = {"steps_per_call": 2, "val_every_n_steps": 3}
    monkeypatch.setattr(calls, "pack_rule", lambda: None)
    plain = trained(tmp_path, "plain", **kw)
    monkeypatch.setattr(calls, "pack_rule", lambda: ACCELERATOR_PACKING)
    carried.CARRIED.clear()
    got = trained(tmp_path, "packed", **kw)
    assert_close_states(plain, got)
    want, seen = validations(plain), validations(got)
    assert [step for step, _ in seen] == [step for step, _ in want] == [3, 6, 9, 12]
    np.testing.assert_allclose(
        [loss for _, loss in seen], [loss for _, loss in want], rtol=1e-6
    )


def validations(nitro):
    """`(step, loss)` of every validate line the run wrote."""
    text = (Path(nitro.run_dir) / "metrics.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r.get("context") == "validate"]


def test_a_packed_state_trains_on_the_flat_buffers_in_place():
    tree = {"w": jnp.ones((3,)), "n": jnp.int32(0)}
    packing = packing_of(tree)
    assert packing is not None

    def step(flats):
        t = packing.unpack(flats)
        return packing.pack({"w": t["w"] * 2, "n": t["n"] + 1})

    flats = jax.jit(step, donate_argnums=0)(packing.pack(tree))
    back = packing.unpack(flats)
    np.testing.assert_array_equal(np.asarray(back["w"]), [2.0, 2.0, 2.0])
    assert int(back["n"]) == 1


def test_a_call_that_fails_after_taking_the_state_keeps_its_own_error(
    tmp_path, monkeypatch, packing_on
):
    """A call that raises once it has consumed the flat buffers: the error the user
    sees is the call's, not one from unpacking what it consumed."""
    real = calls.call_program

    def failing(*args, **kwargs):
        real(*args, **kwargs)  # compiled as the loop would

        def run(*call_args):
            for flat in call_args[2]:
                flat.delete()  # what a donating call that then fails leaves
            raise RuntimeError("the device ran out of memory")

        return run

    monkeypatch.setattr(calls, "call_program", failing)
    nitro = nx.Nitro(
        Tiny(n_train=16 * 2, max_epochs=1),
        run_dir=str(tmp_path / "run"),
        checkpointer=None,
    )
    with pytest.raises(RuntimeError, match="ran out of memory"):
        nitro.train()


def test_a_first_unpack_waits_until_the_epochs_last_losses_are_read(
    tmp_path, monkeypatch, packing_on
):
    """Dispatched before the epoch's last read, the unpack runs on the device while
    the host waits for the losses, but only once its program is compiled: on a
    process's first epoch its compile would hold the losses back (in a one-step
    epoch, the first step's)."""
    import jaxnitro.loop.settling as settling

    order = []
    real_unpack, real_settle = carried.unpack_program, calls.settle_calls
    monkeypatch.setattr(carried, "_UNPACKED", set())

    def unpacking(packing):
        program = real_unpack(packing)
        return lambda flats: order.append("unpack") or program(flats)

    def settling_calls(log, unread, accum):
        if unread:
            order.append("read")
        return real_settle(log, unread, accum)

    monkeypatch.setattr(carried, "unpack_program", unpacking)
    monkeypatch.setattr(calls, "settle_calls", settling_calls)
    assert settling.settle_calls is real_settle
    nitro = nx.Nitro(
        Tiny(n_train=16 * 6, max_epochs=2),
        run_dir=str(tmp_path / "run"),
        checkpointer=None,
        steps_per_call=4,
    ).on_epoch_end(lambda *_: order.append("end"))
    nitro.train()
    # (A progress bar's refresh may read losses mid-epoch too: only the ends count.)
    first = order[: order.index("end")]
    second = order[len(first) + 1 : -1]
    assert first[-2:] == ["read", "unpack"]  # its last losses, then the compile
    assert second[-2:] == ["unpack", "read"]  # compiled: the device unpacks meanwhile


def test_a_cpu_packs_a_small_state_around_each_step(tmp_path, monkeypatch):
    on_cpu = jax.default_backend() == "cpu"
    assert pack_rule() == (CPU_PACKING if on_cpu else ACCELERATOR_PACKING)
    # The CPU's rule, on any backend (and under --staged, which turns packing off).
    monkeypatch.setattr(calls, "pack_rule", lambda: CPU_PACKING)
    carried.CARRIED.clear()
    nitro = trained(tmp_path, "small", steps_per_call=2)
    packing = carried.CARRIED["packed"].packing  # what the next epoch starts from
    assert packing.each_step and packing.nbytes <= CPU_PACK_MOST_BYTES
    assert nitro.train_state.weights.params["w1"].shape == (8, 16)  # trees again
    # A state over the CPU's limit travels as it is.
    monkeypatch.setattr(calls, "pack_rule", lambda: PackRule(100, each_step=True))
    carried.CARRIED.clear()
    trained(tmp_path, "large", steps_per_call=2)
    assert carried.CARRIED["packed"].packing is None


def test_a_state_packed_around_each_step_trains_what_an_unpacked_one_does(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(calls, "pack_rule", lambda: None)
    plain = trained(tmp_path, "plain", steps_per_call=3, accum=2)
    monkeypatch.setattr(calls, "pack_rule", lambda: CPU_PACKING)
    carried.CARRIED.clear()
    got = trained(tmp_path, "packed", steps_per_call=3, accum=2)
    assert got.current_step == plain.current_step == 6
    assert_close_states(plain, got)
