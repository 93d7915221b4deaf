"""MAML, first-order MAML, ANIL and iMAML: their meta-gradients against hand-unrolled autograd
and the implicit closed form (float64), EHG as the mean of per-split meta-gradients, and the
ordinary commands (train, resume, eval) on real Omniglot images."""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fewshot.cli.main import main
from fewshot.hpo.hypergrad import Bilevel, aid_cg
from fewshot.methods import AdaptationMethod, build_method
from fewshot.methods.batching import chunk_count, resolve_batching
from fewshot.runtime.io import load_checkpoint
from fewshot.training.settings import TrainSettings

WAY, SHOT, QUERY = 3, 2, 2


def method(variant: str, **options) -> AdaptationMethod:
    """A float64 method on a tiny Conv-4 (2 channels, 16x16 images)."""
    settings = TrainSettings(
        method=variant, way=WAY, val_way=WAY, shot=SHOT, query=QUERY, amp="off",
        backbone_options={"channels": 2}, method_options=options, channels_last=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return build_method({**asdict(settings), "in_channels": 1, "image_size": 16}).double()


def episodes(batch: int = 2) -> torch.Tensor:
    """Random float64 images [B, way, pool, 1, 16, 16]."""
    generator = torch.Generator().manual_seed(1)
    return torch.randn(batch, WAY, SHOT + QUERY, 1, 16, 16, generator=generator).double()


def meta_gradient(model: AdaptationMethod, images, resplits=None) -> dict:
    """The gradients `loss.backward()` leaves in the parameters."""
    model.zero_grad()
    model(images, resplits, SHOT)[0].backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


def unrolled(model: AdaptationMethod, images, steps: int, lr: float, head_only=False, first=False):
    """Reference: every episode adapted by its own explicit autograd loop, the query losses
    averaged and differentiated with respect to every parameter. With `head_only` (ANIL) the
    classifier adapts on embeddings of the episode's pool, computed in one backbone pass."""
    params = dict(model.named_parameters())
    support_labels = torch.arange(WAY).repeat_interleave(SHOT)
    query_labels = torch.arange(WAY).repeat_interleave(QUERY)
    if head_only:
        inputs = [model.network.backbone(e.flatten(0, 1)).view(*e.shape[:2], -1) for e in images]
        prefix = "network.classifier."

        def logits(weights, x):
            return F.linear(x, weights["weight"], weights["bias"])
    else:
        inputs, prefix = images, "network."

        def logits(weights, x):
            return functional_call(model.network, weights, (x,))

    total = 0
    for episode in inputs:
        support = episode[:, :SHOT].flatten(0, 1)
        query = episode[:, SHOT:].flatten(0, 1)
        fast = {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}
        for _ in range(steps):
            loss = F.cross_entropy(logits(fast, support), support_labels)
            grads = torch.autograd.grad(loss, list(fast.values()), create_graph=not first)
            fast = {k: v - lr * g for (k, v), g in zip(fast.items(), grads, strict=True)}
        total = total + F.cross_entropy(logits(fast, query), query_labels)
    grads = torch.autograd.grad(total / len(images), list(params.values()), allow_unused=True)
    return {
        k: torch.zeros_like(p) if g is None else g
        for (k, p), g in zip(params.items(), grads, strict=True)
    }


def assert_close(ours: dict, reference: dict, tol: float) -> None:
    for key, value in reference.items():
        torch.testing.assert_close(ours[key], value, rtol=tol, atol=tol, msg=key)


def test_maml_is_second_order_backpropagation_through_the_inner_steps():
    model = method("maml", inner_steps=2, inner_lr=0.3)
    ours = meta_gradient(model, episodes())
    assert_close(ours, unrolled(model, episodes(), 2, 0.3), 1e-10)
    # The second-order terms matter here: first-order differs.
    first = unrolled(model, episodes(), 2, 0.3, first=True)
    assert not torch.allclose(
        ours["network.backbone.encoder.0.0.weight"], first["network.backbone.encoder.0.0.weight"]
    )


def test_first_order_maml_drops_the_second_order_terms():
    model = method("fomaml", inner_steps=2, inner_lr=0.3)
    assert_close(
        meta_gradient(model, episodes()), unrolled(model, episodes(), 2, 0.3, first=True), 1e-10
    )


def test_anil_is_maml_restricted_to_the_classifier():
    model = method("anil", inner_steps=3, inner_lr=0.5)
    reference = unrolled(model, episodes(), 3, 0.5, head_only=True)
    assert_close(meta_gradient(model, episodes()), reference, 1e-10)
    assert reference["network.backbone.encoder.0.0.weight"].abs().sum() > 0  # reaches the backbone


@pytest.mark.parametrize(
    "lam, mu, loop", [(10.0, None, "proximal"), (2.0, 24.0, "proximal"), (2.0, 24.0, "pull_back")]
)
def test_imaml_is_the_implicit_gradient_at_the_adapted_weights(lam, mu, loop):
    # mu (solver_proximal; None: lam) large enough for H + mu I to be positive definite
    # (asserted below): the system iMAML solves, which conjugate gradient solves exactly. The
    # damped case is the iMAML authors' code's system at lam = 2: (I + H / 24) x = g, and
    # pull_back its inner loop.
    steps, lr = 30, 0.05
    options = {"inner_loop": loop} if mu is None else {"solver_proximal": mu, "inner_loop": loop}
    model = method(
        "imaml", inner_steps=steps, inner_lr=lr, proximal=lam, solver_steps=200, **options
    )
    images = episodes(batch=1)
    ours = meta_gradient(model, images)
    # Reference: theta_K by plain gradient descent on the proximal support loss (pull_back: on
    # the support loss, then theta_K - lr lam (theta_K - phi)), then mu (H + mu I)^-1 grad of
    # the query loss, with H the explicit Hessian of the support loss.
    mu = lam if mu is None else mu
    names = [k[len("network.") :] for k, _ in model.named_parameters()]
    init = [p.detach() for p in model.parameters()]
    shapes = [p.shape for p in init]
    support = images[0][:, :SHOT].flatten(0, 1)
    query = images[0][:, SHOT:].flatten(0, 1)

    def unflat(flat):
        pieces = flat.split([s.numel() for s in shapes])
        return {n: t.view(s) for n, t, s in zip(names, pieces, shapes, strict=True)}

    def support_loss(flat):
        logits = functional_call(model.network, unflat(flat), (support,))
        return F.cross_entropy(logits, torch.arange(WAY).repeat_interleave(SHOT))

    phi = torch.cat([p.flatten() for p in init])
    theta = phi.clone()
    proximal = lam if loop == "proximal" else 0.0
    for _ in range(steps):
        theta = theta.requires_grad_()
        loss = support_loss(theta) + proximal / 2 * ((theta - phi) ** 2).sum()
        theta = (theta - lr * torch.autograd.grad(loss, theta)[0]).detach()
    if loop == "pull_back":
        theta = theta - lr * lam * (theta - phi)
    hessian = torch.autograd.functional.hessian(support_loss, theta)
    assert torch.linalg.eigvalsh(hessian).min() > -mu
    theta = theta.requires_grad_()
    query_loss = F.cross_entropy(
        functional_call(model.network, unflat(theta), (query,)),
        torch.arange(WAY).repeat_interleave(QUERY),
    )
    g = torch.autograd.grad(query_loss, theta)[0]
    expected = mu * torch.linalg.solve(hessian + mu * torch.eye(len(phi), dtype=phi.dtype), g)
    flat_ours = torch.cat([ours[f"network.{n}"].flatten() for n in names])
    torch.testing.assert_close(flat_ours, expected, rtol=1e-6, atol=1e-8)


def test_imaml_pulled_back_in_training_tests_as_maml_adapts():
    # The authors' code tests at lambda = 0: plain steps on the support loss, MAML's adaptation
    # of the same weights; the proximal loop's differ.
    images = episodes()
    maml = method("maml", inner_steps=4, inner_lr=0.3)
    pulled = method("imaml", inner_steps=4, inner_lr=0.3, proximal=2.0, inner_loop="pull_back")
    proximal = method("imaml", inner_steps=4, inner_lr=0.3, proximal=2.0)
    assert torch.equal(pulled.accuracy(images, SHOT), maml.accuracy(images, SHOT))
    support, query = images[0][:, :SHOT].flatten(0, 1), images[0][:, SHOT:].flatten(0, 1)
    scores = [m.scores(support, [SHOT] * WAY, query, 4) for m in (maml, pulled, proximal)]
    torch.testing.assert_close(scores[1], scores[0], rtol=0, atol=1e-12)
    assert not torch.allclose(scores[2], scores[0])


def test_the_engine_gives_imaml_closed_form_for_a_linear_head_with_squared_loss():
    # Inner: 1/2n |X theta - y|^2 + lam/2 |theta - phi|^2 from theta0 = phi;
    # outer: 1/2 |X' theta - y'|^2.
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=g).double(), torch.randn(8, generator=g).double()
    xv, yv = torch.randn(5, 4, generator=g).double(), torch.randn(5, generator=g).double()
    lam, phi = 0.7, torch.randn(4, generator=g).double()

    def inner(theta, phi, data):
        return ((data[0] @ theta - data[1]) ** 2).sum() / (2 * len(data[1])) + lam / 2 * (
            (theta - phi) ** 2
        ).sum()

    def outer(theta, phi, data):
        return ((data[0] @ theta - data[1]) ** 2).sum() / 2

    problem = Bilevel(inner, outer, 0.3)
    result = aid_cg(problem, lambda p: p, phi, (x, y), (xv, yv), steps=400, solver_steps=4)
    a = x.T @ x / len(y) + lam * torch.eye(4, dtype=x.dtype)
    theta = torch.linalg.solve(a, x.T @ y / len(y) + lam * phi)
    expected = lam * torch.linalg.solve(a, xv.T @ (xv @ theta - yv))
    torch.testing.assert_close(result.grad, expected, rtol=1e-6, atol=1e-10)
    # Damped: (H + damping I) v = b, H the inner Hessian (proximal term included).
    damped = aid_cg(
        problem, lambda p: p, phi, (x, y), (xv, yv), steps=400, solver_steps=4, damping=0.5
    )
    b = xv.T @ (xv @ theta - yv)
    expected = lam * torch.linalg.solve(a + 0.5 * torch.eye(4, dtype=x.dtype), b)
    torch.testing.assert_close(damped.grad, expected, rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("variant", ["maml", "fomaml", "anil", "imaml"])
def test_ehg_is_the_mean_of_the_per_split_meta_gradients(variant):
    model = method(variant, inner_steps=2, inner_lr=0.2)
    images = episodes()
    b, pool = images.shape[0], SHOT + QUERY
    generator = torch.Generator().manual_seed(3)
    resplits = torch.stack(
        [
            torch.stack(
                [
                    torch.stack([torch.randperm(pool, generator=generator) for _ in range(WAY)])
                    for _ in range(b)
                ]
            )
            for _ in range(3)
        ]
    )
    together = meta_gradient(model, images, resplits)
    per_split = []
    for order in resplits:  # [B, way, pool]: the images reordered, then the original split
        reordered = torch.gather(images, 2, order[..., None, None, None].expand_as(images))
        per_split.append(meta_gradient(model, reordered))
    mean = {k: torch.stack([s[k] for s in per_split]).mean(0) for k in together}
    assert_close(together, mean, 1e-10)
    identity = torch.arange(pool).expand(1, b, WAY, pool)
    assert_close(meta_gradient(model, images, identity), meta_gradient(model, images), 0.0)


# Tiny real runs: 5-way 1-shot Omniglot, two epochs of two steps.
TRAIN = ["train", "--way", "5", "--val-way", "5", "--shot", "1", "--query", "2"]
TRAIN += ["--episodes-per-epoch", "4", "--episodes-per-batch", "2", "--val-episodes", "6"]
TRAIN += ["--lr", "0.001", "--resplits", "2", "--device", "cpu", "--amp", "off"]


@pytest.mark.parametrize("variant", ["maml", "anil", "imaml"])
def test_a_method_trains_resumes_exactly_and_evaluates(
    variant, tmp_path, tiny_omniglot_root, monkeypatch, capsys
):
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    args = [*TRAIN, "--method", variant, "--method-options", '{"inner_steps": 2, "inner_lr": 0.4}']
    assert main([*args, "--epochs", "2", "--out", str(tmp_path / "straight")]) == 0
    assert main([*args, "--epochs", "1", "--out", str(tmp_path / "resumed")]) == 0
    assert main(["train", "--resume", str(tmp_path / "resumed" / "last.pt"), "--epochs", "2"]) == 0
    straight = load_checkpoint(tmp_path / "straight" / "last.pt")["model"]
    resumed = load_checkpoint(tmp_path / "resumed" / "last.pt")["model"]
    for key, value in straight.items():
        assert torch.equal(value, resumed[key]), key
    out = tmp_path / "eval.json"
    best = str(tmp_path / "straight" / "best.pt")
    assert (
        main(["eval", "--checkpoint", best, "--way", "5", "--episodes", "6", "--out", str(out)])
        == 0
    )
    assert json.loads(out.read_text())["episodes"] == 6
    capsys.readouterr()
    # Its classifier has 5 outputs: 20-way episodes are refused before any data is read.
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                best,
                "--way",
                "20",
                "--episodes",
                "6",
                "--out",
                str(tmp_path / "x.json"),
            ]
        )
        == 2
    )
    assert "trained 5-way: its classifier has 5 outputs" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--method", "maml", "--method-options", '{"solver_steps": 3}'],
            "has no option 'solver_steps'",
        ),
        (["--method", "imaml", "--method-options", '{"proximal": 0}'], "proximal must be > 0"),
        (["--method", "maml", "--method-options", '{"inner_lr": -1}'], "inner_lr must be > 0"),
        (["--method", "maml", "--backbone", "resnet12"], "--backbone must be conv4 for maml"),
        (
            ["--method", "anil", "--head-options", '{"lam": 2}'],
            "--head-options does not apply to --method anil",
        ),
        (["--method", "maml", "--val-way", "20"], "--val-way must equal way (5) for maml"),
        (
            ["--method", "anil", "--method-options", '{"batching": "grouped"}'],
            "batching must be one of auto, vmap, loop, threads, got 'grouped'",
        ),
    ],
)
def test_impossible_settings_are_refused_before_any_data(extra, message, tmp_path, capsys):
    args = ["train", "--way", "5", *extra, "--data-root", str(tmp_path / "none")]
    assert main([*args, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("change", "advice"),
    [
        (
            ["--method", "maml", "--method-options", '{"inner_steps": 5, "inner_lr": 1e30}'],
            "the inner adaptation diverged; its scale is set by --method-options inner_lr 1e+30"
            " (outside its usual range 0.0001 to 1), inner_steps 5: lower inner_lr",
        ),
        # The proximal term is at fault: named with every setting that scales the inner
        # problem, and the step size it makes unstable (its curvature alone is 1e30).
        (
            ["--method", "imaml", "--method-options", '{"proximal": 1e30, "inner_steps": 2}'],
            "the inner adaptation diverged; its scale is set by --method-options inner_lr 0.1, "
            "inner_steps 2, proximal 1e+30 (outside its usual range 0.01 to 100): lower "
            "proximal; inner_lr x proximal = 1e+29 must be below 2 for the inner steps to "
            "converge",
        ),
        (["--method", "maml", "--lr", "1e30"], "the meta-training diverged: lower --lr"),
    ],
)
def test_a_diverging_run_stops_in_one_line_naming_what_diverged(
    change, advice, tmp_path, tiny_omniglot_root, monkeypatch, capsys
):
    """The inner adaptation is at fault when it started from a finite support loss; the
    meta-training when its own steps already made that loss non-finite."""
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    args = [*TRAIN, *change, "--epochs", "1"]
    assert main([*args, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "non-finite" in err and advice in err


BATCHINGS = ["vmap", "loop", "threads"]


@contextlib.contextmanager
def threads_for(batching: str):
    """Two intra-op threads for batching "threads" (the suite runs with one), so that it runs
    the episodes in two chunks side by side; the others as they are (two threads on a loaded
    machine would only slow them down)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2 if batching == "threads" else before)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_auto_batching_is_vmap_on_cuda_and_threads_on_a_cpu():
    assert resolve_batching("auto", "cuda") == "vmap"
    assert resolve_batching("auto", "cpu") == "threads"
    assert [resolve_batching(b, "cuda") for b in BATCHINGS] == BATCHINGS
    with threads_for("threads"):
        counts = chunk_count("threads", 5), chunk_count("threads", 1), chunk_count("loop", 5)
    assert counts == (2, 1, 1)
    with pytest.raises(ValueError, match="batching must be one of auto, vmap, loop, threads"):
        resolve_batching("grouped", "cpu")


@pytest.mark.parametrize("batching", BATCHINGS)
@pytest.mark.parametrize("variant", ["maml", "fomaml", "anil"])
def test_maml_agrees_with_learn2learn(variant, batching):
    l2l = pytest.importorskip("learn2learn")
    model = method(variant, inner_steps=2, inner_lr=0.3, batching=batching)
    images = episodes()
    adapted = model.network.classifier if variant == "anil" else model.network
    reference = l2l.algorithms.MAML(adapted, lr=0.3, first_order=variant == "fomaml")
    support_labels = torch.arange(WAY).repeat_interleave(SHOT)
    query_labels = torch.arange(WAY).repeat_interleave(QUERY)
    model.zero_grad()
    total = 0
    for episode in images:
        if variant == "anil":  # the classifier adapts on the embeddings of the episode's pool
            episode = model.network.backbone(episode.flatten(0, 1)).view(WAY, SHOT + QUERY, -1)
        learner = reference.clone()
        for _ in range(2):
            learner.adapt(F.cross_entropy(learner(episode[:, :SHOT].flatten(0, 1)), support_labels))
        total = total + F.cross_entropy(learner(episode[:, SHOT:].flatten(0, 1)), query_labels)
    (total / len(images)).backward()
    theirs = {k: p.grad.clone() for k, p in model.named_parameters()}
    with threads_for(batching):
        ours = meta_gradient(model, images)
    assert_close(ours, theirs, 1e-6)


@pytest.mark.parametrize(
    ("variant", "options"),
    [
        ("maml", {}),
        ("fomaml", {}),
        ("anil", {}),
        ("imaml", {}),
        ("imaml", {"inner_loop": "pull_back"}),
    ],
    ids=["maml", "fomaml", "anil", "imaml", "imaml-pull_back"],
)
def test_every_batching_gives_the_same_step_and_evaluation(variant, options):
    """Loss, meta-gradient and per-problem accuracies of a step with three re-splits of three
    episodes (two chunks of unequal size under threads), and the evaluation's accuracies."""
    images = episodes(batch=3)
    generator = torch.Generator().manual_seed(4)
    pool = SHOT + QUERY
    perms = [torch.randperm(pool, generator=generator) for _ in range(3 * 3 * WAY)]
    resplits = torch.stack(perms).view(3, 3, WAY, pool)
    results = {}
    for batching in BATCHINGS:
        model = method(variant, inner_steps=2, inner_lr=0.2, batching=batching, **options)
        with threads_for(batching):
            loss, accuracy = model(images, resplits, SHOT)
            loss.backward()
            evaluated = model.accuracy(images, SHOT)
        grads = {k: p.grad for k, p in model.named_parameters()}
        results[batching] = (loss.detach(), accuracy, grads, evaluated)
    loss, accuracy, grads, evaluated = results["vmap"]
    assert accuracy.shape == (9,) and evaluated.shape == (3,)
    for batching in ("loop", "threads"):
        other_loss, other_accuracy, other_grads, other_evaluated = results[batching]
        torch.testing.assert_close(other_loss, loss, rtol=1e-12, atol=1e-12)
        assert torch.equal(other_accuracy, accuracy) and torch.equal(other_evaluated, evaluated)
        assert_close(other_grads, grads, 1e-10)


@pytest.mark.parametrize(
    ("variant", "options", "advice"),
    [
        # Every value usual, the step stable on the proximal term: no culprit to name.
        ("imaml", {"inner_lr": 0.1, "proximal": 2.0}, "lower one of them"),
        # Both usual, their product not: the step overshoots the proximal term's minimum.
        (
            "imaml",
            {"inner_lr": 0.5, "proximal": 10.0},
            "inner_lr x proximal = 5 must be below 2 for the inner steps to converge",
        ),
        ("anil", {"inner_steps": 500}, "inner_steps 500 (outside its usual range 1 to 100)"),
    ],
)
def test_the_divergence_advice_names_the_inner_settings_and_the_culprit(variant, options, advice):
    model = method(variant, **options)
    text = model.divergence_advice()
    assert text.startswith("the inner adaptation diverged; its scale is set by --method-options")
    assert advice in text
    for name in ("inner_lr", "inner_steps", *(["proximal"] if variant == "imaml" else [])):
        assert f"{name} {getattr(model, name):g}" in text
    assert ("proximal" in text) == (variant == "imaml")
