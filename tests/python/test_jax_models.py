"""Models written for JAX (flax linen and nnx, optax, equinox, haiku) run unchanged on pathways and
give JAX's numbers: per device against `jax.vmap` with the same axis name (what `jax.pmap` computes),
single-device functions against `jax.jit`."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
flax = pytest.importorskip("flax")
optax = pytest.importorskip("optax")
nn = flax.linen

import pathways as pw  # noqa: E402

from conftest import assert_runtime_works  # noqa: E402
from test_jax_frontend import assert_same  # noqa: E402

RNG = np.random.default_rng(1)


def replicate(tree, n):
    return jax.tree_util.tree_map(lambda a: np.broadcast_to(np.asarray(a), (n,) + np.shape(a)), tree)


class _Block(nn.Module):
    d: int
    heads: int
    drop: float

    @nn.compact
    def __call__(self, x, train):
        h = nn.LayerNorm()(x)
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        h = nn.SelfAttention(num_heads=self.heads, dropout_rate=self.drop, deterministic=not train)(h, mask=mask)
        x = x + nn.Dropout(self.drop, deterministic=not train)(h)
        h = nn.Dense(2 * self.d)(nn.LayerNorm()(x))
        return x + nn.Dropout(self.drop, deterministic=not train)(nn.Dense(self.d)(nn.gelu(h)))


class TinyLM(nn.Module):
    vocab: int = 32
    d: int = 16
    heads: int = 2
    layers: int = 2
    drop: float = 0.1

    @nn.compact
    def __call__(self, tokens, train=False):
        emb = nn.Embed(self.vocab, self.d)
        x = emb(tokens) + self.param("pos", nn.initializers.normal(0.02), (tokens.shape[1], self.d))
        for _ in range(self.layers):
            x = _Block(self.d, self.heads, self.drop)(x, train)
        return emb.attend(nn.LayerNorm()(x))


def _lm_step(model, tx):
    def loss_fn(params, tokens, key):
        logits = model.apply(params, tokens[:, :-1], train=True, rngs={"dropout": key})
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def step(params, opt_state, tokens, key):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, key)
        grads = jax.lax.pmean(grads, "d")
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, "d"), grads

    return step


def test_flax_transformer_lm_data_parallel_with_dropout_adamw_and_pmean(tpus2):
    model = TinyLM()
    tx = optax.adamw(1e-3)
    step = _lm_step(model, tx)
    tokens = RNG.integers(0, 32, (3, 2, 4, 9)).astype(np.int32)  # steps x devices x batch x seq
    params = model.init(jax.random.PRNGKey(0), tokens[0, 0, :, :-1])
    opt_state = tx.init(params)
    state_pw = state_jax = (replicate(params, 2), replicate(opt_state, 2))
    pstep = pw.pmap(step, axis_name="d", devices=tpus2)
    vstep = jax.jit(jax.vmap(step, axis_name="d"))
    for i in range(3):
        keys = jax.random.split(jax.random.PRNGKey(i), 2)
        p1, o1, loss1, g1 = pstep(*state_pw, tokens[i], keys)
        p2, o2, loss2, g2 = vstep(*state_jax, tokens[i], keys)
        np.testing.assert_allclose(np.asarray(loss1), np.asarray(loss2), rtol=2e-6)
        assert_same(g1, g2, rtol=1e-4, atol=2e-7)
        # Adam divides by the gradient's RMS: where the exact gradient is 0 (attention's key
        # bias, which softmax does not see) round-off of 1e-9 moves a parameter by up to the
        # learning rate per step. Every other parameter agrees to float32 round-off.
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(p1), jax.tree_util.tree_leaves(p2)):
            key_bias = "'key'" in jax.tree_util.keystr(path) and "'bias'" in jax.tree_util.keystr(path)
            assert_same(a, b, rtol=0, atol=2.5e-3 * (i + 1) if key_bias else 1e-6)
        state_pw, state_jax = (p1, o1), (p2, o2)
    assert pstep._front_end == "jax"


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.Conv(8, (3, 3), strides=(2, 2), padding="VALID")(x)
        x = nn.avg_pool(nn.relu(x), (2, 2), strides=(1, 1), padding="SAME")
        return nn.Dense(10)(x.reshape(x.shape[0], -1))


def test_flax_cnn_train_step_against_jax():
    model = CNN()
    x = RNG.standard_normal((4, 12, 12, 3)).astype(np.float32)
    y = RNG.integers(0, 10, 4).astype(np.int32)
    params = model.init(jax.random.PRNGKey(0), x)
    tx = optax.sgd(0.1, momentum=0.9)

    def step(params, opt_state, x, y):
        def loss(p):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

        l, g = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(g, opt_state)
        return optax.apply_updates(params, updates), opt_state, l

    s1 = s2 = (params, tx.init(params))
    for _ in range(3):
        *s1, l1 = pw.jit(step)(*s1, x, y)
        *s2, l2 = jax.jit(step)(*s2, x, y)
        np.testing.assert_allclose(np.asarray(l1), np.asarray(l2), rtol=1e-5)
        assert_same(s1, s2, rtol=1e-4, atol=1e-5)


def test_flax_nnx_model_through_split_and_merge():
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Sequential(nnx.Linear(3, 8, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(8, 2, rngs=nnx.Rngs(1)))
    graphdef, state = nnx.split(model)
    x = RNG.standard_normal((5, 3)).astype(np.float32)

    def loss(state, x):
        return jnp.sum(nnx.merge(graphdef, state)(x) ** 2)

    assert_same(pw.jit(jax.value_and_grad(loss))(state, x), jax.jit(jax.value_and_grad(loss))(state, x),
                rtol=1e-5)


def test_equinox_mlp_after_partition():
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(mlp, eqx.is_array)
    x = RNG.standard_normal((6, 3)).astype(np.float32)

    def loss(params, x):
        return jnp.mean(jax.vmap(eqx.combine(params, static))(x) ** 2)

    got = pw.jit(jax.value_and_grad(loss))(params, x)
    assert_same(got, jax.jit(jax.value_and_grad(loss))(params, x), rtol=1e-5)
    assert type(got[1]) is type(params)  # the module's own structure comes back
    # Without partition, the functions among the leaves are a clear error.
    with pytest.raises(TypeError, match=r"eqx.partition"):
        pw.jit(lambda m, x: jax.vmap(m)(x))(mlp, x)
    assert_runtime_works()


def test_haiku_mlp_against_jax():
    hk = pytest.importorskip("haiku")
    net = hk.transform(lambda x, train: hk.nets.MLP([8, 2], activate_final=False)(
        hk.dropout(hk.next_rng_key(), 0.2, x) if train else x))
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    params = net.init(jax.random.PRNGKey(0), x, True)
    f = lambda p, k, x: net.apply(p, k, x, True)  # noqa: E731
    assert_same(pw.jit(f)(params, jax.random.PRNGKey(3), x), jax.jit(f)(params, jax.random.PRNGKey(3), x),
                rtol=1e-5)


def test_registered_dataclasses_and_flax_structs_round_trip():
    from flax import struct

    @struct.dataclass
    class State:
        w: jax.Array
        step: jax.Array
        name: str = struct.field(pytree_node=False, default="s")

    out = pw.jit(lambda s: s.replace(w=s.w * 2, step=s.step + 1))(State(jnp.ones(3), jnp.int32(0)))
    assert isinstance(out, State) and out.name == "s"
    np.testing.assert_array_equal(np.asarray(out.w), 2.0)
    assert int(np.asarray(out.step)) == 1


def test_typed_prng_keys_in_and_out():
    key = jax.random.key(0)
    k1, k2 = pw.jit(lambda k: tuple(jax.random.split(k)))(key)
    want1, want2 = jax.random.split(key)
    assert jax.dtypes.issubdtype(k1.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(k1), jax.random.key_data(want1))
    np.testing.assert_array_equal(jax.random.key_data(k2), jax.random.key_data(want2))
    x = pw.jit(lambda k: jax.random.normal(k, (3,)))(k1)
    np.testing.assert_allclose(np.asarray(x), jax.random.normal(want1, (3,)), rtol=1e-6)


def test_two_stage_pipeline_in_one_program_with_jax_vjp(devices_of):
    """A 2-stage model as one @pw.program: each stage's forward keeps its jax.vjp residuals on
    its slice, and the backward pass runs stage 2 then stage 1 on their slices."""
    d1, d2 = devices_of(2), devices_of(2)
    w1 = RNG.standard_normal((2, 4, 4)).astype(np.float32) * 0.5
    w2 = RNG.standard_normal((2, 4, 1)).astype(np.float32) * 0.5
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    y = RNG.standard_normal((2, 3, 1)).astype(np.float32)

    def stage1(w, x):
        return jnp.tanh(x @ w)

    def stage2(w, h, y):
        return jnp.mean((h @ w - y) ** 2)

    def s1_fwd_bwd(w, x, dh):
        _, vjp = jax.vjp(stage1, w, x)
        return vjp(dh)[0]

    def s2_loss_grads(w, h, y):
        loss, (dw, dh) = jax.value_and_grad(stage2, argnums=(0, 1))(w, h, y)
        return loss, dw, dh

    fwd1 = pw.pmap(stage1, devices=d1)
    back2 = pw.pmap(s2_loss_grads, devices=d2)
    back1 = pw.pmap(s1_fwd_bwd, devices=d1)

    @pw.program
    def train_step(w1, w2, x, y):
        h = fwd1(w1, x)
        loss, dw2, dh = back2(w2, h, y)
        dw1 = back1(w1, x, dh)
        return loss, dw1, dw2

    loss, dw1, dw2 = train_step(w1, w2, x, y)

    def full(w1, w2, x, y):
        return stage2(w2, stage1(w1, x), y)

    want = jax.vmap(jax.value_and_grad(full, argnums=(0, 1)))(w1, w2, x, y)
    assert_same((loss, dw1, dw2), (want[0], *want[1]), rtol=1e-5, atol=1e-6)
