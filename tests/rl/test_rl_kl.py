"""KL estimators: the Gaussian experiment of the report in closed form, and what each placement differentiates to.

Gaussian case (x ~ q = N(0, 1), p = N(mu, 1), log r = mu x - mu^2 / 2, KL(q || p) = mu^2 / 2):
  k1: mean mu^2/2,            var mu^2
  k2: mean mu^2/2 + mu^4/8,   var mu^4/2 + mu^6/4
  k3: mean mu^2/2,            var e^{mu^2} - 1 - mu^2
Monte-Carlo tolerances are 5 standard errors computed from these closed-form variances.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _rl_toy as toy
from c2jax.rl.kl import kl_estimate, kl_loss_per_token, kl_metrics, kl_reward_penalty
from c2jax.rl.loss import make_rl_loss
from _paths import REPO_ROOT  # noqa: E402


def gaussian_closed_form(mu):
    kl = mu ** 2 / 2
    return {
        "k1": (kl, mu ** 2),
        "k2": (kl + mu ** 4 / 8, mu ** 4 / 2 + mu ** 6 / 4),
        "k3": (kl, np.expm1(mu ** 2) - mu ** 2),
    }


def gaussian_samples(mu, n, seed):
    x = np.random.default_rng(seed).standard_normal(n)
    logq = -0.5 * x ** 2  # common normaliser cancels in the ratio
    logp = -0.5 * (x - mu) ** 2
    return jnp.asarray(logq, jnp.float32), jnp.asarray(logp, jnp.float32)


def test_estimator_formulas():
    logp = jnp.array([-1.0, -0.2, -3.0])
    ref = jnp.array([-1.5, -0.2, -0.5])
    lr = ref - logp
    np.testing.assert_allclose(kl_estimate(logp, ref, "k1"), -lr, rtol=1e-6)
    np.testing.assert_allclose(kl_estimate(logp, ref, "k2"), 0.5 * lr ** 2, rtol=1e-6)
    np.testing.assert_allclose(kl_estimate(logp, ref, "k3"), np.exp(lr) - 1 - lr, rtol=1e-6)
    assert np.all(np.asarray(kl_estimate(logp, ref, "k3")) >= 0)
    np.testing.assert_allclose(kl_estimate(logp, ref, "k3", log_ratio_clip=1.0)[2], np.e - 2, rtol=1e-6)
    with pytest.raises(KeyError, match="k1, k2, k3"):
        kl_estimate(logp, ref, "k4")


@pytest.mark.parametrize("mu", [0.25, 1.0, 2.0])
def test_gaussian_means_match_closed_form(mu):
    n = 400_000
    logq, logp = gaussian_samples(mu, n, seed=int(mu * 100))
    cf = gaussian_closed_form(mu)
    for kind in ("k1", "k2", "k3"):
        est = np.asarray(kl_estimate(logq, logp, kind), np.float64)
        mean, var = cf[kind]
        se = np.sqrt(var / n)
        assert abs(est.mean() - mean) < 5 * se, (kind, mu, est.mean(), mean, se)
    # k2's bias mu^4/8 is resolved at this sample size for mu >= 1 (k1, k3 are unbiased for mu^2/2).
    if mu >= 1.0:
        k2 = np.asarray(kl_estimate(logq, logp, "k2"), np.float64)
        assert (k2.mean() - mu ** 2 / 2) / np.sqrt(cf["k2"][1] / n) > 20


@pytest.mark.parametrize("mu", [0.5, 1.0])
def test_gaussian_variances_match_closed_form(mu):
    n = 400_000
    logq, logp = gaussian_samples(mu, n, seed=7)
    for kind, (_, var) in gaussian_closed_form(mu).items():
        est = np.asarray(kl_estimate(logq, logp, kind), np.float64)
        d2 = (est - est.mean()) ** 2
        se = d2.std() / np.sqrt(n)  # standard error of the sample variance
        assert abs(d2.mean() - var) < 5 * se, (kind, mu, d2.mean(), var, se)


def test_k3_variance_explodes_relative_to_k1():
    mus = np.array([0.5, 1.0, 2.0, 3.0])
    v1 = np.array([gaussian_closed_form(m)["k1"][1] for m in mus])
    v3 = np.array([gaussian_closed_form(m)["k3"][1] for m in mus])
    ratio = v3 / v1
    assert ratio[0] < 1.0  # k3 is the lower-variance one near q = p ...
    assert np.all(np.diff(ratio) > 0) and ratio[-1] > 500  # ... and e^{mu^2} overtakes quickly
    # and the empirical variance shows the same ordering switch (mu = 0.5 vs mu = 2)
    for mu, k3_lower in ((0.5, True), (2.0, False)):
        logq, logp = gaussian_samples(mu, 200_000, seed=3)
        v = {k: np.var(np.asarray(kl_estimate(logq, logp, k), np.float64)) for k in ("k1", "k3")}
        assert (v["k3"] < v["k1"]) == k3_lower


# ---- placements: exact expected gradients on the enumerable sequence policy ----------------------
G, C, BETA = 3, 10.0, 0.5


@pytest.fixture(scope="module")
def setup():
    """Exact gradients of the sequence KL and of the per-state ("local") KLs with the state distribution frozen."""
    theta = toy.init_theta(0)
    theta_ref = toy.init_theta(5)
    tok = jnp.asarray(toy.TOKENS)
    ref_logp = toy.token_logp(theta_ref, tok)  # [K, T]
    mask = jnp.asarray(toy.MASK)

    def seq_kl(th):  # KL(pi || ref) over whole rollouts
        lp = jnp.sum(toy.token_logp(th, tok) * mask, -1)  # log pi(o) [K]
        lr = jnp.sum(ref_logp * mask, -1)
        return jnp.sum(jnp.exp(lp) * (lp - lr))

    p_frozen = jnp.exp(jnp.sum(toy.token_logp(theta, tok) * mask, -1))  # [K], no gradient
    prev = jnp.concatenate([jnp.full((toy.K, 1), toy.BOS), tok[:, :-1]], 1)  # [K, T]

    def local_kl(th, reverse=False):  # sum over visited states s_t of KL(pi(.|s_t) || ref(.|s_t)), states frozen
        lps = jax.nn.log_softmax(th[jnp.arange(toy.T), prev], -1)  # [K, T, V]
        lrs = jax.nn.log_softmax(theta_ref[jnp.arange(toy.T), prev], -1)
        kl_t = jnp.sum(jnp.exp(lrs) * (lrs - lps), -1) if reverse else jnp.sum(jnp.exp(lps) * (lps - lrs), -1)
        return jnp.sum(p_frozen[:, None] * mask * kl_t)

    grads = {name: np.asarray(jax.jit(jax.grad(f))(theta)).ravel() for name, f in
             (("seq", seq_kl), ("local", local_kl), ("local_rev", lambda t: local_kl(t, True)))}
    return theta, ref_logp, grads


def kl_only_loss(kind, placement):
    # A zero task reward isolates the KL term.
    return make_rl_loss(dict(aggregation=dict(name="constant", constant=C), rewards=dict(zero=dict(fn="term", key="task", weight=0.0)),
                             kl=dict(coef=BETA, estimator=kind, placement=placement, log_ratio_clip=None)))


@pytest.mark.parametrize("kind, placement, target, factor", [
    ("k1", "reward", "seq", BETA * (G - 1) / C),  # score-function k1 (sequence sum): the exact KL gradient
    ("k1", "loss", None, 0.0),                     # pathwise k1: zero expected gradient
    ("k2", "loss", "local", BETA * G / C),         # pathwise k2: per-state KL gradient, states frozen
    ("k3", "loss", "local_rev", BETA * G / C),     # pathwise k3: per-state *reverse* KL gradient
])
def test_kl_placement_expected_gradients(setup, kind, placement, target, factor):
    theta, ref_logp, grads = setup
    e = np.asarray(toy.exact_expected_grad(kl_only_loss(kind, placement), theta, G, ref_logp=ref_logp)).ravel()
    want = np.zeros_like(grads["seq"]) if target is None else factor * grads[target]
    np.testing.assert_allclose(e, want, atol=1e-6 * max(1.0, np.abs(want).max()), rtol=1e-4)
    if target in ("local", "local_rev"):  # which is measurably not the sequence-KL gradient
        dev = np.linalg.norm(e - factor * grads["seq"]) / np.linalg.norm(factor * grads["seq"])
        assert dev > 0.05, dev


def test_k1_in_loss_single_samples_nonzero_but_average_zero(setup):
    """Each sample's pathwise k1 gradient is non-zero; only its expectation vanishes (MC within 5 SE)."""
    theta, ref_logp, _ = setup
    m = 2000
    g = np.asarray(toy.sample_grads(kl_only_loss("k1", "loss"), theta, G, m, seed=2, ref_logp=ref_logp)).reshape(m, -1)
    assert np.abs(g).mean() > 1e-3
    se = g.std(0, ddof=1) / np.sqrt(m) + 1e-9
    assert np.max(np.abs(g.mean(0)) / se) < 5.0


