"""Run curves: reading metrics.jsonl (resumes, splits, junk values, torn and broken lines) and the
PNG plot_run writes (valid, sized by its panels, atomic, matplotlib loaded only when drawing)."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from bertforge.train.plot import _panels, ema, plot_run, read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(run_dir: Path, lines: list[dict | str], tail: bytes = b"") -> Path:
    """``run_dir/metrics.jsonl`` from dicts (as JSON) or raw strings, one a line, then ``tail`` bytes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    text = "".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines)
    path = run_dir / "metrics.jsonl"
    path.write_bytes(text.encode() + tail)
    return path


def _pretraining_lines(steps: range, seed: int) -> list[dict]:
    """Noisy falling losses every step, an eval line every 50 steps, warmup + linear decay lr."""
    rng = random.Random(seed)
    lines: list[dict] = []
    for step in steps:
        mlm, nsp = 8 * math.exp(-step / 150) + 2 + rng.gauss(0, 0.3), 0.7 * math.exp(-step / 80) + rng.gauss(0, 0.05)
        lines.append({"split": "train", "step": step, "time": step * 0.1, "loss": mlm + nsp, "mlm_loss": mlm,
                      "nsp_loss": nsp, "mlm_accuracy": min(1.0, step / 400 + rng.gauss(0, 0.02)),
                      "lr": 1e-4 * min(step / 30, (400 - step) / 370), "grad_norm": 1.0,
                      "tokens_per_s": 50_000 + rng.gauss(0, 2000)})
        if step % 50 == 0:
            lines.append({"split": "eval", "step": step, "time": step * 0.1, "loss": mlm + nsp - 0.2,
                          "mlm_accuracy": step / 450, "nsp_accuracy": 0.5 + step / 1000})
    return lines


def _png_shape(path: Path) -> tuple[int, ...]:
    """(height, width, channels) of a PNG, after checking its signature."""
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_MAGIC
    return matplotlib.image.imread(path).shape


# read_metrics


def test_read_metrics_sorts_separates_splits_keeps_later_line_and_numbers_only(tmp_path):
    path = _write_run(tmp_path, [
        {"split": "train", "step": 2, "time": 2.0, "loss": 5.0},
        {"split": "train", "step": 1, "time": 1.0, "loss": 6.0, "lr": 1e-4},
        {"split": "eval", "step": 2, "loss": 4.5, "accuracy": 0.25},
        {"split": "train", "step": 3, "time": 3.0, "loss": 4.0},
        # a resumed run rewrites step 2: its line wins whole (no "time" carried over from the first)
        {"split": "train", "step": 2, "loss": 3.0, "note": "resumed", "flag": True, "none": None,
         "nan": float("nan"), "text_number": "1.5", "nested": {"a": 1}, "list": [1]},
        {"split": "dev", "step": 2.0, "f1": 0.5, "matthews": -0.1},
    ])
    records = read_metrics(path)
    assert records == {
        "train": [{"step": 1, "time": 1.0, "loss": 6.0, "lr": 1e-4},
                  {"step": 2, "loss": 3.0},
                  {"step": 3, "time": 3.0, "loss": 4.0}],
        "eval": [{"step": 2, "loss": 4.5, "accuracy": 0.25}],
        "dev": [{"step": 2, "f1": 0.5, "matthews": -0.1}],
    }
    assert all(type(r["step"]) is int for split in records.values() for r in split)
    assert read_metrics(tmp_path) == records  # a run folder is read through its metrics.jsonl


def test_read_metrics_resumed_run_curve_is_the_resumed_one(tmp_path):
    first, resumed = _pretraining_lines(range(1, 201), seed=1), _pretraining_lines(range(151, 301), seed=2)
    records = read_metrics(_write_run(tmp_path, first + resumed))
    assert [r["step"] for r in records["train"]] == list(range(1, 301))
    assert [r["step"] for r in records["eval"]] == [50, 100, 150, 200, 250, 300]
    drawn = {r["step"]: r["loss"] for r in records["train"]}
    first_loss, resumed_loss = ({x["step"]: x["loss"] for x in run if x["split"] == "train"}
                                for run in (first, resumed))
    assert all(drawn[s] == first_loss[s] for s in range(1, 151))  # up to the resume point: the first run's
    assert all(drawn[s] == resumed_loss[s] for s in range(151, 301))
    assert first_loss[160] != resumed_loss[160]
    resumed_eval_200 = next(x for x in resumed if x["split"] == "eval" and x["step"] == 200)
    assert records["eval"][3] == {k: v for k, v in resumed_eval_200.items() if k != "split"}


@pytest.mark.parametrize("tail", [b'{"split": "train", "step": 4, "lo', b'{"split": "\xc3', b"12"],
                         ids=["cut-json", "cut-utf8", "cut-number"])
def test_read_metrics_skips_a_truncated_last_line_with_a_warning(tmp_path, tail):
    lines = [{"split": "train", "step": s, "loss": 10.0 - s} for s in (1, 2, 3)]
    path = _write_run(tmp_path, lines, tail=tail)
    with pytest.warns(RuntimeWarning, match=re.escape(f"{path}:4") + ".*truncated"):
        records = read_metrics(path)
    assert records == {"train": [{"step": s, "loss": 10.0 - s} for s in (1, 2, 3)]}


def test_read_metrics_blank_lines_are_not_a_truncated_line(tmp_path):
    path = _write_run(tmp_path, [{"split": "train", "step": 1, "loss": 1.0}, "", "  "])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        assert read_metrics(path) == {"train": [{"step": 1, "loss": 1.0}]}


