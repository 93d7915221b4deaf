"""`fewshot show`: draw episodes saved by `fewshot eval --save-episodes` as a PNG grid.

Each episode is a block of rows, one per class: its support images (blue frame), then its
queries, green when classified right, red with the class they were given when wrong.
"""

from __future__ import annotations

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
SAVED_KEYS = ("dataset", "split", "data_root", "resize", "channels", "way", "shot", "episodes")
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
    """A saved-episodes file, refused in one line when it is not one."""
    saved = read_json_object(path, "episodes file")
    missing = [key for key in SAVED_KEYS if key not in saved]
    if missing:
        raise FewshotError(
            f"{path} is not a file of fewshot eval --save-episodes (no {missing[0]!r})"
        )
    return saved


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
