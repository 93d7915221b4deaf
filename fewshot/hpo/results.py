"""Where the HPO commands write their results: one naming rule for the CLI, tables and benchmarks.

- regularization: `{dataset}_{model}_{method}[_pp]_seed{seed}.json` (and `.png`)
- cleaning: `cleaning_{dataset}_{model}_{method}_seed{seed}.json`
- image-regularization: `imgreg_{dataset}_{model}_{method}_seed{seed}.json`
"""

from __future__ import annotations

from pathlib import Path

PREFIXES = {"regularization": "", "cleaning": "cleaning_", "image-regularization": "imgreg_"}


def result_stem(
    command: str, dataset: str, model: str, method: str, seed: int, per_parameter: bool = False
) -> str:
    """The file name, without suffix, of one run of `fewshot hpo COMMAND`."""
    if command not in PREFIXES:
        raise ValueError(f"no result files for {command!r}; known: {', '.join(PREFIXES)}")
    if per_parameter and command != "regularization":
        raise ValueError("per_parameter names regularization results only")
    suffix = "_pp" if per_parameter else ""
    return f"{PREFIXES[command]}{dataset}_{model}_{method}{suffix}_seed{seed}"


def result_path(
    out: str | Path,
    command: str,
    dataset: str,
    model: str,
    method: str,
    seed: int,
    per_parameter: bool = False,
) -> Path:
    """OUT/<result_stem>.json."""
    stem = result_stem(command, dataset, model, method, seed, per_parameter)
    return Path(out) / f"{stem}.json"


def plot_curve(curve: list[tuple[int, float]], path: Path, title: str) -> None:
    """Test loss against outer step, saved as an image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([s for s, _ in curve], [v for _, v in curve])
    ax.set(xlabel="outer step", ylabel="test loss", title=title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
