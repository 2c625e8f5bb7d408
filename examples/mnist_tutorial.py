"""Tutorial: MNIST end to end, from configuration through training to prediction.

This is the spec's MNIST tutorial (spec/tutorial-mnist.txt) as one runnable file: an
encoder and a linear head over the ten classes, configured as a jaxnitro experiment,
trained, validated, evaluated on the test split, swept over a softmax temperature
without compiling anything, used to predict on new images, and exported as a bundle
that `nitro serve` serves.

    python examples/mnist_tutorial.py

By default it trains on scikit-learn's 8x8 digits, which ship with the wheel, so it
runs anywhere in well under a minute. Point NITRO_MNIST_DIR at a folder holding the
four MNIST IDX files (train-images-idx3-ubyte and friends, plain or .gz) to train on
real MNIST instead; nothing is ever downloaded. NITRO_RUN_DIR (default runs/mnist) says
where it writes. NITRO_SMOKE=1 turns it into a smoke test: the framework's smoke flag
trains one epoch on the first two batches of every split, in a temporary directory.

The optimizer recipe belongs to the experiment too: two parameter groups (the encoder
decays, the head does not), a one-cycle learning-rate schedule over the whole run,
global-norm clipping, and early stopping on the macro recall.
"""

import os
import time

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

import jaxnitro as nx
from jaxnitro.data.idx import load_mnist_dir

N_CLASSES = 10


# None of what follows is a jaxnitro dependency. Grain supplies batching and shuffling,
# which the framework deliberately does not ship; scikit-learn supplies the default
# images; and the framework never looks inside your data, so it does not care where
# the images came from.
def load_splits(mnist_dir: str | None = None) -> dict[str, dict[str, np.ndarray]]:
    """The train, val and test splits as dicts of host arrays, batch dimension first.

    Each split is `{"img": float32 (n, pixels) in [0, 1], "label": float32 (n, 10)
    one-hot}`. With `mnist_dir`, the MNIST IDX files there (pixels = 784): the last
    twelfth of the training files is val (55000/5000 on the real files), and t10k is
    test. Without it, scikit-learn's 8x8 digits (pixels = 64), shuffled once with a
    fixed seed and split 1200/297/300.
    """
    if mnist_dir:
        raw = load_mnist_dir(mnist_dir)  # uint8 (n, 28, 28) images, (n,) labels

        def flat(images: np.ndarray) -> np.ndarray:
            return images.reshape(len(images), -1).astype(np.float32) / 255

        images, labels = flat(raw["train_images"]), raw["train_labels"]
        n_val = len(images) // 12
        parts = {
            "train": (images[:-n_val], labels[:-n_val]),
            "val": (images[-n_val:], labels[-n_val:]),
            "test": (flat(raw["test_images"]), raw["test_labels"]),
        }
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()  # float64 (1797, 64) pixels in 0..16, int labels
        order = np.random.default_rng(0).permutation(len(digits.target))
        images = digits.data[order].astype(np.float32) / 16
        labels = digits.target[order]
        parts = {
            "train": (images[:1200], labels[:1200]),
            "val": (images[1200:1497], labels[1200:1497]),
            "test": (images[1497:], labels[1497:]),
        }
    one_hot = np.eye(N_CLASSES, dtype=np.float32)
    return {name: {"img": x, "label": one_hot[y]} for name, (x, y) in parts.items()}


def loader(
    split: dict[str, np.ndarray], batch_size: int, *, seed: int | None = None
) -> grain.MapDataset:
    """A Grain dataset of batch dicts over one split; shuffled when `seed` is given.

    A data source is anything sized (len() counts BATCHES) that yields dicts of host
    arrays. A `grain.MapDataset` is also index-addressable, which is what lets the
    framework build batch `i` of epoch `e` directly (it reads `ds[e * len(ds) + i]`,
    and a shuffled dataset answers with a fresh permutation every epoch).
    """
    samples = [
        {"img": img, "label": label}
        for img, label in zip(split["img"], split["label"], strict=True)
    ]
    dataset = grain.MapDataset.source(samples)
    if seed is None:
        # Eval splits keep their partial final batch: the framework pads it to the
        # compiled width, runs it, and slices the outputs back before any hook sees it.
        return dataset.batch(batch_size)
    # The train split drops its partial final batch: a short batch would compile a
    # second gradient program and weight its samples differently.
    return dataset.shuffle(seed=seed).batch(batch_size, drop_remainder=True)


