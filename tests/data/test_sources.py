"""How a split's source is checked and read: the probe at setup, restartable
iteration, the epoch plans each path draws.
"""

import grain
import numpy as np
import pytest
from experiments import Tiny, make_batches, samples
from toy_sources import Sequential

import jaxnitro as nx
from jaxnitro.data.prefetch import NoPrefetch
from jaxnitro.data.sources import check_split


def test_a_source_that_resets_and_returns_its_one_iterator_is_accepted():
    """A source may hand out one iterator object it restarts on each __iter__ (a
    torch DataLoader with persistent workers does): restartable, so accepted. A
    shared iterator that does NOT restart runs short, which the loop refuses after
    the epoch (tests/loop/test_train.py)."""

    class Resetting(Sequential):
        def __init__(self):
            super().__init__()
            self.iterator = None

        def __iter__(self):
            self.iterator = Sequential.__iter__(self)  # a fresh pass, one object
            return self.iterator

    assert check_split("train", NoPrefetch(Resetting())) == 5


def test_a_list_of_batches_takes_the_materialized_path_and_never_warns():
    nitro = nx.Nitro(Tiny(), logger=None, checkpointer=None)
    assert {name: cfg.path for name, cfg in nitro.prepared.prefetch.items()} == {
        "train": "materialized",
        "val": "materialized",
        "test": "materialized",
    }
    assert "prefetch_path materialized" in nitro.binding_report()


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_grain_filter_is_refused_even_where_it_drops_the_probed_batch(split):
    batched = grain.MapDataset.source(samples(64)).batch(16)
    first = batched[0]["x"]
    holed = batched.filter(lambda b: not np.array_equal(b["x"], first))
    with pytest.raises(
        nx.ConfigError, match=f"Split `{split}` is a grain.MapDataset with `.filter"
    ):
        nx.Nitro(
            Tiny(),
            data={"train": batched, split: holed},
            logger=None,
            checkpointer=None,
        )


@pytest.mark.parametrize("split", ["train", "val"])
def test_an_unbatched_split_is_refused_at_setup(split):
    batched = grain.MapDataset.source(samples(64)).batch(16)
    single = grain.MapDataset.source(samples(64))  # per-sample x (8,) and y (3,)
    with pytest.raises(
        nx.ConfigError, match="x: 8, y: 3.*a source of single samples must be batched"
    ):
        nx.Nitro(
            Tiny(),
            data={"train": batched, split: single},
            logger=None,
            checkpointer=None,
        )


class CountsPlans:
    """The whole trait, counting its plans; `__iter__` plans through begin_epoch."""

    def __init__(self):
        batch = make_batches(64, 64)[0]
        self.x, self.y = batch["x"], batch["y"]
        self.epoch_token = 0

    def __len__(self):
        return 4

    def begin_epoch(self):
        self.epoch_token += 1
        return np.random.default_rng(self.epoch_token).permutation(64)

    def batch_at(self, i, plan=None):
        rows = plan[i * 16 : (i + 1) * 16]
        return {"x": self.x[rows], "y": self.y[rows]}

    def __iter__(self):
        plan = self.begin_epoch()
        return (self.batch_at(i, plan) for i in range(len(self)))


@pytest.mark.parametrize(
    "wrap",
    [lambda s: s, lambda s: nx.data.PrefetchIterator(s, workers=1), nx.data.NoPrefetch],
    ids=["fanout", "single", "inline"],
)
def test_setup_draws_one_plan_so_n_epochs_see_n_plus_one(wrap):
    source = CountsPlans()
    nitro = nx.Nitro(
        Tiny(max_epochs=2), data={"train": wrap(source)}, logger=None, checkpointer=None
    )
    assert source.epoch_token == 1  # the probe's one plan, drawn by its __iter__
    nitro.train()
    assert source.epoch_token == 3


class PlansInIter:
    """`batch_at` alone, its plan drawn in `__iter__`: nothing before it exists."""

    def __init__(self):
        batch = make_batches(64, 64)[0]
        self.x, self.y = batch["x"], batch["y"]
        self.rng = np.random.default_rng(0)
        self.plans = 0
        self.reads: list[int] = []  # the plan each batch_at read

    def __len__(self):
        return 4

    def batch_at(self, i):
        self.reads.append(self.plans)
        rows = self.perm[i * 16 : (i + 1) * 16]
        return {"x": self.x[rows], "y": self.y[rows]}

    def __iter__(self):
        self.perm = self.rng.permutation(64)
        self.plans += 1
        return (self.batch_at(i) for i in range(len(self)))


