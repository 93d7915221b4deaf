"""Import a MetaOptNet checkpoint ({'embedding': ..., 'head': ...}) as a fewshot checkpoint.

MetaOptNet (Lee et al. 2019) saves `{'embedding': embedding_net.state_dict(), 'head':
cls_head.state_dict()}`, the embedding's keys prefixed with `module.` when it was trained under
DataParallel. Its parameter names map onto ours as follows:

  Conv-4 (ProtoNetEmbedding)      encoder.{i}.block.{0,1}.*   -> encoder.{i}.{0,1}.*
                                  (its convolutions have no bias: ours get a zero bias)
  ResNet-12                       layer{n}.0.conv{j}.weight   -> blocks.{n-1}.body.{3j-3}.weight
                                  layer{n}.0.bn{j}.*          -> blocks.{n-1}.body.{3j-2}.*
                                  layer{n}.0.downsample.{k}.* -> blocks.{n-1}.shortcut.{k}.*
  head                            scale [1]                   -> scale []

MetaOptNet keeps its DropBlock ramp in a plain attribute (not saved); our ResNet-12 keeps it
in the `drop_steps` buffer, counted in training forwards. BatchNorm's `num_batches_tracked`
counts the same training forwards, so the ramp resumes from there; a checkpoint without it
(PyTorch < 0.4.1) is taken as fully ramped, as any finished MetaOptNet run is.
"""

from __future__ import annotations

import re

import torch

from fewshot.datasets import cifar100_fewshot, miniimagenet
from fewshot.methods import build_method
from fewshot.runtime.errors import FewshotError, summary
from fewshot.training.settings import TrainSettings

# Image side of each dataset MetaOptNet trains on (all RGB).
IMAGE_SIZES = {
    "miniimagenet": miniimagenet.IMAGE_SIZE,
    "tieredimagenet": miniimagenet.IMAGE_SIZE,
    "cifar-fs": cifar100_fewshot.IMAGE_SIZE,
    "fc100": cifar100_fewshot.IMAGE_SIZE,
}
# MetaOptNet's head name -> (our head, factor on its scale that gives the same logits).
# Its 'Ridge' head solves min 1/2 z'Gz - 2 y'z, i.e. twice the ridge solution; R2D2 does not.
METAOPTNET_HEADS = {
    "protonet": ("protonet", 1.0),
    "ridge": ("ridge", 2.0),
    "r2d2": ("ridge", 1.0),
    "svm": ("svm", 1.0),
}

CONV4_KEY = re.compile(r"encoder\.(\d)\.block\.([01])\.(\w+)")
RESNET12_KEY = re.compile(r"layer([1-4])\.0\.(?:(conv|bn)([1-3])|downsample\.([01]))\.(\w+)")
# A key that names each backbone, to say which one a checkpoint holds when it does not fit.
SIGNATURES = {"conv4": "encoder.0.block.0.weight", "resnet12": "layer1.0.conv1.weight"}


def strip_module(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop DataParallel's `module.` prefix from every key that has it."""
    return {k.removeprefix("module."): v for k, v in state.items()}


def map_conv4(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """MetaOptNet Conv-4 tensors under our names (plus zero conv biases), and unmatched keys."""
    ours, unmatched = {}, []
    for key, value in state.items():
        match = CONV4_KEY.fullmatch(key)
        if not match:
            unmatched.append(key)
            continue
        block, layer, name = match.groups()
        ours[f"encoder.{block}.{layer}.{name}"] = value
        if layer == "0" and name == "weight":
            ours[f"encoder.{block}.0.bias"] = value.new_zeros(value.shape[0])
    return ours, unmatched


def map_resnet12(
    state: dict[str, torch.Tensor], ramp_steps: int
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """MetaOptNet ResNet-12 tensors under our names (plus drop_steps), and unmatched keys."""
    ours, unmatched = {}, []
    for key, value in state.items():
        match = RESNET12_KEY.fullmatch(key)
        if not match:
            unmatched.append(key)
            continue
        layer, kind, index, shortcut, name = match.groups()
        block = int(layer) - 1
        if shortcut is not None:
            ours[f"blocks.{block}.shortcut.{shortcut}.{name}"] = value
        else:
            # Our body is [conv, bn, relu] x 2 + [conv, bn]: conv j at 3(j-1), its bn right after.
            position = 3 * (int(index) - 1) + (kind == "bn")
            ours[f"blocks.{block}.body.{position}.{name}"] = value
    counter = state.get("layer3.0.bn1.num_batches_tracked")
    steps = int(counter) if counter is not None else ramp_steps
    ours["drop_steps"] = torch.tensor(steps, dtype=torch.long)
    return ours, unmatched


def import_metaoptnet(ckpt: dict, backbone: str, head: str, dataset: str, source: str) -> dict:
    """A fewshot checkpoint {'config', 'model', 'imported_from'} from a MetaOptNet checkpoint."""
    if not isinstance(ckpt, dict) or not {"embedding", "head"} <= ckpt.keys():
        found = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise FewshotError(
            f"{source}: expected MetaOptNet keys 'embedding' and 'head', got {found}"
        )
    our_head, scale_factor = METAOPTNET_HEADS[head]
    image_size = IMAGE_SIZES[dataset]
    config = TrainSettings(
        dataset=dataset,
        backbone=backbone,
        # MetaOptNet's settings: DropBlock 5 at 84x84, 2 at 32x32; ProtoNet distances / d.
        # Its SVM truncated qpth at 3 test iterations; the default solver converges instead
        # (eval_head_options {"solver": "qpth", "max_iter": 3} reproduces MetaOptNet's test).
        backbone_options={"drop_block_size": 5 if image_size == 84 else 2}
        if backbone == "resnet12"
        else {},
        head=our_head,
        head_options={"normalize_by_dim": True} if our_head == "protonet" else {},
    )
    model_config = {**config.to_dict(), "in_channels": 3, "image_size": image_size}
    model = build_method(model_config)

    embedding = strip_module(ckpt["embedding"])
    if backbone == "conv4":
        mapped, unmatched = map_conv4(embedding)
    elif backbone == "resnet12":
        mapped, unmatched = map_resnet12(embedding, model.backbone.drop_ramp_steps)
    else:
        raise ValueError(f"backbone must be resnet12 or conv4, not {backbone!r}")
    if unmatched or not mapped:
        held = [name for name, key in SIGNATURES.items() if key in embedding]
        what = f"it holds a {held[0]} embedding" if held else "its embedding is neither"
        raise FewshotError(
            f"{source} is not a MetaOptNet {backbone} checkpoint: {what} "
            f"(unexpected keys such as {(unmatched or sorted(embedding) or ['none'])[0]!r})"
        )
    head_state = strip_module(ckpt["head"])
    if "scale" not in head_state or head_state["scale"].numel() != 1:
        raise FewshotError(f"{source}: the head has no one-element 'scale' (enable_scale=True)")
    mapped = {f"backbone.{k}": v for k, v in mapped.items()}
    mapped["scale"] = head_state["scale"].reshape(()) * scale_factor
    try:
        model.load_state_dict(mapped)
    except RuntimeError as e:
        raise FewshotError(
            f"{source} does not fit our {backbone} for {dataset} images: {summary(e)}"
        ) from None
    return {
        "config": model_config,
        "model": model.state_dict(),
        "imported_from": {"checkpoint": source, "metaoptnet_head": head},
    }
