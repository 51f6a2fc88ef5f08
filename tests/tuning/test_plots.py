"""The study's plots and progress bar: axes named with the metric, no importance ranking from a handful of
trials, a bar that ends at the budget."""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
import pytest

from tuning.study import MIN_IMPORTANCE_TRIALS, StudySettings, optimize, write_plots


def _study(trials: int) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("metric", "sharpe")
    distributions = {"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
                     "width": optuna.distributions.CategoricalDistribution([8, 16])}
    for k in range(trials):
        params = {"lr": 1e-4 * (1.5 ** k), "width": (8, 16)[k % 2]}
        study.add_trial(optuna.trial.create_trial(value=float(k % 5) + 0.1 * k, params=params,
                                                  distributions=distributions))
    return study


def test_plots_name_the_metric_and_rank_importances_from_enough_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.figure

    labels: list[str] = []
    save = matplotlib.figure.Figure.savefig

    def record(figure: matplotlib.figure.Figure, *args: object, **kwargs: object) -> None:
        for ax in figure.axes:
            labels.extend((ax.get_xlabel(), ax.get_ylabel(), ax.get_title()))
        labels.extend(text.get_text() for ax in figure.axes for text in ax.texts)
        save(figure, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    written = write_plots(_study(MIN_IMPORTANCE_TRIALS), tmp_path)
    assert sorted(p.name for p in written) == ["optimization_history.png", "parallel_coordinate.png",
                                               "param_importances.png"]
    assert any("sharpe" in label for label in labels), labels
    assert not any("Objective Value" in label for label in labels), labels


def test_importances_are_not_drawn_from_fewer_trials(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written = write_plots(_study(MIN_IMPORTANCE_TRIALS - 1), tmp_path)
    assert "param_importances.png" not in {p.name for p in written}
    assert not (tmp_path / "param_importances.png").exists()
    assert any(f"need at least {MIN_IMPORTANCE_TRIALS}" in str(w.message) for w in caught)


class _Quick:
    storage_error = None

    def __call__(self, trial: optuna.Trial) -> float:
        return trial.suggest_float("x", 0.0, 1.0)


@pytest.mark.parametrize(("n_trials", "timeout", "end"), [(3, None, "3/3"), (None, 1.0, "1/1 s")])
def test_the_progress_bar_ends_at_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], n_trials: int | None, timeout: float | None, end: str
) -> None:
    """Over trials when their number is given, else over the timeout's seconds (never past either)."""
    study = optuna.create_study(direction="maximize")
    settings = StudySettings(out=tmp_path, n_trials=n_trials, timeout=timeout)
    optimize(study, _Quick(), settings)
    err = capsys.readouterr().err
    assert end in err, err[-300:]
    if n_trials is not None:
        assert f"{n_trials + 1}/{n_trials}" not in err
