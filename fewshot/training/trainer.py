"""Episodic meta-training: one method call per step on a batch of episodes and its re-splits.

A run survives interruption: SIGINT, SIGTERM, SIGUSR1 and SIGHUP are honoured between steps
(and between validation batches), the state saved is one the run passed through, and
`--resume` continues bit-identically on a CPU. A non-finite loss or gradient never reaches the
weights.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from fewshot.datasets.augment import TrainAugment
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.batches import episode_images
from fewshot.datasets.varied import check_episode_shape
from fewshot.evaluation.episodes import cache_pays, evaluate, evaluation_terms
from fewshot.evaluation.metrics import metrics_row
from fewshot.methods.base import check_step
from fewshot.methods.batching import resolve_batching
from fewshot.methods.feature_cache import FOLDER as FEATURES
from fewshot.runtime.distributed import Distributed, any_rank, broadcast_from_main, gather_objects
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.events import EventLog
from fewshot.runtime.io import atomic_torch_save, atomic_write_json, atomic_write_text
from fewshot.runtime.memory import check_memory, fits, format_bytes
from fewshot.runtime.precision import precision_name
from fewshot.runtime.run_folder import RunFolder
from fewshot.runtime.signals import Interrupted, StopRequests
from fewshot.training.checkpoint import (
    InitWeights,
    non_finite,
    restore_training,
    training_checkpoint,
    without_fetch,
)
from fewshot.training.compiled import CompiledBackbone
from fewshot.training.run_settings import RunSettings
from fewshot.training.run_setup import (
    base_lrs,
    check_model_size,
    initial_weights,
    make_optimizer,
    read_data,
)
from fewshot.training.settings import PretrainSettings
from fewshot.training.stages import batches_for
from fewshot.training.state import Progress, RandomStreams

# The TensorBoard tags of the validation accuracy and its 95% interval's bounds.
VAL_BAND = ("val/accuracy", "val/accuracy_lower", "val/accuracy_upper")


class Diverged(FewshotError):
    """A step met a non-finite loss or gradient; it was not applied."""


class Trainer:
    """Holds the method, optimizer, batch source, progress and random streams of one run
    (episodic training or pretraining, by the settings' class); `fit` trains and checkpoints."""

    def __init__(
        self,
        settings: RunSettings,
        device: torch.device,
        dist: Distributed | None = None,
        data: tuple[ImageSplit, ImageSplit] | None = None,
        resume: tuple[str, dict] | None = None,
        init: InitWeights | None = None,
    ):
        """Set up a run on `device` (resolved by the caller, like `dist`); `data` = (train,
        val) replaces reading the dataset from disk; `resume` = (path, contents) of the
        checkpoint to continue; `init`: the weights of --init or --backbone-weights
        when the caller has read them already."""
        self.settings = settings
        dist = dist or Distributed()
        self.device, self.dist = device, dist
        if dist.world > 1 and getattr(settings, "varied", False):
            # A step of varied episodes is several forward passes before one backward, which
            # DDP's gradient hooks do not take.
            raise FewshotError("--varied episodes train in one process: run without torchrun")
        if init is None and not resume:
            init = initial_weights(settings)  # checked before any data is read
        # Validated as the model will be evaluated: normalised as its training images.
        train, val = data or read_data(settings)
        self.train_data = settings.normalized(train)  # a library backbone's own, if it applies
        self.val_data = replace(val, mean=self.train_data.mean, std=self.train_data.std)
        self.batches = batches_for(settings, self.train_data, settings.seed)  # checks the shape
        self.val_shape = settings.val_shape
        # Refuse now, not after an epoch, a validation shape the validation split cannot give.
        check_episode_shape(self.val_data.labels, self.val_shape, self.val_data.source)
        torch.manual_seed(settings.seed)
        self.config = {
            **settings.to_dict(),
            # Where the data is, whatever folder a later command runs in.
            "data_root": settings.data_root and str(Path(settings.data_root).resolve()),
            "in_channels": self.train_data.channels,
            "image_size": self.train_data.image_size,
            "mean": list(self.train_data.mean),
            "std": list(self.train_data.std),
            **self.batches.config(self.train_data),
        }
        check_model_size(self.batches.build, self.config, device)
        self.method = self.batches.build(without_fetch(self.config) if resume else self.config)
        self.method.to(device)
        if hasattr(self.method, "batching"):  # the MAML family: the formulation that runs here
            self.config["batching"] = resolve_batching(self.method.batching, device.type)
        if init is not None:
            init.load_into(self.method)
        if settings.freeze_backbone:
            self.method.backbone.requires_grad_(False)
        if settings.channels_last:
            self.method.to(memory_format=torch.channels_last)
        self._check_memory()
        self.optimizer = make_optimizer(settings, self.method)
        self.precision = precision_name(settings.amp, device.type)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        # Every rank draws the same full batch and keeps its own share of the episodes, so a
        # step sees the episodes a single process would (gradients are averaged by DDP).
        self.forward = self.method
        self.compiled = CompiledBackbone(self.method, settings.compile)
        if dist.world > 1:
            ids = [device.index] if device.type == "cuda" else None
            self.forward = DistributedDataParallel(self.method, device_ids=ids)
        self.streams = RandomStreams(settings.seed, dist.rank)
        self.augment = self._make_augment()
        self.progress = Progress()
        self.rank_rngs: list[dict] = []  # every rank's streams, gathered before a save
        self.run_dir = Path(settings.out)
        self.resumed = resume is not None
        self.stops = StopRequests()
        self.events = EventLog(None)  # opened by `fit`, on rank 0 only
        # A frozen backbone's features of every training image, memory-mapped (`fit` reads
        # them, see `_cache_features`); None: each step embeds its images.
        self.train_features: torch.Tensor | None = None
        if resume:
            path, ckpt = resume
            self.progress = restore_training(
                ckpt,
                path,
                self.method,
                self.optimizer,
                self.scaler,
                self.batches.sampler,
                self.streams,
                self.steps_per_epoch,
                dist.rank,
            )

    def _check_memory(self) -> None:
        """Refuse, before the first step, a training step or a validation batch that cannot
        fit in what the device has available (lower bounds from the shapes, per method), and
        validate with the embedding cache where it pays and fits (same accuracies either way):
        it pays where the validation split has fewer images than the validation episodes, or
        where a frozen backbone keeps the split's features on disk, embedded once a run."""
        terms = self.batches.memory_terms(self.method, self.dist.world)
        if terms:
            check_memory(terms, self.device, "one training step")
        # Validation on the batches that run (at most --val-episodes episodes each).
        shape, episodes = self.val_shape, self.settings.val_episodes
        images = len(self.val_data.labels)
        terms = evaluation_terms(self.method, shape, episodes, images, cache=False)
        terms = [replace(t, lower="--val-way or --val-query") for t in terms]
        if terms:
            check_memory(terms, self.device, "a validation batch")
        pays = self.settings.freeze_backbone or cache_pays(self.method, images, shape, episodes)
        cached = evaluation_terms(self.method, shape, episodes, images, cache=True)
        self.val_cache = pays and fits(sum(t.size for t in cached), self.device)
        if pays and not self.val_cache:
            need = format_bytes(self.method.cache_bytes(images))
            tqdm.write(f"validation embeds every episode: its cache would need {need}")

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch (episodes per epoch / episodes per batch, or full
        batches of images per pass over them)."""
        return self.batches.steps_per_epoch

    def _make_augment(self):
        """The training-time image transform (None: normalisation only)."""
        if not self.settings.augment:
            return None
        data = self.train_data
        augment = TrainAugment.paper(data.mean, data.std, data.image_size)
        return lambda images: augment(images, self.streams.augment)

    def train_step(self) -> tuple[float, float]:
        """One optimizer step on a batch (of episodes, or of images); returns (loss, accuracy).

        Raises Diverged, leaving weights and optimizer state untouched, when the loss or a
        gradient is not finite (with fp16 the AMP scaler already skips inf/nan gradients).
        """
        losses, accuracies = [], []
        draws = self.batches.draw(self.streams.resplit, self.dist, self.device)
        with self.compiled.active():
            for index, arguments in draws:
                if self.train_features is None:
                    images = episode_images(
                        self.train_data,
                        index,
                        self.device,
                        self.augment,
                        self.settings.channels_last,
                    )
                    output = self.forward(images, *arguments)
                else:  # a varied episode's padding (-1) takes the first image's, never read
                    features = self.train_features[index.cpu().clamp(min=0)].to(self.device)
                    output = self.method.embedded_loss(features, *arguments)
                # A plug-in method's output, refused before it reaches the optimizer.
                loss, acc = check_step(output, self.batches.owner)
                losses.append(loss)
                accuracies.append(acc)
        loss, acc = torch.stack(losses).mean(), torch.cat(accuracies)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        finite = torch.isfinite(loss)
        if not self.scaler.is_enabled():
            grads = [p.grad for p in self.method.parameters() if p.grad is not None]
            finite &= torch.isfinite(torch.nn.utils.get_total_norm(grads))
        if not finite.item():  # one synchronisation per step, as loss.item() needs anyway
            self.optimizer.zero_grad(set_to_none=True)
            raise Diverged(
                f"the loss or its gradient became non-finite (loss {loss.item()}) at epoch "
                f"{self.progress.epoch + 1} step {self.progress.step + 1}; the step was not "
                f"applied and the checkpoints keep their finite weights; "
                f"{self.method.divergence_advice()}"
            )
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.item(), acc.mean().item()

    def validate(self) -> tuple[float, float]:
        """Accuracy ± 95% CI (percent) on the fixed, seeded validation episodes."""
        result = evaluate(
            self.method,
            self.val_data,
            self.val_shape,
            self.settings.val_episodes,
            self.settings.val_seed,
            self.device,
            cache=self.val_cache,
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
                atomic_write_json(self.config, self.run_dir / "config.json")
                self._write_metrics()  # drops rows a killed run wrote after its checkpoint
                self.events = stack.enter_context(self._open_events())
            try:
                self.train_features = self._cache_features()
            except Interrupted as e:  # a checkpoint to resume from, as for a stop mid-epoch
                self._save_and_stop(e.signum, " (embedding the features: again on resume)")
            while self.progress.epoch < self.settings.epochs:
                self._train_epoch()
                self._finish_epoch()
        return self.run_dir

    def _cache_features(self) -> torch.Tensor | None:
        """With a frozen backbone and no augmentation, every image of the train and validation
        splits embedded once into the run folder's feature cache (reused on resume and by
        `fewshot eval`), and the training features; None where each step must embed its
        images (augmented, trained or torchrun's backbone, or a method that cannot cache)."""
        s = self.settings
        if not s.freeze_backbone or s.augment or self.dist.world > 1:
            return None
        if not self.method.use_feature_cache(self.run_dir / FEATURES):
            return None
        self.method.backbone.eval()  # frozen: as every step runs it
        tqdm.write(f"embedding the frozen backbone's features once into {self.run_dir / FEATURES}")
        return self.method.split_features(self.train_data, self.device, self._stop_signal)

    def _stop_signal(self) -> int | None:
        """The signal that asked this process to stop, if any."""
        return self.stops.signum

    def _stop_agreed(self) -> int | None:
        """The stop signal of any rank, so that all ranks stop at the same step."""
        return any_rank(self.stops.signum or 0, self.dist) or None

    def _train_epoch(self) -> None:
        """Run the current epoch's remaining steps, stopping cleanly when asked to."""
        s, progress = self.settings, self.progress
        for group, lr in zip(self.optimizer.param_groups, base_lrs(s), strict=True):
            group["lr"] = lr * s.lr_factor(progress.epoch)
        self.method.train()
        if s.freeze_backbone:  # its BatchNorm statistics and dropout stay as loaded
            self.method.backbone.eval()
        bar = tqdm(
            total=self.steps_per_epoch,
            initial=progress.step,
            desc=f"epoch {progress.epoch + 1}/{s.epochs}",
            unit="step",
            leave=False,
            disable=not self.dist.is_main,
        )
        with bar:
            while progress.step < self.steps_per_epoch:
                start = time.perf_counter()
                loss, acc = self.train_step()
                progress.add_step(loss, acc, time.perf_counter() - start)
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", acc=f"{100 * acc:.1f}")
                signum = self._stop_agreed()
                if signum:
                    self._save_and_stop(signum, "")

    def _finish_epoch(self) -> None:
        """Validate, log and checkpoint; an interruption in validation saves the epoch's
        trained state, and the resumed run validates it again."""
        self._gather_rngs()
        row, stopped = None, 0
        if self.dist.is_main:
            try:
                p = self.progress
                lr = self.optimizer.param_groups[0]["lr"]
                row = metrics_row(
                    p.epoch + 1,
                    lr,
                    p.step,
                    p.loss_sum,
                    p.acc_sum,
                    p.seconds,
                    self.validate(),
                    self.precision,
                )
            except Interrupted as e:
                stopped = e.signum
        stopped = broadcast_from_main(stopped, self.dist)
        if stopped:
            self._save_and_stop(stopped, " (in validation: it is run again on resume)")
        self.progress.next_epoch()
        if not self.dist.is_main:
            return
        self.progress.history.append(row)
        tqdm.write(
            f"epoch {row['epoch']}: loss {row['train_loss']:.3f} train {row['train_acc']:.2f}% "
            f"val {row['val_acc']:.2f} ± {row['val_ci95']:.2f}%"
        )
        self._log_epoch(row)
        # best.pt before last.pt: if killed in between, the resumed run validates again.
        if row["val_acc"] > self.progress.best_val:
            self.progress.best_val = row["val_acc"]
            self.save(self.run_dir / "best.pt")
        self.save(self.run_dir / "last.pt")
        self._write_metrics()

    def _gather_rngs(self) -> None:
        """Every rank's random streams, for the next save."""
        mine = self.streams.state()
        self.rank_rngs = gather_objects(mine, self.dist) or [mine]

    def _save_and_stop(self, signum: int, where: str) -> None:
        """Save last.pt at this step boundary and stop the run."""
        self._gather_rngs()
        last = self.run_dir / "last.pt"
        self.save(last)
        raise Interrupted(
            signum,
            f"stopped at epoch {self.progress.epoch + 1} step {self.progress.step}{where}; "
            f"saved {last}; continue with: fewshot {self.settings.stage} --resume {last}",
        )

    def _open_events(self) -> EventLog:
        """The run's TensorBoard log: a fresh run's starts with its settings; a resumed run's
        continues at its next epoch, dropping what a killed run logged after its checkpoint."""
        if self.resumed:
            return EventLog(self.run_dir, resume_step=self.progress.epoch + 1)
        events = EventLog(self.run_dir)
        events.hparams(self.config, ["val/accuracy"])
        events.margin_chart("validation accuracy ± 95% CI", *VAL_BAND)
        return events

    def _log_epoch(self, row: dict) -> None:
        """An epoch's metrics row, step time and throughput, flushed before the checkpoint: a run
        killed in between logs the epoch again when resumed."""
        s, steps = self.settings, self.steps_per_epoch
        unit, per_step = (
            ("images", s.batch_size)
            if isinstance(s, PretrainSettings)
            else ("episodes", s.episodes_per_batch)
        )
        value, lower, upper = VAL_BAND
        scalars = {
            "train/loss": row["train_loss"],
            "train/accuracy": row["train_acc"],
            value: row["val_acc"],
            "val/ci95": row["val_ci95"],
            lower: row["val_acc"] - row["val_ci95"],
            upper: row["val_acc"] + row["val_ci95"],
            "lr": row["lr"],
            "time/step_seconds": row["seconds"] / steps,
        }
        if row["seconds"] > 0:
            scalars[f"time/{unit}_per_second"] = steps * per_step / row["seconds"]
        self.events.scalars(row["epoch"], scalars)
        self.events.flush()

    def _write_metrics(self) -> None:
        """metrics.jsonl: one JSON line per finished epoch, rewritten whole (atomically)."""
        lines = "".join(json.dumps(row) + "\n" for row in self.progress.history)
        atomic_write_text(lines, self.run_dir / "metrics.jsonl")

    def save(self, path: Path) -> None:
        """Atomically write everything needed to evaluate or resume exactly (rank 0 only);
        never non-finite weights."""
        if not self.dist.is_main:
            return
        state = training_checkpoint(
            self.config,
            self.method,
            self.optimizer,
            self.scaler,
            self.batches.sampler,
            self.progress,
            self.rank_rngs,
        )
        bad = non_finite(state["model"])
        if bad:
            raise Diverged(f"not saving {path}: non-finite values in {', '.join(bad[:3])}")
        atomic_torch_save(state, path)
