"""What a training run draws and optimises each step: batches of episodes (`fewshot train`) or
batches of labelled images (`fewshot pretrain`). Everything else about a run (folder, resume,
signals, checkpoints, precision, torchrun, metrics) is the trainer's, shared by both."""

from __future__ import annotations

import torch

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import ImageBatchSampler
from fewshot.datasets.sources import training_sampler
from fewshot.datasets.varied import VariedShape, episode_shots
from fewshot.methods import Method, build_method, method_names
from fewshot.methods.pretraining import build_pretrain_method
from fewshot.methods.resplit import draw_resplits, draw_varied_resplits
from fewshot.runtime.distributed import Distributed
from fewshot.runtime.memory import MemoryTerm
from fewshot.training.run_settings import RunSettings
from fewshot.training.settings import PretrainSettings, TrainSettings


def rank_share(size: int, dist: Distributed) -> slice:
    """This rank's share of a batch of `size` (every rank draws the whole batch)."""
    return slice(dist.rank * size // dist.world, (dist.rank + 1) * size // dist.world)


class EpisodeBatches:
    """`fewshot train`: batches of episodes, each re-split U times for EHG."""

    def __init__(self, settings: TrainSettings, data: ImageSplit, seed: int):
        self.settings = settings
        self.sampler = training_sampler(data, settings.train_shape, seed)
        self.steps_per_epoch = settings.episodes_per_epoch // settings.episodes_per_batch
        # How refusals of its training steps name the method (a plug-in's with its package).
        self.owner = method_names().label(settings.method)

    def config(self, data: ImageSplit) -> dict:
        """What the checkpoint's config records besides the settings."""
        return {"stage": "train"}

    def build(self, config: dict) -> Method:
        """The method the run trains."""
        return build_method(config)

    def memory_terms(self, method: Method, world: int) -> list[MemoryTerm]:
        """Lower bounds of one training step of this process."""
        s, shape = self.settings, self.settings.train_shape
        episodes = s.episodes_per_batch // world
        way = shape.max_way if isinstance(shape, VariedShape) else shape.way
        return method.memory_terms(episodes, way, shape.pool, s.shot, s.resplits, True)

    def draw(
        self, resplit: torch.Generator, dist: Distributed, device: torch.device
    ) -> list[tuple[torch.Tensor, tuple]]:
        """This rank's image indices [b, way, pool] and the method's other arguments: one such
        part, or one per episode for varied episodes (each has its own way)."""
        s = self.settings
        if s.varied:  # torchrun is refused for them (see the trainer)
            return [self._varied_episode(resplit) for _ in range(s.episodes_per_batch)]
        index = self.sampler.sample()
        b, way, _ = index.shape
        resplits = None
        if s.resplits > 1:
            resplits = draw_resplits(b, way, s.shot, s.query, s.resplits, resplit)
        share = rank_share(b, dist)
        if resplits is not None:
            resplits = resplits[:, share]
        return [(index[share], (resplits, s.shot))]

    def _varied_episode(self, resplit: torch.Generator) -> tuple[torch.Tensor, tuple]:
        """One varied episode [1, way, pool] with its re-splits and shots per class [1, way]."""
        s = self.settings
        index = self.sampler.sample()
        shots = episode_shots(index, s.query)
        resplits = None
        if s.resplits > 1:
            resplits = draw_varied_resplits(shots, index.shape[2], s.resplits, resplit)
        return index, (resplits, shots)


class ImageBatches:
    """`fewshot pretrain`: batches of images of every train class with their labels."""

    def __init__(self, settings: PretrainSettings, data: ImageSplit, seed: int):
        self.settings, self.labels = settings, data.labels
        self.sampler = ImageBatchSampler(len(data.labels), settings.batch_size, seed, data.source)
        self.steps_per_epoch = self.sampler.batches_per_pass
        self.owner = "the pretraining model"

    def config(self, data: ImageSplit) -> dict:
        """The classifier's classes and the stage, recorded in the checkpoint's config."""
        return {"classes": data.num_classes, "stage": "pretrain"}

    def build(self, config: dict) -> Method:
        """The backbone with its classifier over every train class."""
        return build_pretrain_method(config)

    def memory_terms(self, method: Method, world: int) -> list[MemoryTerm]:
        """Lower bounds of one training step of this process."""
        return method.batch_memory_terms(self.settings.batch_size // world)

    def draw(
        self, resplit: torch.Generator, dist: Distributed, device: torch.device
    ) -> list[tuple[torch.Tensor, tuple]]:
        """This rank's image indices [n] and their labels on the device (one part)."""
        index = self.sampler.sample()[rank_share(self.settings.batch_size, dist)]
        return [(index, (self.labels[index].to(device),))]


def batches_for(settings: RunSettings, data: ImageSplit, seed: int):
    """The batch source of a run's settings."""
    if isinstance(settings, PretrainSettings):
        return ImageBatches(settings, data, seed)
    return EpisodeBatches(settings, data, seed)
