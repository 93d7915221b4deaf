"""`fewshot show`: draw episodes saved by `fewshot eval --save-episodes` as a PNG grid.

Each episode is a block of rows, one per class: its support images (blue frame), then its
queries, green when classified right, red with the class they were given when wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fewshot.datasets import load_split
from fewshot.datasets.base import ImageSplit
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_save_figure, prepare_output
from fewshot.runtime.settings import (
    Command,
    SettingError,
    check_fields,
    read_json_object,
    setting,
)

SUFFIXES = (".png", ".pdf", ".svg")
FRAMES = {"support": "tab:blue", "right": "tab:green", "wrong": "tab:red"}
SAVED_KEYS = (
    "dataset", "split", "data_root", "resize", "channels", "way", "shot", "episodes", "class_names",
)  # fmt: skip
EPISODE_KEYS = ("classes", "support", "query", "predicted", "accuracy")
# At most this many episodes in one figure: each is a block of way x pool images.
MOST = 16


@dataclass(frozen=True)
class ShowSettings:
    """`fewshot show`: which saved episodes to draw, into which image."""

    episodes_file: str = setting(help="JSON of fewshot eval --save-episodes", positional=True)
    episode: list[int] | None = setting(None, help="episode numbers to draw (from 0)")
    worst: int | None = setting(None, help="draw the N episodes of lowest accuracy", low=1)
    out: str = setting("episodes.png", help="image file to write (.png, .pdf, .svg)")
    overwrite: bool = setting(False, help="replace an existing --out file")

    def __post_init__(self) -> None:
        check_fields(self)
        if Path(self.out).suffix.lower() not in SUFFIXES:
            raise SettingError("out", f"must end in {', '.join(SUFFIXES)}, got {self.out!r}")
        if self.episode is not None and self.worst is not None:
            raise SettingError("worst", "give --episode or --worst, not both")
        chosen = len(self.episode) if self.episode is not None else self.worst or 1
        if chosen > MOST:
            raise SettingError("worst" if self.worst else "episode", f"draws at most {MOST}")


def read_saved(path: Path) -> dict:
    """A saved-episodes file, refused in one line naming it and its first fault when it is
    not one or is damaged: its structure and types checked through, before anything is read
    or drawn from it."""
    saved = read_json_object(path, "episodes file")
    missing = [key for key in SAVED_KEYS if key not in saved]
    if missing:
        raise FewshotError(
            f"{path} is not a file of fewshot eval --save-episodes (no {missing[0]!r})"
        )
    fault = saved_fault(saved)
    if fault:
        raise FewshotError(f"{path} is damaged: {fault}")
    return saved


def is_count(value: object, low: int = 0) -> bool:
    """An integer (not a bool) of at least `low`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def are_rows(value: object, rows: int, least: int, high: float = float("inf")) -> bool:
    """Whether `value` is `rows` lists, each of `least` or more integers in 0 .. high - 1."""
    return (
        isinstance(value, list)
        and len(value) == rows
        and all(
            isinstance(row, list)
            and len(row) >= least
            and all(is_count(x) and x < high for x in row)
            for row in value
        )
    )


def saved_fault(saved: dict) -> str | None:
    """What is wrong with a saved-episodes file's structure or types (None: nothing): every
    key `fewshot show` reads, in every episode, so that drawing meets none of them."""
    for key in ("dataset", "split", "data_root"):
        if not isinstance(saved[key], str):
            return f"{key!r} must be a string, got {json.dumps(saved[key])[:60]}"
    for key in ("resize", "channels"):
        if saved[key] is not None and not is_count(saved[key], 1):
            return f"{key!r} must be a positive integer or null, got {json.dumps(saved[key])[:60]}"
    names = saved["class_names"]
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        return "'class_names' must be a non-empty list of strings"
    episodes = saved["episodes"]
    if not (isinstance(episodes, list) and episodes):
        return "'episodes' must be a non-empty list of episodes"
    for n, episode in enumerate(episodes):
        if not isinstance(episode, dict):
            return f"episode {n} must be an object, not a {type(episode).__name__}"
        missing = [key for key in EPISODE_KEYS if key not in episode]
        if missing:
            return f"episode {n} has no {missing[0]!r}"
        classes = episode["classes"]
        if not are_rows([classes], 1, 1, len(names)):
            return (
                f"episode {n} 'classes' must be a non-empty list of class numbers 0 to "
                f"{len(names) - 1} ('class_names')"
            )
        way = len(classes)
        if not are_rows(episode["support"], way, 1):
            return f"episode {n} 'support' must be {way} lists of one or more image indices"
        if not are_rows(episode["query"], way, 0):
            return f"episode {n} 'query' must be {way} lists of image indices"
        predicted = episode["predicted"]
        if not (
            are_rows(predicted, way, 0, way)
            and [len(row) for row in predicted] == [len(row) for row in episode["query"]]
        ):
            return (
                f"episode {n} 'predicted' must be {way} lists of class positions 0 to "
                f"{way - 1}, one per query"
            )
        accuracy = episode["accuracy"]
        if not (isinstance(accuracy, int | float) and not isinstance(accuracy, bool)):
            return f"episode {n} 'accuracy' must be a number, got {json.dumps(accuracy)[:60]}"
        if not 0 <= accuracy <= 1:
            return f"episode {n} 'accuracy' must be between 0 and 1, got {accuracy}"
    return None


