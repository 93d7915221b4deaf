"""Episodic meta-training: one backbone forward per step, EHG re-splits on the embeddings.

A run survives interruption: SIGINT, SIGTERM and SIGUSR1 are honoured between steps (and
between validation batches), the state saved is one the run passed through, and `--resume`
continues bit-identically on a CPU. A non-finite loss or gradient never reaches the weights.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from fewshot.config import TrainConfig
from fewshot.datasets import load_split
from fewshot.datasets.augment import TrainAugment
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.device import images_to_device, resolve_device
from fewshot.distributed import any_rank, broadcast_from_main, gather_objects, init_distributed
from fewshot.ehg import draw_splits, episode_loss
from fewshot.errors import FewshotError
from fewshot.evaluate import evaluate
from fewshot.interrupt import Interrupted, StopRequests
from fewshot.io import atomic_torch_save, atomic_write_json, atomic_write_text, load_checkpoint
from fewshot.model import FewShotModel, build_model, non_finite
from fewshot.precision import precision_name
from fewshot.resume import checkpoint_state, restore, rng_state
from fewshot.run_folder import RunFolder


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


class Diverged(FewshotError):
    """A step met a non-finite loss or gradient; it was not applied."""


class Trainer:
    """Holds the model, optimizer, samplers and RNGs of one run; `fit` trains and checkpoints."""

    def __init__(
        self,
        config: TrainConfig,
        resume: str | None = None,
        splits: tuple[ImageSplit, ImageSplit] | None = None,
        checkpoint: dict | None = None,
    ):
        """Set up a run; `splits` = (train, val) replaces reading config.dataset from disk;
        `resume` continues from that checkpoint (`checkpoint`: its contents, if already read)."""
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
        torch.manual_seed(config.seed)
        self.model_config = model_config(config, self.train_split)
        self.model = build_model(self.model_config).to(self.device)
        if config.channels_last:
            self.model.to(memory_format=torch.channels_last)
        self.optimizer = make_optimizer(config, self.model)
        self.precision = precision_name(config.amp, self.device.type)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
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
        # The current epoch's running sums, so its metrics row covers all its steps.
        self.loss_sum, self.acc_sum, self.seconds = 0.0, 0.0, 0.0
        self.history: list[dict] = []  # one metrics row per finished epoch
        self.rank_rngs: list[dict] | None = None  # every rank's streams, gathered before a save
        self.run_dir = Path(config.out)
        self.resumed = resume is not None
        self.stops = StopRequests()
        if resume:
            ckpt = checkpoint if checkpoint is not None else load_checkpoint(resume, self.device)
            restore(self, ckpt, resume)

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
        """One optimizer step on a batch of episodes; returns (loss, accuracy).

        Raises Diverged, leaving weights and optimizer state untouched, when the loss or a
        gradient is not finite (with fp16 the AMP scaler already skips inf/nan gradients).
        """
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
        finite = torch.isfinite(loss)
        if not self.scaler.is_enabled():
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            finite &= torch.isfinite(torch.nn.utils.get_total_norm(grads))
        if not finite.item():  # one synchronisation per step, as loss.item() needs anyway
            self.optimizer.zero_grad(set_to_none=True)
            raise Diverged(
                f"the loss or its gradient became non-finite (loss {loss.item()}) at epoch "
                f"{self.epoch + 1} step {self.step + 1}; the step was not applied and the "
                "checkpoints keep their finite weights; lower --lr"
            )
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
            stop=self._stop_signal,
        )
        return result.accuracy, result.ci95

    def fit(self, folder: RunFolder | None = None) -> Path:
        """Train to the last epoch in the locked run folder (opened here unless given): last.pt
        every epoch and on interruption, best.pt on the best validation accuracy."""
        with contextlib.ExitStack() as stack:
            if self.dist.is_main and folder is None:
                folder = stack.enter_context(RunFolder(self.run_dir, fresh=not self.resumed))
            stack.enter_context(self.stops)
            if self.dist.is_main:
                tqdm.write(f"training on {self.device.type}, backbone in {self.precision}")
                atomic_write_json(self.model_config, self.run_dir / "config.json")
                self._write_metrics()  # drops rows a killed run wrote after its checkpoint
            while self.epoch < self.config.epochs:
                self._train_epoch()
                self._finish_epoch()
        return self.run_dir

    def _stop_signal(self) -> int | None:
        """The signal that asked this process to stop, if any."""
        return self.stops.signum

    def _stop_agreed(self) -> int | None:
        """The stop signal of any rank, so that all ranks stop at the same step."""
        return any_rank(self.stops.signum or 0, self.dist) or None

    def _train_epoch(self) -> None:
        """Run the current epoch's remaining steps, stopping cleanly when asked to."""
        cfg = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * cfg.lr_factor(self.epoch)
        self.model.train()
        bar = tqdm(
            total=self.steps_per_epoch,
            initial=self.step,
            desc=f"epoch {self.epoch + 1}/{cfg.epochs}",
            unit="step",
            leave=False,
            disable=not self.dist.is_main,
        )
        with bar:
            while self.step < self.steps_per_epoch:
                start = time.perf_counter()
                loss, acc = self.train_step()
                self.step += 1
                self.loss_sum += loss
                self.acc_sum += acc
                self.seconds += time.perf_counter() - start
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", acc=f"{100 * acc:.1f}")
                signum = self._stop_agreed()
                if signum:
                    self._save_and_stop(signum, "")

    def _finish_epoch(self) -> None:
        """Validate, log and checkpoint; an interruption in validation saves the epoch's
        trained state, and the resumed run validates it again."""
        self.rank_rngs = gather_objects(rng_state(self), self.dist)
        record, stopped = None, 0
        if self.dist.is_main:
            try:
                record = self._epoch_record(*self.validate())
            except Interrupted as e:
                stopped = e.signum
        stopped = broadcast_from_main(stopped, self.dist)
        if stopped:
            self._save_and_stop(stopped, " (in validation: it is run again on resume)")
        self.epoch, self.step = self.epoch + 1, 0
        self.loss_sum, self.acc_sum, self.seconds = 0.0, 0.0, 0.0
        if not self.dist.is_main:
            return
        self.history.append(record)
        tqdm.write(
            f"epoch {record['epoch']}: loss {record['train_loss']:.3f} "
            f"train {record['train_acc']:.2f}% val {record['val_acc']:.2f} ± "
            f"{record['val_ci95']:.2f}%"
        )
        # best.pt before last.pt: if killed in between, the resumed run validates again.
        if record["val_acc"] > self.best_val:
            self.best_val = record["val_acc"]
            self.save(self.run_dir / "best.pt")
        self.save(self.run_dir / "last.pt")
        self._write_metrics()

    def _epoch_record(self, val_acc: float, val_ci: float) -> dict:
        """The metrics row of the epoch that just finished training."""
        steps = max(1, self.step)
        return {
            "epoch": self.epoch + 1,
            "lr": self.optimizer.param_groups[0]["lr"],
            "train_loss": self.loss_sum / steps,
            "train_acc": 100 * self.acc_sum / steps,
            "val_acc": val_acc,
            "val_ci95": val_ci,
            "seconds": self.seconds,
            "precision": self.precision,
        }

    def _save_and_stop(self, signum: int, where: str) -> None:
        """Save last.pt at this step boundary and stop the run."""
        self.rank_rngs = gather_objects(rng_state(self), self.dist)
        last = self.run_dir / "last.pt"
        self.save(last)
        raise Interrupted(
            signum,
            f"stopped at epoch {self.epoch + 1} step {self.step}{where}; saved {last}; "
            f"continue with: fewshot train --resume {last}",
        )

    def _write_metrics(self) -> None:
        """metrics.jsonl: one JSON line per finished epoch, rewritten whole (atomically)."""
        lines = "".join(json.dumps(record) + "\n" for record in self.history)
        atomic_write_text(lines, self.run_dir / "metrics.jsonl")

    def save(self, path: Path) -> None:
        """Atomically write everything needed to evaluate or resume exactly (rank 0 only);
        never non-finite weights."""
        if not self.dist.is_main:
            return
        state = checkpoint_state(self)
        bad = non_finite(state["model"])
        if bad:
            raise Diverged(f"not saving {path}: non-finite values in {', '.join(bad[:3])}")
        atomic_torch_save(state, path)
