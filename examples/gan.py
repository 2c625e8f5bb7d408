"""A minimal GAN in manual mode: a generator and a discriminator, each on its own
optimizer, learning a 2-D mixture of four Gaussians.

    python examples/gan.py

`train_step` owns the whole optimizer step: one discriminator update on real and
generated points, then one generator update whose gradient flows through the
discriminator as a function of the fake points only (the discriminator's parameters
are a constant of `backward`). The framework keeps the rest: the batch stream,
validation, checkpoints, logging, stopping.

Validation reports how far the generated points lie from the nearest mixture
centre (the `loss` column): about 2 for the untrained generator, a fraction of it
once it has learnt where the data is. NITRO_EXAMPLE_EPOCHS=1 turns the script into a
smoke test, and NITRO_RUN_DIR (default runs/gan) says where it writes.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxnitro as nx

CENTRES = np.array([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0], [0.0, -2.0]], np.float32)
SPREAD = 0.1


def mixture_batches(n: int, batch: int, latent: int, seed: int) -> list[dict]:
    """`n` points of the mixture with `n` latent draws, as batches of `batch`:
    `real` float32[batch, 2], `z` float32[batch, latent]."""
    rng = np.random.default_rng(seed)
    modes = rng.integers(0, len(CENTRES), n)
    real = CENTRES[modes] + SPREAD * rng.normal(size=(n, 2)).astype(np.float32)
    z = rng.normal(size=(n, latent)).astype(np.float32)
    return [
        {"real": real[i : i + batch], "z": z[i : i + batch]}
        for i in range(0, n - batch + 1, batch)
    ]


def init_mlp(rng, sizes: tuple[int, ...]) -> list[dict]:
    keys = jax.random.split(rng, len(sizes) - 1)
    return [
        {
            "w": jax.random.normal(k, (m, n)) * jnp.sqrt(1.0 / m),
            "b": jnp.zeros(n),
        }
        for k, m, n in zip(keys, sizes[:-1], sizes[1:], strict=True)
    ]


def apply_mlp(layers: list[dict], x: jax.Array) -> jax.Array:
    for layer in layers[:-1]:
        x = jax.nn.leaky_relu(x @ layer["w"] + layer["b"][None, :], 0.2)
    return x @ layers[-1]["w"] + layers[-1]["b"][None, :]


def disc_loss(disc, gen, real, z):
    """The discriminator's logistic loss: real points up, generated points down."""
    fake = apply_mlp(gen, z)
    return jnp.mean(
        jax.nn.softplus(-apply_mlp(disc, real)) + jax.nn.softplus(apply_mlp(disc, fake))
    )


def gen_loss(gen, disc, z):
    """The generator's non-saturating loss, through the (constant) discriminator."""
    return jnp.mean(jax.nn.softplus(-apply_mlp(disc, apply_mlp(gen, z))))


def nearest_centre_distance(points: jax.Array) -> jax.Array:
    """The mean distance from each point float32[n, 2] to its nearest centre."""
    gaps = points[:, None, :] - jnp.asarray(CENTRES)[None, :, :]
    return jnp.mean(jnp.min(jnp.sqrt(jnp.sum(gaps**2, -1)), -1))


class MixtureGAN(nx.Experiment):
    """A GAN on a 2-D mixture of four Gaussians, trained in manual mode."""

    latent: nx.GraphConst[int] = 4
    """Size of the generator's noise input."""

    hidden: nx.GraphConst[int] = 64
    """Width of both networks' hidden layers."""

    lr_gen: float = 5e-3
    """The generator's Adam learning rate."""

    lr_disc: float = 5e-3
    """The discriminator's Adam learning rate."""

    n_train: int = 4096
    """Mixture points per epoch."""

    batch: int = 128
    """Points per batch."""

    max_epochs: int = 20

    def build_data(self, dist):
        return {
            "train": mixture_batches(self.n_train, self.batch, self.latent, seed=0),
            "val": mixture_batches(512, 256, self.latent, seed=1),
        }

    def build_model(self, rng):
        k_gen, k_disc = jax.random.split(rng)
        gen = init_mlp(k_gen, (self.latent, self.hidden, self.hidden, 2))
        # A small last layer: the untrained generator puts its points near the
        # origin, about 2 from every centre.
        gen[-1]["w"] = gen[-1]["w"] * 0.1
        params = {
            "gen": gen,
            "disc": init_mlp(k_disc, (2, self.hidden, self.hidden, 1)),
        }
        return None, params, {}

    def forward(self, model, params, state, *, z):
        """The generated points float32[batch, 2] for the noise `z`."""
        return apply_mlp(params["gen"], z), state

    def loss(self, fake):
        """Validation: how far the generated points are from the nearest centre."""
        return nearest_centre_distance(fake)

    def setup_optimizers(self, model, params, state, mesh):
        return {
            "gen": nx.setup_optimizer(optax.adam(self.lr_gen, b1=0.5), params["gen"]),
            "disc": nx.setup_optimizer(
                optax.adam(self.lr_disc, b1=0.5), params["disc"]
            ),
        }

    def train_step(self, model, params, opt_state, state, *, real, z):
        d_loss, g_disc = nx.backward(disc_loss, params["disc"], params["gen"], real, z)
        opt_disc, disc = nx.step_optimizer(opt_state["disc"], params["disc"], g_disc)
        # The updated discriminator is a constant here: the generator's gradient
        # reaches it only through the fake points.
        g_loss, g_gen = nx.backward(gen_loss, params["gen"], disc, z)
        opt_gen, gen = nx.step_optimizer(opt_state["gen"], params["gen"], g_gen)
        return {
            "loss": g_loss,
            "params": {"gen": gen, "disc": disc},
            "state": state,
            "opt_state": {"gen": opt_gen, "disc": opt_disc},
            "stats": {"d_loss": d_loss},
        }


def main() -> nx.Nitro:
    epochs = int(os.environ.get("NITRO_EXAMPLE_EPOCHS", "20"))
    run_dir = os.environ.get("NITRO_RUN_DIR", "runs/gan")
    nitro = nx.Nitro(MixtureGAN(max_epochs=epochs), run_dir=run_dir)
    untrained = nitro.validate()["loss"]
    nitro.train()
    last = nitro.history[epochs]["loss"]
    print(
        f"distance to the nearest centre: untrained {untrained:.3f}, "
        f"after {epochs} epochs {last:.3f}"
    )
    return nitro


if __name__ == "__main__":
    main()