def test_reward_penalty_and_metrics_shapes():
    logp = jnp.array([[-1.0, -2.0, 0.0], [-0.5, jnp.nan, 0.0]])
    ref = jnp.array([[-1.5, -1.0, 0.0], [-0.5, -1.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    ti = jnp.array([[0, 0, -1], [1, 1, -1]])
    pen = kl_reward_penalty(logp, ref, mask, ti, 3, kind="k1", coef=2.0)
    np.testing.assert_allclose(pen, [2.0 * (0.5 - 1.0), 0.0, 0.0], atol=1e-6)
    per_tok = kl_loss_per_token(logp, ref, mask, kind="k3")
    assert np.all(np.isfinite(per_tok)) and float(per_tok[1, 1]) == 0.0  # NaN off the mask never leaks
    g = jax.grad(lambda lp: jnp.sum(kl_loss_per_token(lp, ref, mask, kind="k2")))(logp)
    assert np.all(np.isfinite(g))
    m = kl_metrics(logp, ref, mask)
    assert set(m) == {"kl/k1", "kl/k2", "kl/k3"} and all(np.isfinite(float(v)) for v in m.values())


def test_benchmark_script_runs(tmp_path, capsys):
    import importlib.util
    import pathlib

    path = pathlib.Path(REPO_ROOT) / "benchmarks" / "kl_estimators.py"
    spec = importlib.util.spec_from_file_location("kl_estimators_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "kl.png"
    mod.main(["--n", "20000", "--mus", "0.5", "1.0", "2.0", "--out", str(out)])
    text = capsys.readouterr().out
    assert out.exists() and out.stat().st_size > 1000
    assert "variance ratio k3/k1" in text and text.count("\n") >= 6