class MLP(nn.Module):
    """Encoder and head. The head emits RAW LOGITS: no softmax inside the model."""

    width: int

    @nn.compact
    def __call__(self, img: jax.Array) -> jax.Array:
        hidden = nn.relu(nn.Dense(self.width, name="encoder")(img))
        return nn.Dense(N_CLASSES, name="head")(hidden)


class MnistMLP(nx.Experiment):
    """The tutorial's experiment: the class IS the run configuration."""

    # Three markers, three jobs. An unmarked field is Host: driver-only, and the tracer
    # only ever sees a sentinel for it. A GraphConst field bakes into the compiled graph
    # and is part of the compile cache key, so changing `width` recompiles, correctly.
    # A Device field is placed on the device at setup and reaches traced code as an
    # INPUT, so revising it compiles nothing.
    #
    # The images are deliberately NOT a field: `build_data` hands them to the
    # framework, which holds them apart from the experiment. Had we kept them on the
    # experiment, Host (unmarked) would be the only right marker: traced code sees a
    # Host field as a sentinel that raises, naming the field, if it is used, whereas a
    # GraphConst array would be baked into the graph and hashed into every cache key,
    # and a Device array would be copied to the accelerator at setup.

    width: nx.GraphConst[int] = 128
    """Width of the hidden layer. Structural: changes the compiled graph."""

    smoothing: nx.Device[float] = 0.05
    """Label smoothing. A knob to sweep without recompiling."""

    temperature: nx.Device[float] = 1.0
    """Softmax temperature, for post-hoc calibration. Swept at INFERENCE time, so it
    has to be a traced input rather than a baked constant."""

    class_weights: nx.Device[np.ndarray] = nx.field(
        default_factory=lambda: np.ones(N_CLASSES, np.float32)
    )
    """Per-class weights, filled in by `derive` from the training labels' counts.
    Uniform until then, so a handle built without a train split still has them."""

    mnist_dir: str | None = nx.field(
        default_factory=lambda: os.environ.get("NITRO_MNIST_DIR") or None
    )
    """A folder with the four MNIST IDX files, or None for scikit-learn's digits.
    Defaults to $NITRO_MNIST_DIR. Unmarked, so Host: read on the host, never traced."""

    batch_size: int = 50
    """Samples per micro-batch. Host: the batch shape reaches the compiler through
    the data itself, never through this field."""

    scratch: dict = nx.field(default_factory=dict)
    """Host-side state the hooks share: finalize_metrics stashes the last confusion
    matrix here for the phase monitor that logs it (see main)."""

    max_epochs: int = 20
    """Epochs to train for. Driver-only: never read inside a traced function."""

    # --- data -------------------------------------------------------------------------
    def build_data(self, dist):
        # Runs on the host, before device conversion, against the real experiment, so
        # Host fields such as `mnist_dir` read normally here. `dist` is the distribution
        # handle; nothing in this version dispatches on it.
        del dist
        splits = load_splits(self.mnist_dir)
        # Setup seeds NumPy with the run's seed just before build_data, so a shuffle
        # seed drawn here follows `seed=` and a seed sweep also reshuffles the data.
        shuffle_seed = int(np.random.randint(2**31))
        # Batch dimension FIRST in every field: img (B, pixels), label (B, 10). The
        # train batch count must divide by accum(): 1200 / 50 = 24 batches (and
        # 55000 / 50 = 1100 on MNIST), both even.
        return {
            "train": loader(splits["train"], self.batch_size, seed=shuffle_seed),
            "val": loader(splits["val"], self.batch_size),
            "test": loader(splits["test"], self.batch_size),
        }

    def derive(self, data):
        # Values that genuinely depend on the data, computed once and merged into the
        # experiment. This runs after build_data and before device conversion, so it
        # returns plain host values and the framework places them. `class_weights` is
        # Device rather than GraphConst: as a GraphConst array it would be baked into
        # the graph as a constant; as a Device it crosses as one buffer.
        train = data.get("train")
        if train is None:  # a predict-only handle built with data={}
            return {}
        # One pass over epoch 0's batches. The train splits divide by the batch size
        # (1200 and 55000 by 50), so dropping a partial batch loses no label here.
        counts = np.zeros(N_CLASSES)
        for index in range(len(train)):
            counts += train[index]["label"].sum(axis=0)
        weights = counts.sum() / (N_CLASSES * np.maximum(counts, 1))
        return {"class_weights": weights.astype(np.float32)}

    # --- the model --------------------------------------------------------------------
    def build_model(self, rng):
        # The head emits raw logits: softmax in the model followed by a log in the loss
        # is the numerically unstable spelling of the same thing. `predict` below is
        # where softmax appears, once, outside the compiled program.
        # The input width follows the data source. build_model runs on the real
        # experiment (only traced code gets the stripped view), so the Host field
        # `mnist_dir` reads normally here.
        pixels = 28 * 28 if self.mnist_dir else 8 * 8
        model = MLP(width=self.width)
        variables = model.init(rng, jnp.zeros((1, pixels), jnp.float32))
        return model, variables["params"], {}

    # Each hook declares the batch fields it wants as keyword-only arguments, and the
    # framework passes exactly those. `forward` declares only `img`, so it also runs on
    # a prediction batch that carries no labels.
    def forward(self, model, params, state, *, img):
        logits = model.apply({"params": params}, img)
        # `self.temperature` is a traced INPUT, so sweeping it later costs no compile.
        # It is 1 during training, where this is the identity.
        return logits / self.temperature, state

    def loss(self, logits, *, label):
        # The framework strips forward's new state, so `logits` is the (B, 10) array.
        smoothed = (1 - self.smoothing) * label + self.smoothing / N_CLASSES
        # jax.nn.log_softmax subtracts the row max. The hand-rolled
        # `logits - log(sum(exp(logits)))` overflows float32 for a logit above 88.7,
        # and a temperature swept toward zero is exactly the case that reaches it.
        logp = jax.nn.log_softmax(logits, axis=-1)
        weighted = smoothed * logp * self.class_weights[None, :]
        return -jnp.sum(weighted) / label.shape[0]

    def train_metrics(self, logits, *, label):
        # Traced per step next to the loss (scalars, no denominators): "is this step
        # doing something sane", not a summary of a split.
        hits = jnp.argmax(logits, axis=-1) == jnp.argmax(label, axis=-1)
        return {"batch_acc": jnp.mean(hits)}

    # --- metrics: each carries its own denominator ------------------------------------
    def metrics(self, logits, *, label):
        # Runs on the host (the default residency for `metrics`), on NumPy arrays that
        # never include padding: a padded final eval batch is sliced back first, so
        # `len(label)` is a real sample count.
        pred, truth = logits.argmax(axis=-1), label.argmax(axis=-1)
        confusion = np.zeros((N_CLASSES, N_CLASSES), np.int64)
        np.add.at(confusion, (pred, truth), 1)  # rows: predicted, columns: true
        return {
            # Per IMAGE: summed over the split, then divided by the summed counts.
            "acc": (int((pred == truth).sum()), len(label)),
            # "sum": accumulate and do NOT divide, which a confusion matrix needs.
            # Had the framework divided everything by an inferred batch size, this
            # would have been silently scaled into nonsense.
            "confusion": (confusion, "sum"),
        }

    def finalize_metrics(self, acc, split):
        # Host-side, once per split: macro recall over a split is not the mean of
        # per-batch macro recalls. Counted keys arrive divided; "sum" keys arrive as
        # totals, so `acc["confusion"]` is the matrix for the WHOLE split. `split` is
        # a plain string here; as an argument to `metrics` it would have cost a
        # second compiled program.
        confusion = acc["confusion"]
        recall = np.diag(confusion) / np.maximum(confusion.sum(axis=0), 1)
        # The matrix is not a scalar to log per epoch: stash it, and a phase monitor
        # on the transition out of evaluation logs it with log_confusion (main).
        self.scratch["confusion"] = confusion
        return {"acc": acc["acc"], "macro_recall": float(recall.mean())}

    # --- the optimizer recipe: part of what the experiment IS -------------------------
    def param_group(self, keypath):
        # `keypath` names a parameter leaf, e.g. ("encoder", "kernel"). Two groups: the
        # encoder, and everything else ("default"). The encoder runs at the base rate
        # and differs only in its decay.
        return "encoder" if keypath[0] == "encoder" else "default"

    def learning_rate(self, group=None):
        # The base rate. A per-group value would be a RATIO against it, which a
        # schedule then scales as a whole. The default optimizer is RAdam.
        return 2e-2

    def weight_decay(self, group=None):
        # Decoupled decay toward zero for the encoder only; biases are excluded by
        # the default no_decay (every 1-D leaf).
        return 1e-4 if group == "encoder" else 0.0

    def schedules(self):
        # Every entry is a factory of the horizon: called once with the total number
        # of optimizer steps, it returns step -> value. The key is Optax's own keyword
        # for the rule field, `learning_rate`. An Optax schedule needs no adapter.
        return {
            "learning_rate": lambda total: optax.cosine_onecycle_schedule(
                total, peak_value=2e-2, pct_start=0.2
            )
        }

    def early_stop(self):
        # Checked after each epoch's validation; follows the monitor below.
        return nx.EarlyStopping(patience=6)

    # --- run accessors: the experiment carries its own defaults -----------------------
    # Each is also a Nitro keyword, which wins for that one run. `max_epochs` needs no
    # method: the Host field of the same name is the accessor.
    def monitor(self):
        # What "best" means to the checkpointer, and what early stopping watches.
        return ("macro_recall", "max")

    def accum(self):
        # Two micro-batches per optimizer step. Baked into the gradient program as
        # 1/accum, so changing it compiles a new gradient program.
        return 2

    def gradient_clip_norm(self):
        # Global norm over the accumulated gradient; 0 is off and emits no clipping
        # ops at all. The threshold itself is an input of the optimizer program, so
        # a clip sweep compiles nothing; switching clipping on recompiles that one.
        return 1.0

    # --- export -----------------------------------------------------------------------
    # The wire contract of the exported model: what a client sends and what it gets
    # back. The client sends `img`, float32 (batch, pixels), batch axis first (the 1 is
    # a placeholder for each exported batch size), and receives forward's logits. The
    # softmax stays on the client, as it does after `predict`.
    def export_inputs(self):
        pixels = 28 * 28 if self.mnist_dir else 8 * 8
        return [nx.ExportSpec("img", "float32", (1, pixels))]

    def export_outputs(self):
        return [nx.ExportSpec("logits")]