@pytest.mark.parametrize("bad, message", [
    ('{"split": "train", "step": 2, "lo', "unreadable"),
    ("[1, 2]", "unreadable"),
    ('{"step": 2, "loss": 1.0}', "'split'"),
    ('{"split": "train", "loss": 1.0}', "'step'"),
    ('{"split": "train", "step": 2.5}', "'step'"),
    ('{"split": "train", "step": "2"}', "'step'"),
])
def test_read_metrics_broken_middle_line_is_an_error_naming_file_and_line(tmp_path, bad, message):
    path = _write_run(tmp_path, [{"split": "train", "step": 1, "loss": 2.0}, "", bad,
                                 {"split": "train", "step": 3, "loss": 1.0}])
    with pytest.raises(ValueError, match=re.escape(f"{path}:3:") + ".*" + re.escape(message)):
        read_metrics(path)


def test_read_metrics_a_complete_last_line_without_step_is_an_error_not_a_truncation(tmp_path):
    path = _write_run(tmp_path, [{"split": "train", "step": 1, "loss": 2.0}, {"split": "train", "loss": 1.0}])
    with pytest.raises(ValueError, match=re.escape(f"{path}:2:")):
        read_metrics(path)


# smoothing and panel choice


def test_ema_is_bias_corrected_and_smooths():
    assert ema([3.0, 1.0, 2.0], span=1) == [3.0, 1.0, 2.0]
    s = ema([0.0, 10.0], span=2)  # weight 0.5: x0 weighted 0.25, x1 0.5, normalised by 0.75
    assert s[0] == 0.0 and s[1] == pytest.approx(10 * 0.5 / 0.75)
    assert ema([4.0] * 50, span=10) == pytest.approx([4.0] * 50)  # no pull toward 0 at the start
    zigzag = ema([0.0, 1.0] * 100, span=20)
    assert max(zigzag[100:]) - min(zigzag[100:]) < 0.06 and sum(zigzag[100:]) / 100 == pytest.approx(0.5, abs=0.03)


def test_panels_group_keys_by_family_and_leave_out_the_rest(tmp_path):
    records = read_metrics(_write_run(tmp_path, [
        {"split": "train", "step": 1, "time": 0.5, "loss": 1.0, "grad_norm": 2.0, "lr": 1e-5, "custom": 3.0},
        {"split": "eval", "step": 1, "loss": 0.9, "accuracy": 0.7, "f1": 0.6, "matthews": 0.3, "pearson": 0.8,
         "spearman": 0.8, "exact_match": 55.0, "nsp_accuracy": 0.9},
    ]))
    assert _panels(records) == [
        ("loss", ["loss"], True),
        ("accuracy / score", ["accuracy", "exact_match", "f1", "matthews", "nsp_accuracy", "pearson", "spearman"],
         True),
        ("learning rate", ["lr"], False),
    ]


# plot_run


def test_plot_run_pretraining_writes_a_png_with_all_four_panels(tmp_path):
    run = tmp_path / "bert-mini-pretrain"
    _write_run(run, _pretraining_lines(range(1, 201), seed=1) + _pretraining_lines(range(151, 401), seed=2))
    path = plot_run(run)
    assert path == run / "curves.png"
    assert _png_shape(path) == (800, 1300, 4)  # 2 x 2 panels of 6.5 x 4 inches at 100 dpi
    assert sorted(p.name for p in run.iterdir()) == ["curves.png", "metrics.jsonl"]  # no temporary left
    assert [title for title, _, _ in _panels(read_metrics(run))] == ["loss", "accuracy / score", "learning rate",
                                                                      "tokens / s"]


def test_plot_run_train_lines_only_and_custom_out(tmp_path):
    run = tmp_path / "run"
    _write_run(run, [{"split": "train", "step": s, "loss": 5.0 / s} for s in range(1, 100)])
    out = tmp_path / "figures" / "run.png"
    assert plot_run(run, out=str(out)) == out
    assert _png_shape(out) == (400, 650, 4)  # one panel
    assert not (run / "curves.png").exists()
    out.write_bytes(b"stale")
    plot_run(run, out=out)  # an existing file is replaced
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_plot_run_fine_tuning_metrics(tmp_path):
    run = tmp_path / "glue-mrpc"
    lines: list[dict | str] = []
    for step in range(1, 301):
        lines.append({"split": "train", "step": step, "loss": 0.7 * math.exp(-step / 100),
                      "lr": 2e-5 * (1 - step / 300)})
        if step % 100 == 0:
            lines.append({"split": "dev", "step": step, "loss": 0.5, "accuracy": 0.7 + step / 2000,
                          "f1": 0.8 + step / 3000})
    _write_run(run, lines)
    assert [t for t, _, _ in _panels(read_metrics(run))] == ["loss", "accuracy / score", "learning rate"]
    assert _png_shape(plot_run(run)) == (800, 1300, 4)


def test_plot_run_without_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path)) + ".*no metrics.jsonl"):
        plot_run(tmp_path)
    _write_run(tmp_path, [{"split": "train", "step": 1, "time": 0.1, "grad_norm": 1.0}])
    with pytest.raises(ValueError, match="no metrics to plot"):
        plot_run(tmp_path)
    assert not (tmp_path / "curves.png").exists()


def test_import_is_cheap_and_plotting_leaves_pyplot_alone(tmp_path):
    _write_run(tmp_path, [{"split": "train", "step": s, "loss": 1.0 / s} for s in range(1, 10)])
    code = (
        "import sys\n"
        "import bertforge.train.plot\n"
        "assert 'matplotlib' not in sys.modules, 'import bertforge.train.plot loaded matplotlib'\n"
        f"bertforge.train.plot.plot_run({str(tmp_path)!r})\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'plot_run loaded pyplot'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "curves.png").read_bytes()[:8] == PNG_MAGIC