@pytest.mark.parametrize("inline", [False, True], ids=["single", "inline"])
def test_a_source_with_batch_at_alone_is_iterated_at_setup_and_every_epoch(inline):
    source = PlansInIter()
    split = nx.data.NoPrefetch(source) if inline else source
    if inline:
        nitro = nx.Nitro(
            Tiny(max_epochs=2), data={"train": split}, logger=None, checkpointer=None
        )
    else:
        with pytest.warns(nx.NitroWarning, match="runs in ONE producer thread"):
            nitro = nx.Nitro(
                Tiny(max_epochs=2),
                data={"train": split},
                logger=None,
                checkpointer=None,
            )
    nitro.train()
    last = source.plans
    assert source.reads[-8:] == [last - 1] * 4 + [last] * 4  # a new plan each epoch


def test_a_source_with_batch_at_and_no_iter_is_read_by_index_on_one_producer():
    class ByIndex:
        def __init__(self):
            self.batches = make_batches(64, 16)

        def __len__(self):
            return len(self.batches)

        def batch_at(self, i):
            return self.batches[i]

    with pytest.warns(nx.NitroWarning, match="runs in ONE producer thread"):
        nitro = nx.Nitro(
            Tiny(max_epochs=1),
            data={"train": ByIndex()},
            logger=None,
            checkpointer=None,
        )
    assert nitro.prepared.prefetch["train"].path == "single_no_trait"
    nitro.train()
    assert nitro.current_step == 4


class CountsCalls(CountsPlans):
    """`CountsPlans` counting its `__iter__` calls; each calls `begin_epoch` once."""

    def __init__(self):
        super().__init__()
        self.iters = 0

    def __iter__(self):
        self.iters += 1
        return super().__iter__()


@pytest.mark.parametrize(
    ("wrap", "iters"),
    [
        (lambda s: nx.data.PrefetchIterator(s, workers=2), 1),
        (lambda s: nx.data.PrefetchIterator(s, workers=1), 3),
        (nx.data.NoPrefetch, 3),
    ],
    ids=["fanout", "single", "inline"],
)
def test_only_the_fanout_calls_begin_epoch_and_the_other_paths_iterate(wrap, iters):
    """The spec: the fan-out never iterates and the other paths never call
    begin_epoch; setup's probe goes through iteration."""
    source = CountsCalls()
    nitro = nx.Nitro(
        Tiny(max_epochs=2), data={"train": wrap(source)}, logger=None, checkpointer=None
    )
    assert (source.iters, source.epoch_token) == (1, 1)  # the probe iterated
    nitro.train()
    assert source.iters == iters  # the fan-out's 2 plans came from begin_epoch
    assert source.epoch_token == 3


def test_a_sources_own_check_source_options_runs_at_setup_for_every_split():
    calls = []

    class Checked(list):
        def check_source_options(self, name, cfg):
            calls.append((name, cfg.path))

    class Buffered(list):
        def check_source_options(self, name, cfg):
            raise nx.ConfigError(f"split `{name}`: buffer=True reuses one array")

    data = Tiny().build_data(None)
    split = {
        "train": Checked(data["train"]),
        "val": nx.data.NoPrefetch(Checked(data["val"])),
    }
    nx.Nitro(Tiny(), data=split, logger=None, checkpointer=None)
    assert calls == [("train", "materialized"), ("val", "inline")]
    with pytest.raises(nx.ConfigError, match="split `train`: buffer=True reuses"):
        nx.Nitro(
            Tiny(),
            data={"train": Buffered(data["train"])},
            logger=None,
            checkpointer=None,
        )
    nx.data.check_source_options(Checked(), "test", nx.data.prefetch_config(Checked()))
    assert calls[-1] == ("test", "materialized")


def test_the_data_api_the_spec_lists_is_public():
    from jaxnitro.data import prefetch, protocol, sources, stream

    assert nx.data.check_source_options is sources.check_source_options
    assert nx.data.epoch_token is protocol.epoch_token
    assert nx.data.PrefetchStream is stream.PrefetchStream
    assert nx.data.batch_stream is prefetch.batch_stream
    assert nx.data.eval_stream is prefetch.eval_stream


@pytest.mark.parametrize("split, flags", [("train", "True"), ("val", "False")])
def test_a_split_given_as_a_dict_of_whole_arrays_points_to_array_source(split, flags):
    arrays = {"x": np.zeros((64, 8), np.float32), "y": np.zeros((64,), np.int64)}
    with pytest.raises(nx.ConfigError) as caught:
        check_split(split, arrays)
    message = str(caught.value)
    assert message.startswith(
        f"Split `{split}` is a dict of whole arrays (x: (64, 8) float32, y: (64,) "
        f"int64), not a sequence of batches"
    )
    assert (
        f"nx.ArraySource(arrays, batch_size=32, shuffle={flags}, drop_last={flags})"
        in message
    )
