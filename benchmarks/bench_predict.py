"""`predict` on many query images against the cached evaluation path on the same images.

Both sides classify the same --queries Omniglot test images (normalised tensors) for a 5-way
1-shot support with a shipped model: `Method.predict` (the support embedded once, the queries
embedded and classified --batch at a time) and the cached evaluation's own work (`embed_split`,
which embeds a whole split in batches of 512, then one head call over the embeddings). Timed in
alternation, the median of --repeats rounds. Then the whole `fewshot predict` command on the
same images written as PNG files (listing, decoding, normalising, printing, the CSV): its wall
time and images per second, for scale.

With --backbone NAME (e.g. resnet12) the model is that backbone frozen, and predict's side is
the command's path for it: the support's and the queries' features computed into a fresh
feature cache, then classified; the command then runs twice on the same files, the second
reading the features the first kept.

Goal: predict within 1.1x of the cached evaluation path.

    python -m benchmarks.bench_predict --queries 10000 --repeats 3
    python -m benchmarks.bench_predict --backbone resnet12 --queries 10000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

from benchmarks.bench_ehg import sync
from benchmarks.bench_throughput import device_name
from fewshot.cli.main import main as fewshot_main
from fewshot.cli.predict import classify
from fewshot.datasets import load_split
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.batches import images_to_device
from fewshot.runtime.allocator import retain_freed_memory
from fewshot.runtime.device import DEVICES, resolve_device
from fewshot.runtime.precision import AMP_CHOICES, precision_name
from fewshot.training.checkpoint import load_trained
from fewshot.training.model_source import Backbone, frozen_model

GOAL = 1.1
REPO = Path(__file__).resolve().parents[1]
ZOO = REPO / "models" / "omniglot" / "protonet_conv4_trainval.pt"


def cached_path(model, split: ImageSplit, support: torch.Tensor, device: torch.device) -> None:
    """The cached evaluation's work on a split: every image embedded once, then the head."""
    features = model.embed_split(split, device)
    way = len(support)
    labels = torch.arange(way, device=device)[None]
    model.head(features[None], model.embed(support)[None], labels, way, 1)


def timed(fn, device: torch.device) -> float:
    """Seconds of one `fn()`."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def main() -> None:
    """Print both sides' time, their ratio against the goal, and the command's rate."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=str(ZOO))
    parser.add_argument(
        "--backbone", help="a frozen backbone instead of --checkpoint (e.g. resnet12)"
    )
    parser.add_argument("--queries", type=int, default=10000, help="query images")
    parser.add_argument("--batch", type=int, default=256, help="predict's queries per pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (median)")
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--amp", default="auto", choices=AMP_CHOICES, help="as fewshot predict")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (the test suite)")
    args = parser.parse_args()
    if args.smoke:
        args.queries, args.repeats = 64, 1
    device = resolve_device(args.device)
    retain_freed_memory()  # as every fewshot command does (and the command timed below)
    caches = tempfile.TemporaryDirectory()
    os.environ["FEWSHOT_CACHE"] = caches.name  # the command's feature cache, not the user's
    if args.backbone:
        model = frozen_model(Backbone(args.backbone), "omniglot", None, (1, 28), device, args.amp)
        model, name = model.method, f"--backbone {args.backbone} (frozen)"
    else:
        model, _ = load_trained(args.checkpoint, device)
        model.amp = args.amp  # what `fewshot predict --amp` gives the model
        name = f"checkpoint {Path(args.checkpoint).name}"
    test = load_split("omniglot", "test")
    count = min(args.queries, len(test.labels))
    index = torch.arange(count)
    split = ImageSplit(
        test.images[index], test.labels[index], test.class_names, test.mean, test.std
    )
    queries = images_to_device(split, index, device)
    firsts = torch.arange(5) * 20  # the first drawing of the first 5 classes
    support = images_to_device(test, firsts, device)
    labels = torch.arange(5, device=device)
    shots = ImageSplit(test.images[firsts], labels.cpu(), test.class_names[:5], test.mean, test.std)

    def predicted() -> None:
        if not args.backbone:
            model.predict(support, labels, queries, args.batch)
            return
        model.use_feature_cache(tempfile.mkdtemp(dir=caches.name))  # computed anew
        classify(model, shots, split, device, args.batch)

    with torch.no_grad():
        cached_path(model, split, support, device)  # warm-up of both sides
    model.predict(support, labels, queries[: args.batch], args.batch)
    ours, cached = [], []
    for _ in range(args.repeats):
        ours.append(timed(predicted, device))
        with torch.no_grad():
            cached.append(timed(lambda: cached_path(model, split, support, device), device))
    mine, theirs = statistics.median(ours), statistics.median(cached)
    precision = precision_name(args.amp, device.type)
    print(f"device: {device_name(device)}, {precision}, {name}")
    print(f"{count} query images, 5-way 1-shot support, {args.repeats} rounds")
    side = "predict's feature path" if args.backbone else f"Method.predict (batch {args.batch})"
    print(f"{side:<26} {mine:8.4f} s")
    print(f"cached evaluation path     {theirs:8.4f} s")
    ratio = mine / theirs
    print(f"ratio {ratio:.3f}x: goal <= {GOAL}x {'met' if ratio <= GOAL else 'MISSED'}")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for c, i in enumerate(firsts.tolist()):
            (root / "support" / f"class{c}").mkdir(parents=True)
            Image.fromarray(test.images[i, 0].numpy()).save(
                root / "support" / f"class{c}" / "0.png"
            )
        (root / "query").mkdir()
        for i in range(count):
            Image.fromarray(split.images[i, 0].numpy()).save(root / "query" / f"{i:05d}.png")
        model_flags = ["--backbone", args.backbone] if args.backbone else []
        argv = ["predict", *(model_flags or ["--checkpoint", args.checkpoint])]
        argv += ["--support", str(root / "support"), "--query", str(root / "query")]
        argv += ["--out", str(root / "out.csv"), "--device", device.type, "--amp", args.amp]
        for run in ("", " again (features kept)") if args.backbone else ("",):
            start = time.perf_counter()
            if fewshot_main([*argv, "--overwrite"]) != 0:
                raise SystemExit("fewshot predict failed")
            wall = time.perf_counter() - start
            rate = f"{count / wall:.0f} images/s"
            print(f"fewshot predict on {count} PNG files{run}: {wall:.2f} s ({rate})")
    caches.cleanup()


if __name__ == "__main__":
    main()
