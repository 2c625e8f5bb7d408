"""Blocks assembled on the prefetch pass's own thread (issue 26, item 7).

A pass with threads of its own groups, stacks and (on an accelerator) places its
blocks on its in-order thread, so the loop is handed one staged block per call; a
pass read on the consumer is grouped by the loop with the same assembler. Either
way training is bitwise the same.
"""

import threading

import jax
import numpy as np
import pytest
from experiments import StopsAtStep, Tiny, make_batches
from toy_sources import FannedOut

import jaxnitro as nx
import jaxnitro.loop.feed as feed
from jaxnitro.errors import ConfigError
from jaxnitro.loop.assembly import (
    Block,
    BlockAssembler,
    BlockSettings,
    PassEnd,
)
from jaxnitro.loop.blocks import CPU_DIRECT_BATCH_BYTES, DIRECT_BATCH_BYTES


class Threaded(Tiny):
    """Tiny through the fan-out: 7 batches of 16 built by 2 workers."""

    n_train: int = 16 * 7

    def build_data(self, dist):
        return {
            "train": nx.data.PrefetchIterator(
                FannedOut(make_batches(self.n_train, 16)), workers=2
            )
        }


def weights(nitro):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(nitro.train_state.weights)]


def assert_same(a, b):
    for x, y in zip(weights(a), weights(b), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.fixture
def made(monkeypatch):
    """Each block an assembler completes: (the thread that completed it, block)."""
    completed = []
    complete = BlockAssembler._complete

    def recorded(self, steps):
        block = complete(self, steps)
        completed.append((threading.current_thread().name, block))
        return block

    monkeypatch.setattr(BlockAssembler, "_complete", recorded)
    return completed


def settings(**kw):
    base = dict(
        fields=("x", "y"),
        expected=16,
        epoch=1,
        skip=0,
        accum=1,
        per_call=4,
        on_device=False,
    )
    return BlockSettings(**(base | kw))


def assembled(batches, stages=False, **kw):
    assembler = BlockAssembler(settings(**kw), batches, stages)
    items = []
    for batch in batches:
        if stages:
            items += assembler(batch)
        else:
            block = assembler.add(batch, {k: batch[k] for k in ("x", "y")})
            items += [] if block is None else [block]
    return items + assembler.finish()


def test_blocks_are_cut_at_the_epochs_end_and_count_what_was_delivered():
    # Small batches: a block holds 8 steps (blocks.BLOCK_STEPS), at least per_call.
    items = assembled(make_batches(16 * 11, 16), per_call=4)
    blocks, end = items[:-1], items[-1]
    assert [(b.steps, b.delivered, b.plan.size) for b in blocks] == [
        (8, 8, 8),
        (3, 11, 8),
    ]
    assert [index for _, _, index in blocks[1].batches] == [8, 9, 10]
    assert end == PassEnd(11)
    assert all(b.stacked is None for b in blocks)  # the loop stacks them


def test_a_resumed_epoch_passes_over_its_trained_batches_and_counts_them():
    items = assembled(make_batches(16 * 11, 16), skip=5, per_call=4)
    (block, end) = items
    assert [index for _, _, index in block.batches] == [5, 6, 7, 8, 9, 10]
    assert (block.steps, block.delivered, end.delivered) == (6, 11, 11)


def test_a_source_that_runs_short_ends_in_its_whole_steps():
    class Short(list):
        def __len__(self):  # says 8 batches, holds 5
            return 8

    items = assembled(Short(make_batches(16 * 5, 16)), per_call=2, accum=2)
    blocks, end = items[:-1], items[-1]
    # A block of 4 steps was under way: its 2 whole steps (batches 0-3) train,
    # batch 4 alone, half a step, does not.
    assert [b.steps for b in blocks] == [2]
    assert end.delivered == 5


def test_a_thread_stacks_each_block_and_on_an_accelerator_places_it():
    # (Its copy started, not waited for: tests/data/test_transfer.py.)
    batches = make_batches(16 * 11, 16)
    (full, short, _) = assembled(batches, stages=True, on_device=True)
    assert isinstance(full.stacked["x"], jax.Array)
    # A block cut short (3 steps of 8) travels unpadded, padded on the device.
    assert short.steps == 3 and short.stacked["x"].shape == (8, 16, 8)
    placed = np.asarray(short.stacked["x"])
    np.testing.assert_array_equal(placed[2], batches[10]["x"])
    assert not placed[3:].any()
    (host, _, _) = assembled(batches, stages=True, on_device=False)
    assert isinstance(host.stacked["x"], np.ndarray)


def test_a_block_never_holds_more_steps_than_the_epoch():
    # A one-batch epoch (a first step) and an epoch shorter than steps_per_call:
    # one block of the epoch's length, nothing padded (no padding program).
    (one, _) = assembled(make_batches(16, 16), stages=True, on_device=True, per_call=1)
    assert (one.steps, one.plan.size, one.stacked["x"].shape) == (1, 1, (1, 16, 8))
    (five, _) = assembled(make_batches(16 * 5, 16), per_call=16)
    assert (five.steps, five.plan.size) == (5, 5)


@pytest.mark.parametrize("on_device", [False, True])
def test_at_one_step_a_call_small_batches_travel_in_blocks_and_large_ones_alone(
    on_device,
):
    """Small batches go in blocks of 8 on every backend (on a CPU too: there the
    program's conversion of each host array cost a tiny model's step as much as
    the block's stack and copy); a batch of `CPU_DIRECT_BATCH_BYTES` or more
    (`DIRECT_BATCH_BYTES` off a CPU) goes to the program alone."""
    small = make_batches(16 * 9, 16)  # 16 x 8 float32 and 16 x 2: 640 bytes
    blocks = assembled(small, per_call=1, on_device=on_device)[:-1]
    assert [(b.steps, b.plan.size) for b in blocks] == [(8, 8), (1, 8)]
    bound = DIRECT_BATCH_BYTES if on_device else CPU_DIRECT_BATCH_BYTES
    width = bound // (16 * 4)  # float32 columns: x alone reaches the bound
    large = [
        {"x": np.zeros((16, width), np.float32), "y": np.zeros((16, 2), np.float32)}
        for _ in range(3)
    ]
    items = assembled(large, per_call=1, on_device=on_device)
    assert [b.plan.size for b in items[:-1]] == [1, 1, 1]


def test_a_batch_of_another_size_is_refused_naming_it():
    batches = make_batches(16 * 3, 16)
    batches[2] = {k: v[:8] for k, v in batches[2].items()}
    with pytest.raises(ConfigError, match="Train batch 2 of epoch 1 holds 8 samples"):
        assembled(batches)


@pytest.mark.parametrize("accelerator", [False, True])
def test_a_threaded_pass_hands_the_loop_blocks_its_thread_staged(
    monkeypatch, made, accelerator
):
    monkeypatch.setattr(feed, "stages_on_device", lambda: accelerator)
    base = nx.Nitro(Threaded(), logger=None, checkpointer=None, steps_per_call=1)
    base.train()
    made.clear()
    got = nx.Nitro(Threaded(), logger=None, checkpointer=None, steps_per_call=4)
    got.train()
    assert_same(base, got)
    # Per epoch one block of 7 steps (called 4 + 3), assembled on the transfer
    # thread, stacked there and, on an accelerator, placed there.
    assert [b.steps for _, b in made] == [7, 7]
    assert {name for name, _ in made} == {"jaxnitro-prefetch-train-transfer"}
    kind = jax.Array if accelerator else np.ndarray
    assert all(isinstance(b.stacked["x"], kind) for _, b in made)


def test_on_a_cpu_at_one_step_a_call_the_loop_groups_a_threaded_pass_itself(
    monkeypatch,
):
    monkeypatch.setattr(feed, "stages_on_device", lambda: False)
    threads = []
    add = BlockAssembler.add

    def recorded(self, host, routed):
        threads.append(threading.current_thread().name)
        return add(self, host, routed)

    monkeypatch.setattr(BlockAssembler, "add", recorded)
    nx.Nitro(Threaded(), logger=None, checkpointer=None, steps_per_call=1).train()
    assert set(threads) == {"MainThread"}  # a thread would add a hand-off a step


def test_a_stop_and_resume_on_a_threaded_pass_train_as_one_run(tmp_path):
    straight = nx.Nitro(Threaded(), logger=None, checkpointer=None, steps_per_call=1)
    straight.train()
    stopper = StopsAtStep(2)
    first = nx.Nitro(
        Threaded(),
        run_dir=str(tmp_path),
        logger=stopper,
        log_every_n_steps=1,
        steps_per_call=3,
    )
    stopper.nitro = first
    first.train()
    assert (first.current_epoch, first.current_step) == (1, 6)
    again = nx.Nitro(
        Threaded(), run_dir=str(tmp_path), logger=None, resume="auto", steps_per_call=3
    )
    again.train()  # batch 6 of epoch 1, then epoch 2: 7 batches
    assert again.current_step == 14
    assert_same(straight, again)


def test_a_batch_that_changes_shape_on_a_threaded_pass_is_refused_by_name():
    batches = make_batches(16 * 7, 16)
    batches[5] = {**batches[5], "x": batches[5]["x"][:, :4]}

    class Changing(Threaded):
        def build_data(self, dist):
            return {"train": nx.data.PrefetchIterator(FannedOut(batches), workers=2)}

    nitro = nx.Nitro(Changing(), logger=None, checkpointer=None, steps_per_call=4)
    with pytest.raises(
        nx.ConfigError, match="Batch 5 of split `train` .*changes the shape"
    ):
        nitro.train()
    assert nitro.current_step == 0  # its block never reached a call


def test_a_block_is_a_staged_item_the_stream_frees():
    stacked = {"x": jax.numpy.ones((2, 3))}
    block = Block([], 2, None, 2, stacked)
    assert block.device is stacked and block.host == ()
    assert Block([], 2, None, 2).device == {} and PassEnd(3).device == {}


def test_a_host_block_several_calls_read_is_placed_once(monkeypatch):
    import jaxnitro.loop.calls as calls

    monkeypatch.setattr(feed, "stages_on_device", lambda: False)
    placed = []
    real = calls.transfer

    def counted(batches, *args, **kw):
        placed.append(batches["x"].shape)
        return real(batches, *args, **kw)

    monkeypatch.setattr(calls, "transfer", counted)
    nx.Nitro(Threaded(), logger=None, checkpointer=None, steps_per_call=3).train()
    # Each epoch's one block of 7 steps (the epoch's length) is read by calls of
    # 3, 3 and 1 steps: placed once, not sent with each call.
    assert placed == [(7, 16, 8), (7, 16, 8)]


@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("accelerator", [False, True])
def test_on_a_mesh_a_threaded_pass_places_its_blocks_split_over_the_devices(
    monkeypatch, made, accelerator
):
    monkeypatch.setattr(feed, "stages_on_device", lambda: accelerator)
    kw = {"logger": None, "checkpointer": None, "n_devs": 2, "accum": 2}
    base = nx.Nitro(Threaded(n_train=16 * 8), steps_per_call=1, **kw)
    base.train()
    made.clear()
    got = nx.Nitro(Threaded(n_train=16 * 8), steps_per_call=2, **kw)
    got.train()
    assert_same(base, got)
    assert [b.steps for _, b in made] == [4, 4]
    if accelerator:  # (steps, accum, B, ...) split along B over the 2 devices
        x = made[0][1].stacked["x"]  # freed by now: its calls have run
        assert x.shape == (4, 2, 16, 8) and x.is_deleted()
        assert x.sharding.shard_shape(x.shape) == (4, 2, 8, 8)


def test_a_block_of_device_batches_is_stacked_on_the_device_in_one_call(monkeypatch):
    from jaxnitro.loop import blocks

    host = make_batches(16 * 5, 16)
    device = [{k: jax.device_put(v) for k, v in b.items()} for b in host]
    stacks = []
    real = blocks._device_stacker

    def counted(pad, accum):
        program = real(pad, accum)
        return lambda fields: stacks.append(sorted(fields)) or program(fields)

    monkeypatch.setattr(blocks, "_device_stacker", counted)
    got = blocks.stacked_block(device, 5, 1, 8)
    assert stacks == [["x", "y"]]  # both fields, one program
    want = blocks.stacked_block(host, 5, 1, 8)  # padded with the last batch
    for name in ("x", "y"):
        assert isinstance(got[name], jax.Array) and got[name].shape[0] == 8
        np.testing.assert_array_equal(np.asarray(got[name]), want[name])
    # A one-step block of device batches stays there (no copy back to the host).
    one = blocks.stacked_block(device[:1], 1, 1, 1)
    assert isinstance(one["x"], jax.Array) and one["x"].shape == (1, 16, 8)
    # Under accumulation: (steps, accum, B, ...), as the host stack is.
    paired = blocks.stacked_block(device[:4], 2, 2, 2)
    np.testing.assert_array_equal(
        np.asarray(paired["x"]), blocks.stacked_block(host[:4], 2, 2, 2)["x"]
    )


def test_a_host_block_is_its_batches_in_order_padded_with_the_last():
    from jaxnitro.loop import blocks

    host = make_batches(16 * 5, 16)
    got = blocks.stacked_block(host, 5, 1, 8)
    for name in ("x", "y"):
        want = np.stack([b[name] for b in host] + [host[-1][name]] * 3)
        np.testing.assert_array_equal(got[name], want)
        assert got[name].dtype == host[0][name].dtype
    unpadded = blocks.stacked_block(host, 5, 1, 8, pad_host=False)
    assert unpadded["x"].shape == (5, 16, 8)
    paired = blocks.stacked_block(host[:4], 2, 2, 2)  # (steps, accum, B, ...)
    np.testing.assert_array_equal(paired["y"][1, 0], host[2]["y"])


@pytest.mark.parametrize(
    "change",
    [
        lambda x: x[:1],  # would broadcast into a row: still refused
        lambda x: x[:, :4],
        lambda x: x.astype(np.float64),
    ],
    ids=["one-row", "narrower", "float64"],
)
def test_a_host_block_whose_batches_differ_is_refused(change):
    # The calls loop and the assembler turn the ValueError into the refusal that
    # names the batch (refuse_changed).
    from jaxnitro.loop import blocks

    host = make_batches(16 * 3, 16)
    host[2] = {**host[2], "x": change(host[2]["x"])}
    with pytest.raises(ValueError, match="field x holds several"):
        blocks.stacked_block(host, 3, 1, 8)
