"""How EHG's meta-gradient variance falls with U, on a fixed batch of real Omniglot episodes.

For one batch of episodes and one model, compute the meta-gradient of each of M distinct
re-splits (one backbone pass, M backward passes), then draw many sets of U distinct splits and
measure the variance (total, over all parameters) of their averaged gradient. Sampling U of M
without replacement gives sigma^2 / U * (M - U) / (M - 1): the script prints both.

    python -m experiments.ehg_variance.variance \
        [--checkpoint models/omniglot/protonet_conv4_1shot.pt] [--resplits 1,2,5,10]

from the repository root; --out defaults to experiments/ehg_variance/ehg_variance.json.
`--smoke --out DIR/ehg_variance.json` runs it in seconds (the test suite's run).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from experiments.smoke import add_smoke_flag, omniglot_root, smoke_folder
from fewshot.backbones import Conv4
from fewshot.datasets import load_split
from fewshot.datasets.augment import normalize
from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.resplit import draw_resplits, episode_loss
from fewshot.runtime.io import atomic_write_json
from fewshot.training.checkpoint import load_trained

# --smoke: a few splits and draws.
SMOKE = {"pool_splits": 4, "draws": 10, "resplits": "1,2"}


def per_split_gradients(model: EmbeddingMethod, images, index_shape, shot, perm) -> torch.Tensor:
    """Flat meta-gradient of every split: [M, num_params], from one forward of the pool."""
    params = [p for p in model.parameters() if p.requires_grad]
    emb = model.embed(images).view(*index_shape, -1)
    rows = []
    for u in range(perm.shape[0]):
        loss, _ = episode_loss(emb, model.head, model.scale, shot, perm[u : u + 1])
        grads = torch.autograd.grad(loss, params, retain_graph=True)
        rows.append(torch.cat([g.flatten() for g in grads]))
    return torch.stack(rows)


def main(argv: list[str] | None = None) -> None:
    """Print variance of the U-split average against U, and write it as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a fewshot checkpoint (default: a fresh Conv-4)")
    parser.add_argument("--head", default="protonet")
    parser.add_argument("--way", type=int, default=5)
    parser.add_argument("--shot", type=int, default=1)
    parser.add_argument("--query", type=int, default=15)
    parser.add_argument("--episodes-per-batch", type=int, default=2)
    parser.add_argument("--pool-splits", type=int, default=64, help="M distinct splits")
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--resplits", default="1,2,5,10")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="experiments/ehg_variance/ehg_variance.json")
    parser.add_argument("--data-root", default=None, help="data root (default: as fewshot's)")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
        folder = smoke_folder(Path(args.out).parent)
        args.out = str(folder / Path(args.out).name)
        args.data_root = args.data_root or str(omniglot_root(folder / "data"))

    torch.manual_seed(args.seed)
    if args.checkpoint:
        model, _ = load_trained(args.checkpoint, torch.device("cpu"))
    else:
        model = EmbeddingMethod(Conv4(1, image_size=28), args.head)
    model.train()  # BatchNorm on batch statistics, as in training
    split = load_split("omniglot", "train", args.data_root)
    shape = EpisodeShape(args.way, args.shot, args.query, args.episodes_per_batch)
    index = EpisodeSampler(split.labels, shape, args.seed).sample()
    images = normalize(split.images[index.flatten()], split.mean, split.std)
    gen = torch.Generator().manual_seed(args.seed)
    perm = draw_resplits(*index.shape[:2], args.shot, args.query, args.pool_splits, gen)
    grads = per_split_gradients(model, images, index.shape, args.shot, perm).double()
    mean = grads.mean(0)
    sigma2 = float(((grads - mean) ** 2).sum(1).mean())  # per-split total variance
    m = args.pool_splits
    print(f"{m} splits, per-split gradient variance (trace) {sigma2:.4g}, |mean| {mean.norm():.4g}")
    print(f"{'U':>3} {'measured':>10} {'sigma2/U*(M-U)/(M-1)':>22} {'ratio to U=1':>13}")
    rows, first = [], None
    for u in map(int, args.resplits.split(",")):
        picks = torch.rand(args.draws, m, generator=gen).argsort(1)[:, :u]
        averages = grads[picks].mean(1)
        measured = float(((averages - mean) ** 2).sum(1).mean())
        expected = sigma2 / u * (m - u) / (m - 1)
        first = first or measured
        rows.append({"U": u, "variance": measured, "expected": expected})
        print(f"{u:3d} {measured:10.4g} {expected:22.4g} {measured / first:13.3f}")
    atomic_write_json({"args": vars(args), "sigma2": sigma2, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