def history_table(history: list[dict]) -> str:
    """One plain-text line per epoch."""
    lines = ["epoch   step  train_loss  val_acc  val_macro_recall  seconds"]
    for row in history:
        lines.append(
            f"{row['epoch']:5d} {row['step']:6d}  {row['train_loss']:10.4f}  "
            f"{row['acc']:7.4f}  {row['macro_recall']:16.4f}  {row['seconds']:7.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    started = time.perf_counter()
    run_dir = os.environ.get("NITRO_RUN_DIR", "runs/mnist")
    e = MnistMLP()
    print(f"data: {e.mnist_dir or 'scikit-learn digits (8x8)'}")

    # Constructing a Nitro runs setup only: data, derive, device placement, the model.
    # Nothing is compiled until a verb needs it. Under NITRO_SMOKE=1 the handle is a
    # smoke run (one epoch on two batches of each split, in a temporary run_dir).
    # Setup shows the binding report itself
    # (where every value came from): a panel on a terminal, a log record otherwise;
    # `nitro.binding_report()` returns its text.
    nitro = nx.Nitro(e, run_dir=run_dir)

    # The framework never logs a confusion matrix itself: only the experiment knows
    # it has one and what its labels mean. A monitor on this handle sees every phase
    # transition; each one out of evaluation carries that split's metrics, and the
    # one back to training follows the epoch's validation.
    def log_confusion(phase, step, epoch, info):
        if isinstance(phase, nx.TrainStepping) and "metrics" in info:
            labels = [str(c) for c in range(N_CLASSES)]
            nx.log_confusion(
                info["logger"], e.scratch["confusion"], labels, epoch=epoch
            )

    nx.register_phase_monitor(log_confusion, nitro=nitro)
    # On a terminal a progress bar shows the latest train loss and, after each
    # validation, the macro recall; in a log file (nohup, CI) one summary line per
    # epoch goes to stderr instead. nx.progress_reporter(None) turns both off.
    nitro.train()
    print(history_table(nitro.history))

    # validate, evaluate and predict share one compiled forward, so moving between
    # them compiles nothing.
    test = nitro.evaluate(split="test")
    print(f"test accuracy: {test['acc']:.4f}  macro recall: {test['macro_recall']:.4f}")

    # A temperature sweep on the live handle, scored on the whole test split.
    # `temperature` is Device, so each value is a new INPUT to the same compiled
    # program: the sweep compiles nothing. predict takes a batch dict, or an iterable
    # of them and returns a lazy iterator of host logits, one (B, 10) array per batch.
    # Only the fields forward declares (`img`) reach the device; `label` stays here.
    test_batches = [nitro.data["test"][i] for i in range(len(nitro.data["test"]))]
    truth = np.concatenate([b["label"].argmax(axis=-1) for b in test_batches])
    before = nx.cache_stats()
    for t in (0.5, 1.0, 2.0):
        nitro.set_device(temperature=t)
        logits = np.concatenate(list(nitro.predict(test_batches)))
        # Softmax appears here, once, on host arrays, outside the compiled program.
        logp = logits - logits.max(axis=-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(axis=-1, keepdims=True))
        nll = -logp[np.arange(len(truth)), truth].mean()
        confidence = np.exp(logp.max(axis=-1)).mean()
        print(f"temperature {t}: test NLL {nll:.4f}, mean confidence {confidence:.3f}")
    after = nx.cache_stats()
    print(f"compile cache before the sweep {before}, after {after}")
    nitro.set_device(temperature=1.0)
    print(f"temperature back to {nitro.device_value('temperature')}")

    # New data: a few images, no labels. The padding to the compiled batch width and
    # the slicing back are invisible: 6 images in, (6, 10) logits out.
    new_images = test_batches[0]["img"][:6]
    logits = nitro.predict({"img": new_images})
    print(f"predicted classes: {logits.argmax(axis=-1).tolist()} {logits.shape}")
    print(f"true classes:      {truth[:6].tolist()}")

    # Export: a StableHLO bundle (the programs, the weights, the wire contract and
    # where it all came from) that runs without this file or its classes. Device
    # fields are baked at their current value (temperature 1.0). One program per batch
    # size, plus one for any batch size; a bundle is never overwritten, so each run
    # exports into its own folder. Serve it with `nitro serve BUNDLE` (README).
    bundle_dir = os.path.join(
        nitro.run_dir, "export", nitro.checkpoint_run or "unnamed"
    )
    path = nx.export_model(
        nitro, nx.StableHLOBundle(), dir=bundle_dir, name="mnist", batch_sizes=[1, 8]
    )
    bundle = nx.load_bundle(path)
    served = bundle(img=new_images)["logits"]
    np.testing.assert_allclose(served, logits, rtol=1e-5, atol=1e-5)
    print(f"exported {bundle!r} to {path}")
    print(f"bundle agrees with predict: max |diff| {np.abs(served - logits).max():.1e}")

    # Where the run lives: the checkpoints, their manifest and metrics.jsonl, and
    # the best record by the monitor, which `weights=` or `nitro ckpt` can load.
    print(f"run directory: {os.path.abspath(nitro.run_dir)}")
    best = nx.selected_checkpoint(nitro.checkpointer, nitro.run_dir)
    if best is not None:
        print(
            f"best checkpoint: {best.path} (epoch {best.epoch}, "
            f"{best.metric} {best.score:.4f})"
        )
    print(f"wall time: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