def index_fault(saved: dict, split: ImageSplit) -> str | None:
    """An image index of the file outside the split, or of another class than the file
    records (the data changed since it was saved); None: every one is as recorded."""
    labels, names = split.labels.tolist(), saved["class_names"]
    for n, episode in enumerate(saved["episodes"]):
        rows = zip(episode["classes"], episode["support"], episode["query"], strict=True)
        for c, (label, support, query) in enumerate(rows):
            for index in support + query:
                if index >= len(labels):
                    return (
                        f"episode {n} class {c} names image {index}, beyond the "
                        f"{len(labels)} images of the split"
                    )
                now = labels[index]
                if now != label or split.class_names[now] != names[label]:
                    return (
                        f"episode {n} class {c}'s image {index} is of class "
                        f"{split.class_names[now]!r} in the data now, the file records "
                        f"{names[label]!r}: the data changed since it was saved"
                    )
    return None


def chosen(settings: ShowSettings, saved: dict, path: Path) -> list[int]:
    """The episode numbers to draw: --episode, the --worst N, or the first."""
    count = len(saved["episodes"])
    if settings.worst is not None:
        order = sorted(range(count), key=lambda i: (saved["episodes"][i]["accuracy"], i))
        return order[: settings.worst]
    numbers = settings.episode or [0]
    bad = next((n for n in numbers if not 0 <= n < count), None)
    if bad is not None:
        raise FewshotError(f"--episode {bad}: {path} holds episodes 0 to {count - 1}")
    return numbers


def run_show(settings: ShowSettings) -> Path:
    """Draw the chosen episodes of a saved-episodes file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(settings.episodes_file)
    saved = read_saved(path)
    numbers = chosen(settings, saved, path)
    out = prepare_output(settings.out, settings.overwrite)
    split = load_split(
        saved["dataset"],
        saved["split"],
        saved["data_root"],
        resize=saved["resize"],
        channels=saved["channels"],
    )
    fault = index_fault(saved, split)
    if fault:
        raise FewshotError(
            f"{path} does not match {saved['dataset']} split {saved['split']!r}: {fault}"
        )
    # One row per class of each episode, as many columns as its largest class has images (a
    # varied episode's ways and shots differ); the cells a class does not fill stay blank.
    episodes = [saved["episodes"][n] for n in numbers]
    ways = [len(e["classes"]) for e in episodes]
    pool = max(
        len(support) + len(query)
        for e in episodes
        for support, query in zip(e["support"], e["query"], strict=True)
    )
    fig, axes = plt.subplots(sum(ways), pool, figsize=(pool * 0.9, sum(ways) * 0.95), squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    for block, number in enumerate(numbers):
        first = sum(ways[:block])
        draw_episode(axes[first : first + ways[block]], split, saved, number)
    fig.tight_layout()
    atomic_save_figure(fig, out, dpi=100)
    plt.close(fig)
    print(f"episodes {', '.join(map(str, numbers))} in {settings.out}")
    return out


def draw_episode(rows, split: ImageSplit, saved: dict, number: int) -> None:
    """One episode on its way rows of axes: support then queries per class, framed."""
    episode = saved["episodes"][number]
    names = [saved["class_names"][c] for c in episode["classes"]]
    for c, axes in enumerate(rows):
        cells = [(i, "support", "") for i in episode["support"][c]]
        for i, given in zip(episode["query"][c], episode["predicted"][c], strict=True):
            cells.append((i, "right", "") if given == c else (i, "wrong", f"as {given}"))
        for ax, (index, kind, note) in zip(axes, cells, strict=False):  # blank cells after
            ax.set_axis_on()
            image = split.images[index].permute(1, 2, 0).numpy()
            ax.imshow(image.squeeze(-1) if image.shape[-1] == 1 else image, cmap="gray")
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_edgecolor(FRAMES[kind])
                spine.set_linewidth(3)
            if note:
                ax.set_title(note, fontsize=7, color=FRAMES["wrong"], pad=1)
        label = f"{c}: {names[c][:24]}"
        if c == 0:
            label = f"episode {number} ({100 * episode['accuracy']:.0f} %)\n{label}"
        axes[0].set_ylabel(label, fontsize=7, rotation=0, ha="right", va="center")


COMMANDS = [
    Command(
        ("show",),
        "draw episodes saved by fewshot eval --save-episodes (support, right and wrong queries)",
        (ShowSettings,),
        run_show,
    )
]
