"""Episodic meta-training: one backbone forward per step, EHG re-splits on the embeddings."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from fewshot.config import TrainConfig, make_config
from fewshot.datasets import load_split
from fewshot.datasets.augment import TrainAugment
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.device import images_to_device, resolve_device
from fewshot.distributed import gather_objects, init_distributed
from fewshot.ehg import check_splits, draw_splits, episode_loss
from fewshot.errors import FewshotError
from fewshot.evaluate import evaluate
from fewshot.io import atomic_torch_save, atomic_write_json, load_checkpoint
from fewshot.model import FewShotModel, build_model


def model_config(config: TrainConfig, split: ImageSplit) -> dict:
    """The checkpoint's config: the run's settings plus the image geometry the model needs."""
    return {**config.to_dict(), "in_channels": split.channels, "image_size": split.image_size}


def make_optimizer(config: TrainConfig, model: FewShotModel) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum (the paper's setting) or Adam."""
    if config.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(
        model.parameters(),
        config.lr,
        momentum=config.momentum,
        nesterov=config.momentum > 0,
        weight_decay=config.weight_decay,
    )


class Trainer:
    """Holds the model, optimizer, samplers and RNGs of one run; `fit` trains and checkpoints."""

    def __init__(
        self,
        config: TrainConfig,
        resume: str | None = None,
        splits: tuple[ImageSplit, ImageSplit] | None = None,
    ):
        """Set up a run; `splits` = (train, val) replaces reading config.dataset from disk."""
        self.config = config
        self.device = resolve_device(config.device)
        self.dist = init_distributed(self.device)
        if self.dist.world > 1:
            if config.episodes_per_batch % self.dist.world:
                raise FewshotError(
                    f"--episodes-per-batch {config.episodes_per_batch} must be divisible by the "
                    f"{self.dist.world} processes"
                )
            if self.device.type == "cuda":
                self.device = torch.device("cuda", self.dist.local_rank)
                torch.cuda.set_device(self.device)  # NCCL collectives use the current device
        self.train_split, self.val_split = splits or (
            load_split(config.dataset, config.train_split, config.data_root),
            load_split(config.dataset, config.val_split, config.data_root),
        )
        self.shape = EpisodeShape(config.way, config.shot, config.query, config.episodes_per_batch)
        self.val_shape = EpisodeShape(config.val_way, config.val_shot, config.val_query, 8)
        check_splits(config.ehg_splits, config.way, config.shot, config.query)
        torch.manual_seed(config.seed)
        self.model_config = model_config(config, self.train_split)
        self.model = build_model(self.model_config).to(self.device)
        if config.channels_last:
            self.model.to(memory_format=torch.channels_last)
        self.optimizer = make_optimizer(config, self.model)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.amp == "fp16")
        # Every rank draws the same full batch and keeps its own share of the episodes, so a
        # step sees the episodes a single process would (gradients are averaged by DDP).
        self.forward_model = self.model
        if self.dist.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.forward_model = DistributedDataParallel(self.model, device_ids=ids)
        self.sampler = EpisodeSampler(
            self.train_split.labels, self.shape, config.seed, self.train_split.source
        )
        # Separate streams, so that turning EHG or augmentation on leaves the episodes unchanged.
        self.split_rng = torch.Generator().manual_seed(config.seed + 1)
        self.augment_rng = torch.Generator().manual_seed(config.seed + 2 + self.dist.rank)
        self.augment = self._make_augment()
        self.epoch, self.step, self.best_val = 0, 0, -1.0
        self.rank_rngs: list[dict] | None = None  # every rank's streams at the last epoch end
        self.run_dir = Path(config.out)
        if resume:
            self._restore(load_checkpoint(resume, self.device), resume)

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch (episodes per epoch / episodes per batch)."""
        return self.config.episodes_per_epoch // self.config.episodes_per_batch

    def _make_augment(self):
        """The training-time image transform (None: normalisation only)."""
        if not self.config.augment:
            return None
        split = self.train_split
        augment = TrainAugment.paper(split.mean, split.std, split.image_size)
        return lambda images: augment(images, self.augment_rng)

    def train_step(self) -> tuple[float, float]:
        """One optimizer step on a batch of episodes; returns (loss, accuracy)."""
        cfg = self.config
        index = self.sampler.sample()  # [B, way, pool]
        b, way, _ = index.shape
        perm = None
        if cfg.ehg_splits > 1:
            perm = draw_splits(b, way, cfg.shot, cfg.query, cfg.ehg_splits, self.split_rng)
        if self.dist.world > 1:
            share = slice(
                self.dist.rank * b // self.dist.world, (self.dist.rank + 1) * b // self.dist.world
            )
            index = index[share]
            perm = None if perm is None else perm[:, share]
        images = images_to_device(
            self.train_split, index.flatten(), self.device, self.augment, cfg.channels_last
        )
        embeddings = self.forward_model(images).view(*index.shape, -1)
        loss, acc = episode_loss(
            embeddings, self.model.head, self.model.scale, cfg.shot, perm, cfg.label_smoothing
        )
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.item(), acc.mean().item()

    def validate(self) -> tuple[float, float]:
        """Accuracy ± 95% CI (percent) on the fixed, seeded validation episodes."""
        result = evaluate(
            self.model,
            self.val_split,
            self.val_shape,
            self.config.val_episodes,
            self.config.val_seed,
            self.device,
            head_options=self.config.eval_head_options,
        )
        return result.accuracy, result.ci95

    def fit(self) -> Path:
        """Train to the last epoch; save last.pt every epoch (and on Ctrl-C) and best.pt."""
        cfg = self.config
        if self.dist.is_main:
            atomic_write_json(self.model_config, self.run_dir / "config.json")
        log_file = self.run_dir / "metrics.jsonl"
        with open(log_file, "a") if self.dist.is_main else contextlib.nullcontext() as log:
            try:
                while self.epoch < cfg.epochs:
                    self._train_epoch(log)
            except KeyboardInterrupt:
                last = self.run_dir / "last.pt"
                self.save(last)
                raise FewshotError(
                    f"interrupted at epoch {self.epoch + 1} step {self.step}; saved {last} "
                    f"(continue with --resume {last})"
                ) from None
        return self.run_dir

    def _train_epoch(self, log) -> None:
        """Finish the current epoch, validate, log and checkpoint."""
        cfg = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * cfg.lr_factor(self.epoch)
        self.model.train()
        losses, accs, start = [], [], time.time()
        bar = tqdm(
            range(self.step, self.steps_per_epoch),
            desc=f"epoch {self.epoch + 1}/{cfg.epochs}",
            unit="step",
            leave=False,
            disable=not self.dist.is_main,
        )
        for _ in bar:
            loss, acc = self.train_step()
            self.step += 1
            losses.append(loss)
            accs.append(acc)
            if not math.isfinite(loss):
                self.save(self.run_dir / "last.pt")
                raise FewshotError(f"loss became {loss} at epoch {self.epoch + 1}; lower --lr")
            bar.set_postfix(loss=f"{loss:.3f}", acc=f"{100 * acc:.1f}")
        self.epoch, self.step = self.epoch + 1, 0
        # Augmentation and torch streams differ per rank: collect them for an exact resume.
        self.rank_rngs = gather_objects(self._rng_state(), self.dist)
        if not self.dist.is_main:
            return  # rank 0 alone validates, logs and writes
        val_acc, val_ci = self.validate()
        record = {
            "epoch": self.epoch,
            "lr": self.optimizer.param_groups[0]["lr"],
            "train_loss": sum(losses) / max(1, len(losses)),
            "train_acc": 100 * sum(accs) / max(1, len(accs)),
            "val_acc": val_acc,
            "val_ci95": val_ci,
            "seconds": time.time() - start,
        }
        log.write(json.dumps(record) + "\n")
        log.flush()
        tqdm.write(
            f"epoch {record['epoch']}: loss {record['train_loss']:.3f} "
            f"train {record['train_acc']:.2f}% val {val_acc:.2f} ± {val_ci:.2f}%"
        )
        if val_acc > self.best_val:
            self.best_val = val_acc
            self.save(self.run_dir / "best.pt")
        self.save(self.run_dir / "last.pt")

    def save(self, path: Path) -> None:
        """Atomically write everything needed to evaluate or resume exactly (rank 0 only)."""
        if not self.dist.is_main:
            return
        state = {
            "config": self.model_config,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": self.epoch,
            "step": self.step,
            "best_val": self.best_val,
            "sampler": self.sampler.state_dict(),
            "rng": self._rng_state(),
        }
        if self.rank_rngs is not None and self.step == 0:  # gathered at this epoch's end
            state["rank_rngs"] = self.rank_rngs
        atomic_torch_save(state, path)

    def _rng_state(self) -> dict:
        """This process's random streams."""
        return {
            "torch": torch.get_rng_state(),
            "split": self.split_rng.get_state(),
            "augment": self.augment_rng.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def _restore(self, ckpt: dict, path: str) -> None:
        """Continue a run from `path` where it stopped."""
        saved = {
            k: v for k, v in ckpt.get("config", {}).items() if k not in ("epochs", "out", "device")
        }
        mine = {k: v for k, v in self.model_config.items() if k not in ("epochs", "out", "device")}
        if saved != mine:
            diff = sorted(k for k in set(saved) | set(mine) if saved.get(k) != mine.get(k))
            raise FewshotError(f"--resume {path}: the run's settings differ in {', '.join(diff)}")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scaler.load_state_dict(ckpt["scaler"])
        self.epoch, self.step, self.best_val = ckpt["epoch"], ckpt["step"], ckpt["best_val"]
        self.sampler.load_state_dict(ckpt["sampler"])
        # Each rank takes its own streams when the checkpoint has them (saved at an epoch's end
        # by as many processes); otherwise (Ctrl-C, another process count) rank 0's.
        rank_rngs = ckpt.get("rank_rngs")
        same_world = rank_rngs is not None and len(rank_rngs) == self.dist.world
        rng = rank_rngs[self.dist.rank] if same_world else ckpt["rng"]
        torch.set_rng_state(rng["torch"])
        self.split_rng.set_state(rng["split"])
        self.augment_rng.set_state(rng["augment"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])


def run_train(args: argparse.Namespace) -> Path:
    """`fewshot train`: build the config from defaults, --config and flags, then train."""
    overrides = {
        "dataset": args.dataset,
        "data_root": args.data_root,
        "backbone": args.backbone,
        "head": args.head,
        "way": args.way,
        "shot": args.shot,
        "query": args.query,
        "val_way": args.val_way,
        "val_shot": args.val_shot,
        "val_query": args.val_query,
        "epochs": args.epochs,
        "episodes_per_epoch": args.episodes_per_epoch,
        "episodes_per_batch": args.episodes_per_batch,
        "ehg_splits": args.ehg_splits,
        "lr": args.lr,
        "label_smoothing": args.label_smoothing,
        "amp": args.amp,
        "seed": args.seed,
        "device": args.device,
        "out": args.out,
    }
    config = make_config(args.config, overrides)
    trainer = Trainer(config, resume=args.resume)
    run_dir = trainer.fit()
    if trainer.dist.is_main:
        print(f"checkpoints in {run_dir}: best.pt (best validation), last.pt")
    return run_dir


def add_parser(subparsers) -> None:
    """Add `fewshot train`."""
    p = subparsers.add_parser("train", help="episodic meta-training")
    p.add_argument("--config", help="JSON config file (e.g. one from models/); flags override it")
    p.add_argument("--dataset")
    p.add_argument("--data-root", help="data folder (default: $FEWSHOT_DATA or the repo's data/)")
    p.add_argument("--backbone", help="conv4 | resnet12")
    p.add_argument("--head", help="protonet | ridge | svm")
    for name in ("way", "shot", "query", "val-way", "val-shot", "val-query", "epochs"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--episodes-per-epoch", type=int)
    p.add_argument("--episodes-per-batch", type=int)
    p.add_argument("--ehg-splits", type=int, help="U re-splits per episode (EHG); 1 = plain")
    p.add_argument("--lr", type=float)
    p.add_argument("--label-smoothing", type=float)
    p.add_argument("--amp", choices=("off", "bf16", "fp16"), help="autocast for the backbone")
    p.add_argument("--seed", type=int)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"))
    p.add_argument("--out", help="run folder for checkpoints and metrics.jsonl")
    p.add_argument("--resume", help="continue from a last.pt of the same run")
    p.set_defaults(func=run_train)
