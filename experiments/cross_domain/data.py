"""The cross-domain-v1 suite's data: the test images of MNIST, Fashion-MNIST and CIFAR-10 as
folder data sets, OUT/cross_domain_data/NAME/test/<class>/<n>.png, each written once (in a
temporary folder renamed when complete: a stopped run leaves nothing half-written).

    python -m experiments.cross_domain.data --source ../shared/data --out runs
    fewshot bench cross-domain-v1 MODEL --data-root runs
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from PIL import Image

from fewshot.datasets.cifar10 import read_cifar10_jpeg
from fewshot.datasets.idx import read_fashion_mnist, read_mnist
from fewshot.runtime.errors import FewshotError

# Each set's folder name and reader of its distributed files (IDX; CIFAR-10's JPEGs in a tar.gz).
SETS = {"mnist": read_mnist, "fashion_mnist": read_fashion_mnist, "cifar10": read_cifar10_jpeg}


def slug(text: str) -> str:
    """A class name as a folder's: lower-case words joined by '_' (Fashion's "t-shirt/top")."""
    return "_".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def write_folders(source: Path, out: Path, per_class: int | None = None) -> None:
    """Each set's test images (the first `per_class` of each class, or all) as a folder data set
    under OUT/cross_domain_data, unless already there."""
    for name, read in SETS.items():
        root = out / "cross_domain_data" / name
        if root.is_dir():
            continue
        partial = root.with_name(f"{name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        split = read(source, "test")
        images = split.images.permute(0, 2, 3, 1).squeeze(-1).numpy()  # HWC, or HW if gray
        kept = dict.fromkeys(range(len(split.class_names)), 0)
        for n, (image, label) in enumerate(zip(images, split.labels.tolist(), strict=True)):
            if per_class is not None and kept[label] >= per_class:
                continue
            kept[label] += 1
            folder = partial / "test" / slug(split.class_names[label])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{n:05d}.png")
        print(f"{name}: {sum(kept.values())} test images of {len(kept)} classes", flush=True)
        partial.rename(root)


def main(argv: list[str] | None = None) -> None:
    """Write the folders; a source that is not there: one line, exit 2."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="../shared/data",
                        help="MNIST and Fashion-MNIST IDX files, CIFAR-10 JPEGs (mnist/, "
                        "fashion_mnist/, cifar10_jpeg/test.tar.gz)")  # fmt: skip
    parser.add_argument("--out", default="runs", help="the data root (--data-root of the bench)")
    parser.add_argument("--per-class", type=int, help="test images kept a class (default: all)")
    args = parser.parse_args(argv)
    try:
        write_folders(Path(args.source), Path(args.out), args.per_class)
    except (FewshotError, OSError) as e:
        print(f"cross_domain: error: --source {args.source}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
