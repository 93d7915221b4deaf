"""torch.hub entry points: the backbones, and the Omniglot zoo models ready to use.

torch.hub.load(REPO, "resnet12", avg_pool=True) builds a backbone (REPO: a clone's path with
source="local", or the GitHub owner/name); torch.hub.load(REPO, "protonet_conv4_omniglot")
returns the trained model in eval mode (`maml_conv4_omniglot`, `fomaml_conv4_omniglot`,
`anil_conv4_omniglot`, `imaml_conv4_omniglot`: the MAML family's;
`matching_conv4_omniglot`, `relation_conv4_omniglot`: Matching and Relation Networks, one model
per training shape, `shape="20way5shot"`).
"""

from pathlib import Path

import torch

from fewshot.backbones import Conv4, ResNet12
from fewshot.backbones.arguments import require_bool
from fewshot.methods import AdaptationMethod, EmbeddingMethod, Method, build_method
from fewshot.methods.comparison import ComparisonMethod
from fewshot.training.checkpoint import load_trained

dependencies = ["torch", "torchvision", "numpy"]

ZOO = Path(__file__).resolve().parent / "models"


def conv4(**kwargs) -> Conv4:
    """Conv-4 (4 x conv3x3-BN-ReLU-maxpool, 64 channels); kwargs as `fewshot.backbones.Conv4`."""
    return Conv4(**kwargs)


def resnet12(**kwargs) -> ResNet12:
    """ResNet-12 (64-160-320-640, DropBlock); kwargs as `fewshot.backbones.ResNet12`."""
    return ResNet12(**kwargs)


def _device(owner: str, device: object) -> torch.device:
    """`device` ('cpu', 'cuda', 'cuda:N' or a torch.device) as a device this machine has."""
    try:
        resolved = torch.device(device) if isinstance(device, str | torch.device) else None
    except RuntimeError:  # a string torch cannot parse
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"{owner} device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if resolved.type == "cuda" and (resolved.index or 0) >= torch.cuda.device_count():
        raise ValueError(
            f"{owner} device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPUs"
        )
    return resolved


def _zoo_model(name: str, owner: str, pretrained: bool, device: str | torch.device) -> Method:
    """The zoo checkpoint models/omniglot/<name>.pt in eval mode, or its method untrained;
    the arguments of the hub entry point `owner` checked first."""
    require_bool(owner, "pretrained", pretrained)
    place = _device(owner, device)
    model, config = load_trained(str(ZOO / "omniglot" / f"{name}.pt"), place)
    if not pretrained:
        model = build_method({**config, "in_channels": 1, "image_size": 28}).to(place).eval()
    return model


def protonet_conv4_omniglot(
    pretrained: bool = True, device: str | torch.device = "cpu"
) -> EmbeddingMethod:
    """The Conv-4 ProtoNet trained on Omniglot's train+val classes (98.75 % 5-way 1-shot),
    in eval mode; `model.embed(images)` takes float [N, 1, 28, 28] images, ink 1 on 0."""
    return _zoo_model("protonet_conv4_trainval", "protonet_conv4_omniglot", pretrained, device)


def maml_conv4_omniglot(
    pretrained: bool = True, device: str | torch.device = "cpu"
) -> AdaptationMethod:
    """MAML on the MAML paper's stride-2 Conv-4, trained 5-way 1-shot on Omniglot's train
    classes for 4,000 meta-iterations (2 hours of a 2-core CPU), in eval mode;
    `model.accuracy(images, shot)` adapts to each episode of images [B, 5, shot + query, 1, 28,
    28] (support first, ink 1 on 0)."""
    return _zoo_model("maml_conv4_5way1shot_cpu", "maml_conv4_omniglot", pretrained, device)


def fomaml_conv4_omniglot(
    pretrained: bool = True, device: str | torch.device = "cpu"
) -> AdaptationMethod:
    """First-order MAML, trained as `maml_conv4_omniglot` for 4,000 meta-iterations, used the
    same way."""
    return _zoo_model("fomaml_conv4_5way1shot_cpu", "fomaml_conv4_omniglot", pretrained, device)


def anil_conv4_omniglot(
    pretrained: bool = True, device: str | torch.device = "cpu"
) -> AdaptationMethod:
    """ANIL (only the classifier adapts), trained as `maml_conv4_omniglot` for 4,000
    meta-iterations, used the same way (20 test-time steps, chosen on validation episodes)."""
    return _zoo_model("anil_conv4_5way1shot_cpu", "anil_conv4_omniglot", pretrained, device)


def imaml_conv4_omniglot(
    pretrained: bool = True, device: str | torch.device = "cpu"
) -> AdaptationMethod:
    """iMAML (proximal inner steps, implicit meta-gradient), trained as `maml_conv4_omniglot`
    for 3,200 meta-iterations, used the same way."""
    return _zoo_model("imaml_conv4_5way1shot_cpu", "imaml_conv4_omniglot", pretrained, device)


def _shaped_zoo_model(
    method: str, owner: str, shape: str, pretrained: bool, device: str | torch.device
) -> Method:
    """The zoo's `method` model trained on `shape` episodes (e.g. '5way1shot'), refused by name
    when no such model is shipped."""
    shipped = sorted(p.stem.split("_")[-1] for p in (ZOO / "omniglot").glob(f"{method}_conv4_*.pt"))
    if shape not in shipped:
        raise ValueError(f"{owner} shape must be one of {', '.join(shipped)}, got {shape!r}")
    return _zoo_model(f"{method}_conv4_{shape}", owner, pretrained, device)


def matching_conv4_omniglot(
    pretrained: bool = True, device: str | torch.device = "cpu", shape: str = "5way1shot"
) -> ComparisonMethod:
    """Matching Networks (Conv-4, attention over squared Euclidean distances) trained on
    Omniglot's train classes with `shape` episodes ('5way1shot', '20way5shot', ...), in eval
    mode; `model.accuracy(images, shot)` on episodes of images [B, way, shot + query, 1, 28,
    28] (support first, ink 1 on 0). Accuracies: docs/results.md."""
    return _shaped_zoo_model("matching", "matching_conv4_omniglot", shape, pretrained, device)


def relation_conv4_omniglot(
    pretrained: bool = True, device: str | torch.device = "cpu", shape: str = "5way1shot"
) -> ComparisonMethod:
    """Relation Networks (a Conv-4's feature maps, the relation module over the mean of each
    class's maps) trained on Omniglot with `shape` episodes, in eval mode: '5way1shot',
    '5way5shot' and '20way1shot', each with the paper's 7x7 maps on the train and validation
    classes (each checkpoint's config says);
    `model.accuracy(images, shot)` as for `matching_conv4_omniglot`."""
    return _shaped_zoo_model("relation", "relation_conv4_omniglot", shape, pretrained, device)
