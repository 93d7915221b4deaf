"""Leaderboard statistics: Holm against statsmodels, the paired comparisons against scipy, the
rank bootstrap against a numpy re-implementation, the Friedman test and Nemenyi's critical
difference against scipy and Demšar's table."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from statsmodels.stats.multitest import multipletests

from fewshot.evaluation import ranking
from fewshot.evaluation.ranking import (
    CD_MIN_CELLS,
    across_cells,
    holm,
    plot_critical_difference,
    plot_differences,
    rank_cell,
)


def _bootstrap_intervals(values: dict[str, np.ndarray], seed: int, resamples: int, decimals=None):
    """The paired bootstrap of rank intervals in numpy: the documented indices, every model's
    resampled means, min ranks (1 = highest), floor/ceil of the 2.5 / 97.5 percentiles."""
    names = sorted(values)
    x = np.stack([values[name] for name in names])  # [models, episodes]
    n = x.shape[1]
    generator = torch.Generator().manual_seed(seed)
    indices = torch.randint(n, (resamples, n), generator=generator).numpy()
    means = x[:, indices].mean(axis=2)  # [models, resamples]
    if decimals is not None:  # discrete accuracies: equal sums must compare equal
        means = np.round(means, decimals)
    ranks = stats.rankdata(-means, method="min", axis=0)
    low = np.floor(np.percentile(ranks, 2.5, axis=1)).astype(int)
    high = np.ceil(np.percentile(ranks, 97.5, axis=1)).astype(int)
    return {name: (int(lo), int(hi)) for name, lo, hi in zip(names, low, high, strict=True)}


def _intervals(result) -> dict[str, tuple[int, int]]:
    return {s.name: (s.rank_low, s.rank_high) for s in result.standings}


def _cell(rng: np.random.Generator, levels: dict[str, float], n: int) -> dict[str, np.ndarray]:
    """Per-episode accuracies sharing an episode difficulty, one level per model."""
    difficulty = rng.uniform(-0.2, 0.2, n)
    return {
        name: np.clip(level + difficulty + rng.normal(0, 0.05, n), 0, 1)
        for name, level in levels.items()
    }


def _tensors(values: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {name: torch.tensor(v) for name, v in values.items()}


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 -> 3 * 0.01, 2 * 0.03, max(0.06, 1 * 0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.2]) == [0.2]
    assert holm([]) == []


@pytest.mark.parametrize("case", range(6))
def test_holm_matches_statsmodels(case):
    rng = np.random.default_rng(case)
    m = int(rng.integers(2, 30))
    p = [
        rng.uniform(0, 1, m),
        rng.uniform(0.9, 1, m),  # near 1: the cap
        rng.choice([0.001, 0.01, 0.02, 0.5], m),  # ties
        rng.uniform(0, 0.01, m),
        np.concatenate([rng.uniform(0, 0.05, m), [1.0, 1.0]]),
        rng.beta(0.3, 2, m),
    ][case]
    want = multipletests(p, method="holm")[1]
    assert holm(list(p)) == pytest.approx(list(want), rel=1e-12, abs=1e-15)


def test_a_cell_against_scipy_and_numpy():
    values = {
        "b": np.array([0.60, 0.72, 0.55, 0.80, 0.66, 0.70]),
        "a": np.array([0.64, 0.75, 0.61, 0.79, 0.70, 0.77]),
        "c": np.array([0.58, 0.70, 0.50, 0.82, 0.60, 0.65]),
    }
    result = rank_cell("5-way 1-shot", _tensors(values), resamples=200)
    assert result.cell == "5-way 1-shot" and result.episodes == 6 and result.best == "a"
    assert [s.name for s in result.standings] == ["a", "b", "c"]
    means = {name: v.mean() for name, v in values.items()}
    rank = dict(zip(values, stats.rankdata([-m for m in means.values()]), strict=True))
    raw = {}
    for s in result.standings:
        v = values[s.name]
        assert s.accuracy == pytest.approx(100 * v.mean())
        assert s.ci95 == pytest.approx(100 * 1.96 * v.std(ddof=1) / math.sqrt(6))
        assert s.rank == rank[s.name]
        if s.name == "a":
            assert s.difference is s.difference_ci95 is s.p_value is s.p_holm is None
            assert s.tied
            continue
        diff = v - values["a"]
        assert s.difference == pytest.approx(100 * diff.mean())
        assert s.difference_ci95 == pytest.approx(100 * 1.96 * diff.std(ddof=1) / math.sqrt(6))
        assert s.p_value == pytest.approx(stats.ttest_rel(v, values["a"]).pvalue, rel=1e-9)
        raw[s.name] = s.p_value
    adjusted = multipletests(list(raw.values()), method="holm")[1]
    for (name, _), want in zip(raw.items(), adjusted, strict=True):
        standing = next(s for s in result.standings if s.name == name)
        assert standing.p_holm == pytest.approx(want)
        assert standing.tied == (want >= 0.05)


def test_tied_flags_and_the_tie_break_by_name():
    rng = np.random.default_rng(1)
    top = rng.uniform(0.6, 0.9, 30)
    values = {
        "zeta": top,
        "alpha": top.copy(),  # equal to the best: the first name of the two is the best
        "worse": np.clip(top - 0.3 + rng.normal(0, 0.02, 30), 0, 1),
    }
    result = rank_cell("cell", _tensors(values), resamples=100)
    by_name = {s.name: s for s in result.standings}
    assert result.best == "alpha"
    assert [s.name for s in result.standings] == ["alpha", "zeta", "worse"]
    assert by_name["alpha"].rank == by_name["zeta"].rank == 1.5 and by_name["worse"].rank == 3
    assert by_name["zeta"].difference == 0 and by_name["zeta"].p_value == 1.0
    assert by_name["worse"].p_value < 1e-10
    p = [by_name["zeta"].p_value, by_name["worse"].p_value]
    assert [by_name["zeta"].p_holm, by_name["worse"].p_holm] == pytest.approx(
        list(multipletests(p, method="holm")[1])
    )
    assert by_name["alpha"].tied and by_name["zeta"].tied and not by_name["worse"].tied
    # Two identical models share every bootstrap rank, so their intervals are one interval.
    assert _intervals(result)["alpha"] == _intervals(result)["zeta"] == (1, 1)
    assert _intervals(result)["worse"] == (3, 3)


def test_a_single_model_is_the_best():
    result = rank_cell("cell", {"only": torch.tensor([0.5, 0.7, 0.6])})
    (s,) = result.standings
    assert result.best == "only" and s.tied and s.rank == 1 and (s.rank_low, s.rank_high) == (1, 1)
    assert s.difference is None and s.p_holm is None


def test_a_clearly_dominant_model_ranks_first_on_every_resample():
    rng = np.random.default_rng(2)
    values = _cell(rng, {"strong": 0.85, "m1": 0.5, "m2": 0.52, "m3": 0.49}, 200)
    intervals = _intervals(rank_cell("cell", _tensors(values), resamples=300))
    assert intervals["strong"] == (1, 1)
    assert all(low >= 2 for name, (low, _) in intervals.items() if name != "strong")


@pytest.mark.parametrize("seed", [0, 7])
def test_the_bootstrap_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    values = _cell(rng, {f"m{i}": 0.6 + 0.01 * i for i in range(6)}, 80)
    values["copy"] = values["m3"].copy()  # identical: exact ties on every resample
    result = rank_cell("cell", _tensors(values), seed=seed, resamples=400)
    assert _intervals(result) == _bootstrap_intervals(values, seed, 400)
    assert _intervals(result)["copy"] == _intervals(result)["m3"]


def test_the_bootstrap_with_discrete_accuracies_matches_numpy():
    # Accuracies in tenths: resamples often tie on the mean, and float sums of tenths in
    # another order differ in their last bits (without its tolerance rank_cell fails here).
    rng = np.random.default_rng(2)
    values = {name: rng.integers(5, 11, 20) / 10 for name in "abcdef"}
    result = rank_cell("cell", _tensors(values), seed=2, resamples=500)
    assert _intervals(result) == _bootstrap_intervals(values, 2, 500, decimals=12)


def test_the_bootstrap_in_chunks_draws_the_same_indices(monkeypatch):
    rng = np.random.default_rng(4)
    values = _cell(rng, {"a": 0.6, "b": 0.61, "c": 0.62}, 50)
    # About 7 resamples per chunk: 500 resamples in 72 draws.
    monkeypatch.setattr(ranking, "_CHUNK_BYTES", 7 * (24 * 50 + 9))
    result = rank_cell("cell", _tensors(values), seed=3, resamples=500)
    assert _intervals(result) == _bootstrap_intervals(values, 3, 500)


def test_the_bootstrap_is_seeded():
    rng = np.random.default_rng(5)
    values = _tensors(_cell(rng, {f"m{i}": 0.6 + 0.003 * i for i in range(8)}, 60))
    first = _intervals(rank_cell("cell", values, seed=1, resamples=200))
    assert _intervals(rank_cell("cell", values, seed=1, resamples=200)) == first
    others = [_intervals(rank_cell("cell", values, seed=s, resamples=200)) for s in (2, 3, 4)]
    assert any(other != first for other in others)


def test_a_leaderboard_sized_cell():
    generator = torch.Generator().manual_seed(0)
    values = {f"m{i}": torch.rand(2000, generator=generator) for i in range(20)}
    result = rank_cell("cell", values, resamples=1000)  # about 0.1 s on a CPU
    assert len(result.standings) == 20 and result.standings[0].name == result.best


def test_unpairable_accuracies_name_the_model():
    with pytest.raises(ValueError, match="at least one model"):
        rank_cell("cell", {})
    with pytest.raises(ValueError, match=r"model 'b': accuracies expects 1 dimension"):
        rank_cell("cell", {"a": torch.rand(4), "b": torch.rand(2, 2)})
    with pytest.raises(ValueError, match=r"model 'a': accuracies expects at least 2 episodes"):
        rank_cell("cell", {"a": torch.rand(1)})
    with pytest.raises(ValueError, match=r"model 'b' has 3 episodes, 'a' has 4"):
        rank_cell("cell", {"a": torch.rand(4), "b": torch.rand(3)})
    with pytest.raises(ValueError, match=r"model 'b': accuracies must be fractions in \[0, 1\]"):
        rank_cell("cell", {"a": torch.rand(4), "b": torch.tensor([60.0, 70, 80, 90])})


def _cells(count: int, extra_in: int = 0, seed: int = 0):
    """`count` cells of four models (a tie in the first), a fifth model in the first
    `extra_in`; the raw accuracies with the rankings."""
    rng = np.random.default_rng(seed)
    raw, rankings = [], []
    for c in range(count):
        levels = {"p": 0.7, "q": 0.68, "r": 0.66, "s": 0.55}
        if c < extra_in:
            levels["extra"] = 0.9  # first wherever it is: it must not shift the others' ranks
        values = _cell(rng, levels, 40)
        if c == 0:
            values["r"] = values["q"].copy()
        raw.append(values)
        rankings.append(rank_cell(f"cell {c}", _tensors(values), resamples=20))
    return raw, rankings


def test_across_cells_against_scipy():
    raw, rankings = _cells(CD_MIN_CELLS, extra_in=3)
    summary = across_cells(rankings)
    models = ["p", "q", "r", "s"]
    ranks = np.array([stats.rankdata([-v[m].mean() for m in models]) for v in raw])
    want = dict(zip(models, ranks.mean(axis=0), strict=True))
    assert summary.cells == CD_MIN_CELLS
    assert summary.mean_ranks == pytest.approx(want)
    assert summary.models == sorted(models, key=lambda m: (want[m], m))
    table = [[100 * v[m].mean() for v in raw] for m in models]
    assert summary.friedman_p == pytest.approx(stats.friedmanchisquare(*table).pvalue, rel=1e-9)
    # Demšar's table: q_0.05 = 2.569 for k = 4; CD = 2.569 * sqrt(4 * 5 / (6 * 10)) ≈ 1.483
    assert summary.critical_difference == pytest.approx(2.569 * math.sqrt(20 / 60), rel=1e-3)
    assert summary.critical_difference == pytest.approx(1.483, abs=1e-3)
    assert "1 model missing from some cells" in summary.note
    assert "Friedman p" in summary.note


def test_too_few_cells_give_no_diagram():
    _, rankings = _cells(4)
    summary = across_cells(rankings)
    assert summary.friedman_p is None and summary.critical_difference is None
    assert (
        summary.note == "4 cells: too few for a critical-difference diagram (it needs at least 10)"
    )
    assert summary.cells == 4 and len(summary.models) == 4
    with pytest.raises(ValueError, match="no critical difference to draw: 4 cells"):
        plot_critical_difference(summary, "unused.png")
    with pytest.raises(ValueError, match="at least one cell"):
        across_cells([])


def _is_png(path) -> bool:
    return path.stat().st_size > 0 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_write_images(tmp_path):
    _, rankings = _cells(CD_MIN_CELLS, extra_in=2)
    plot_differences(rankings[:4], tmp_path / "differences.png")
    assert _is_png(tmp_path / "differences.png")
    plot_critical_difference(across_cells(rankings), tmp_path / "cd.png")
    assert _is_png(tmp_path / "cd.png")
