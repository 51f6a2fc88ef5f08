"""``plot_training``: the four panels of ``training.png``; a run without hindsight says so in its panel."""

from __future__ import annotations

from pathlib import Path

import matplotlib.figure
import pytest

from foxhunt.evaluation.plots import plot_training


@pytest.fixture(scope="module")
def diagnostics(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from foxhunt.runs import train
    from tests.foxhunt._small_runs import small_config

    run = train(small_config(tmp_path_factory.mktemp("plot") / "run", steps=300, checkpoint_every=0))
    return run / "diagnostics.jsonl"


def _drawn(monkeypatch: pytest.MonkeyPatch, diagnostics: Path, out: Path, **kwargs: bool) -> list:
    figures = []
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: (figures.append(fig), save(fig, *a, **k))[1])
    assert plot_training(diagnostics, out, **kwargs) == out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return figures[0].axes


def test_hindsight_panel_draws_the_counts_when_on(monkeypatch: pytest.MonkeyPatch, diagnostics: Path,
                                                  tmp_path: Path) -> None:
    axes = _drawn(monkeypatch, diagnostics, tmp_path / "training.png")
    assert [line.get_label() for line in axes[2].lines] == ["backward", "forward", "relabel"]


def test_every_panel_labels_both_axes(monkeypatch: pytest.MonkeyPatch, diagnostics: Path,
                                      tmp_path: Path) -> None:
    for axis in _drawn(monkeypatch, diagnostics, tmp_path / "training.png"):
        assert axis.get_xlabel() == "env steps" and axis.get_ylabel(), axis.get_title()


def test_hindsight_panel_says_off_when_off(monkeypatch: pytest.MonkeyPatch, diagnostics: Path,
                                           tmp_path: Path) -> None:
    axes = _drawn(monkeypatch, diagnostics, tmp_path / "training.png", hindsight=False)
    assert not axes[2].lines
    assert any("hindsight replay off" in text.get_text() for text in axes[2].texts)
    assert axes[0].lines and axes[1].lines  # the other panels are drawn as before


def test_train_tells_the_plot_whether_hindsight_was_on(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    import foxhunt.evaluation.plots as plots
    from foxhunt.runs import train
    from tests.foxhunt._small_runs import small_config

    seen: list[bool] = []
    original = plots.plot_training

    def spy(diagnostics_path: Path, out_path: Path, hindsight: bool = True) -> Path:
        seen.append(hindsight)
        return original(diagnostics_path, out_path, hindsight=hindsight)

    monkeypatch.setattr(plots, "plot_training", spy)
    train(small_config(tmp_path / "joint", steps=300, checkpoint_every=0, action_face="joint"))
    train(small_config(tmp_path / "branched", steps=300, checkpoint_every=0, action_face="branched"))
    assert seen == [False, True]  # the joint face runs without hindsight, the branched one with it
