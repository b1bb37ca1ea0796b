"""`bertforge ablate`: study files (checked, each error naming the file and field), the runner (shared
pre-trainings, one folder per cell, skip / resume / refuse on rerun, Figure 5 from checkpoints) and
the report in the paper's layout. The end-to-end study is a toy: generated text, a 1-layer model and
a few steps, so that it checks the plumbing, not the science."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import shutil
import types
from pathlib import Path

import pytest
import yaml
from data_fixtures import documents, sentence, write_text, write_tokenizer
from finetune_fixtures import root  # noqa: F401 - a fixture
from pretrain_fixtures import no_plots, one_thread  # noqa: F401 - autouse fixtures: tiny models, no curves.png

from bertforge.cli import main
from bertforge.data import prepare as prepare_module
from bertforge.experiments import runner
from bertforge.experiments.runner import AblateConfig, read_cells, run_study
from bertforge.experiments.study import StudyError, bundled_studies, load_study
from bertforge.tasks import finetune as finetune_module
from bertforge.text import vocab as vocab_module
from bertforge.train import pretrain as pretrain_module

TINY = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


def _files(root: Path) -> dict[str, Path]:
    """A corpus, a vocab, a classification task (JSONL) and a tagging task (CoNLL) of generated text."""
    rng = random.Random(0)
    files = {"vocab": write_tokenizer(root / "vocab"),
             "corpus": write_text(root / "corpus.txt", documents(1, 30, 3, 8))}
    for split, n in (("train", 48), ("dev", 16)):
        rows = []
        for _ in range(n):
            label = rng.randint(0, 1)
            rows.append(json.dumps({"text": f"{['bad', 'good'][label]} {sentence(rng, 3, 6)}", "label": label}))
        files[f"cls_{split}"] = root / f"cls.{split}.jsonl"
        files[f"cls_{split}"].write_text("\n".join(rows) + "\n", encoding="utf-8")
        sents = []
        for _ in range(n):
            words = sentence(rng, 3, 6).rstrip(".!?").split()
            sents.append("\n".join(f"{w} {'N' if i % 2 else 'V'}" for i, w in enumerate(words)))
        files[f"tag_{split}"] = root / f"tag.{split}.txt"
        files[f"tag_{split}"].write_text("\n\n".join(sents) + "\n", encoding="utf-8")
    return files


def _study(root: Path, files: dict[str, Path], **changes) -> Path:
    study = {
        "name": "toy", "title": "A toy ablation", "seeds": [0, 1],
        "pretraining": {"corpus": str(files["corpus"]), "vocab": str(files["vocab"]),
                        "prepare": {"max_seq_length": 32, "max_predictions_per_seq": 5, "dupe_factor": 2,
                                    "shard_chars": 100_000},
                        "pretrain": {"model": TINY, "max_steps": 4, "batch_size": 8, "lr": 1e-3, "warmup_steps": 1}},
        "finetune": {"epochs": 1, "lr": 1e-3, "batch_size": 16, "max_seq_length": 32},
        "tasks": [{"name": "CLS", "task": "classification", "train_file": str(files["cls_train"]),
                   "dev_file": str(files["cls_dev"]), "text_column": "text", "label_column": "label"},
                  {"name": "TAG", "task": "tagging", "train_file": str(files["tag_train"]),
                   "dev_file": str(files["tag_dev"])},
                  {"name": "TAG features", "task": "tagging", "train_file": str(files["tag_train"]),
                   "dev_file": str(files["tag_dev"]), "features": "weighted-sum-all", "bilstm_size": 8}],
        "variants": [{"name": "BERT", "pretrain": {"objective": "mlm+nsp"}},
                     {"name": "No NSP", "pretrain": {"objective": "mlm"}},
                     {"name": "LTR & No NSP", "pretrain": {"objective": "ltr"}, "tasks": ["CLS"]},
                     {"name": "+ BiLSTM", "pretrain": {"objective": "ltr"}, "finetune": {"bilstm": True},
                      "tasks": ["CLS"]},
                     {"name": "100/0/0", "prepare": {"mask_token_prob": 1.0, "random_token_prob": 0.0},
                      "tasks": ["TAG features"]}],
        "figure": {"task": "CLS", "variants": ["BERT", "LTR & No NSP"], "every": 2},
    }
    study.update(changes)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "toy.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def toy(root):  # noqa: F811 - the fixture imported above
    files = _files(root)
    path = _study(root, files)
    out = root / "out"
    report = run_study(path, AblateConfig(out=str(out), precision="fp32", device="cpu", workers=1))
    return path, out, report, files


def test_toy_study_fills_every_cell_and_shares_pretraining(toy):
    path, out, report, _ = toy
    study = load_study(path)
    cells, figure = read_cells(out)
    assert sorted((c.variant, c.task, c.seed) for c in cells) == sorted(
        (v.name, t.name, s) for v, t in study.cells() for s in study.seeds)
    # "+ BiLSTM" trains exactly what "LTR & No NSP" does: one pre-training for the two
    assert sorted(p.name for p in (out / "pretrain").iterdir()) == ["100-0-0", "bert", "ltr-no-nsp", "no-nsp"]
    # BERT, No NSP and LTR read the same shards; 100/0/0 its own
    assert len(list((out / "prepared").iterdir())) == 2
    done = {p.name: json.loads((out / "pretrain" / p.name / "done.json").read_text())
            for p in (out / "pretrain").iterdir()}
    assert {k: v["objective"] for k, v in done.items()} == {
        "bert": "mlm+nsp", "no-nsp": "mlm", "ltr-no-nsp": "ltr", "100-0-0": "mlm+nsp"}
    assert all(v["steps"] == 4 for v in done.values())
    for c in cells:
        assert 0.0 <= c.value <= 1.0 and c.metric == "accuracy"
        cell_dir = out / "cells" / runner.slug(c.variant) / runner.slug(c.task) / f"seed-{c.seed}"
        assert (cell_dir / "metrics.jsonl").is_file()
        assert not (cell_dir / "model").exists()  # weights removed, scores kept (keep_models: false)
    # the BiLSTM row's model is a BiLSTM tagger / classifier, the feature-based column's too
    bilstm = json.loads((out / "cells/bilstm/cls/seed-0/run_config.json").read_text())
    assert bilstm["bilstm"] is True
    features = json.loads((out / "cells/bert/tag-features/seed-0/run_config.json").read_text())
    assert features["features"] == "weighted-sum-all"
    # Figure 5: the figure's variants fine-tuned from each kept checkpoint (steps 2 and 4), every seed
    assert sorted((c.variant, c.pretrain_step, c.seed) for c in figure) == sorted(
        (v, step, s) for v in ("BERT", "LTR & No NSP") for step in (2, 4) for s in (0, 1))


def test_report_is_the_papers_layout_with_the_measured_cells(toy):
    path, out, report, _ = toy
    text = report.read_text()
    cells, _ = read_cells(out)
    data = json.loads((out / "report.json").read_text())
    assert "|  | CLS (accuracy) | TAG (accuracy) | TAG features (accuracy) |" in text
    scores = text.split("![scores]")[0]  # the first table: the scores
    rows = {line.split(" | ")[0].lstrip("| "): line for line in scores.splitlines() if line.startswith("| ")}
    for variant in ("BERT", "No NSP", "LTR & No NSP", "+ BiLSTM", "100/0/0"):
        assert variant in rows
    values = sorted(c.value for c in cells if c.variant == "BERT" and c.task == "CLS")
    mean = sum(values) / len(values)
    assert data["table"]["BERT"]["CLS"]["mean"] == pytest.approx(mean)
    assert rows["BERT"].split(" | ")[1].startswith(f"{100 * mean:.1f}")
    assert rows["+ BiLSTM"].count("—") == 2  # its two left-out columns
    # each row against BERT, seed by seed
    assert "Difference from BERT, paired by seed" in text
    assert data["differences"]["baseline"] == "BERT" and "BERT" not in data["differences"]["table"]
    score = {(c.variant, c.task, c.seed): c.value for c in cells}
    got = data["differences"]["table"]["No NSP"]["TAG"]
    assert got["seeds"] == [0, 1]
    assert got["differences"] == pytest.approx([score["No NSP", "TAG", s] - score["BERT", "TAG", s] for s in (0, 1)])
    assert set(data["differences"]["table"]["100/0/0"]) == {"TAG features"}
    assert data["machine"]["cpu"] and "cores" in text
    assert (out / "scores.png").stat().st_size > 0 and (out / "figure.png").stat().st_size > 0


def test_rerun_skips_finished_cells_and_resumes_an_interrupted_one(toy, monkeypatch):
    path, out, _, _ = toy
    cell = out / "cells/no-nsp/tag/seed-1"
    before = json.loads((cell / "cell.json").read_text())
    (cell / "cell.json").unlink()  # as if the run had been stopped after its last checkpoint
    calls = []
    real = finetune_module.finetune

    def spy(cfg, data=None):
        calls.append((cfg.out, cfg.resume))
        return real(cfg, data)

    monkeypatch.setattr(finetune_module, "finetune", spy)
    monkeypatch.setattr(pretrain_module, "pretrain", lambda cfg: pytest.fail("a finished pre-training ran again"))
    run_study(None, AblateConfig(out=str(out), precision="fp32", device="cpu"))  # the folder alone: its study
    assert [Path(c[0]) for c in calls] == [cell]
    again = json.loads((cell / "cell.json").read_text())
    assert again["value"] == pytest.approx(before["value"], abs=1e-6)
    assert json.loads((out / "study_source.json").read_text()) == {"study": str(Path(path).resolve())}
    with pytest.raises(ValueError, match="no study_source.json .*; give the study file"):
        run_study(None, AblateConfig(out=str(out / "cells"), precision="fp32", device="cpu"))


def test_an_interrupted_cell_resumes_from_its_checkpoint(toy, monkeypatch):
    import dataclasses

    path, out, _, _ = toy
    cell = out / "cells/bert/cls/seed-0"
    shutil.rmtree(cell)
    real = finetune_module.finetune
    seen = []

    def interrupted(cfg, data=None):  # 2 steps, a checkpoint, then Ctrl-C
        real(dataclasses.replace(cfg, max_steps=2, checkpoint_every=1), data)
        raise KeyboardInterrupt("stopped")

    monkeypatch.setattr(finetune_module, "finetune", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_study(path, AblateConfig(out=str(out), precision="fp32", device="cpu"))
    assert not (cell / "cell.json").exists() and (cell / "checkpoints/step-00000002").is_dir()

    def spy(cfg, data=None):
        seen.append(cfg.resume)
        return real(cfg, data)

    monkeypatch.setattr(finetune_module, "finetune", spy)
    run_study(path, AblateConfig(out=str(out), precision="fp32", device="cpu"))
    assert seen == [True]
    steps = [json.loads(line)["step"] for line in (cell / "metrics.jsonl").read_text().splitlines()]
    assert steps[0] <= 2 and steps[-1] == json.loads((cell / "cell.json").read_text())["steps"] == 3


def test_a_folder_made_with_other_settings_is_refused(toy, root):  # noqa: F811
    path, out, _, files = toy
    changed = _study(root / "changed", files, seeds=[0])
    data = yaml.safe_load(changed.read_text())
    data["finetune"]["lr"] = 5e-4
    changed.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(StudyError, match=r"cells/bert/cls/seed-0 holds a fine-tuning made with other settings "
                                         r"\(finetune\.lr: [0-9.e-]+ -> 0\.0005\)"):  # names what changed
        run_study(changed, AblateConfig(out=str(out), precision="fp32", device="cpu"))


def test_report_only_reads_the_finished_cells(toy, tmp_path):
    path, out, _, _ = toy
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "report.md").unlink()
    run_study(path, AblateConfig(out=str(copy), report_only=True))
    assert (copy / "report.md").read_text().splitlines()[:1] == ["# A toy ablation"]


@pytest.mark.parametrize("change, message", [
    ({"seeds": []}, r"toy.yaml: seeds: expected a non-empty list"),
    ({"colour": 1}, r"toy.yaml: top level: unknown key 'colour'"),
    ({"finetune": {"lrr": 1}}, r"toy.yaml: finetune: unknown key 'lrr'"),
    ({"variants": [{"name": "A", "pretrain": {"objectiv": "mlm"}}]}, r"variants\[0\] \(A\)\.pretrain: unknown key"),
    ({"variants": [{"name": "A", "tasks": ["NOPE"]}]}, r"variants\[0\] \(A\)\.tasks: expected a list of the study"),
    ({"variants": [{"name": "A"}, {"name": "A"}]}, r"variants: 'A' appears twice"),
    ({"tasks": [{"name": "T", "source": "movie-reviews", "train_file": "x"}]}, r"tasks\[0\] \(T\): give either"),
    ({"tasks": [{"name": "T", "task": "classification"}]}, r"tasks\[0\] \(T\): needs train_file"),
    ({"tasks": [{"name": "T", "source": "imdb"}]}, r"tasks\[0\] \(T\)\.source: unknown built-in data 'imdb'"),
    ({"figure": {"task": "CLS", "variants": ["C"], "every": 2},
      "variants": [{"name": "C", "checkpoint": "x"}]}, r"figure.variants: 'C' is not a pre-trained variant"),
    ({"pretraining": {"pretrain": {"model": {"hidden_size": 30, "num_attention_heads": 4}}}},
     r"pretraining.pretrain.model: .*hidden_size"),
    ({"pretraining": {"pretrain": {"out": "x"}}}, r"pretraining.pretrain.out: set by the runner, not the study"),
    ({"pretraining": {"pretrain": {"recipe": "fast"}}}, r"pretraining.pretrain.recipe: expected one of 'paper', 'budget'"),
    ({"variants": [{"name": "A", "pretrain": {"recipe": "fast"}}]}, r"variants\[0\] \(A\)\.pretrain.recipe: expected"),
])
def test_bad_study_files_name_the_file_and_field(tmp_path, change, message):
    files = {k: tmp_path / k for k in ("vocab", "corpus", "cls_train", "cls_dev", "tag_train", "tag_dev")}
    path = _study(tmp_path, files, **change)
    with pytest.raises(StudyError, match=message):
        load_study(path)


def test_cli_lists_the_bundled_studies_and_reports_bad_files(tmp_path, capsys):
    assert main(["ablate", "--list"]) == 0
    listed = capsys.readouterr().out
    for name in ("table5", "table6", "table7", "table8", "table5-mini", "table6-mini", "table7-mini", "table8-mini"):
        assert name in listed
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: [\n", encoding="utf-8")
    assert main(["ablate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"bertforge ablate: error: {bad}, line 2, column 1: not valid YAML (expected the node content, but " \
                  "found '<stream end>')\n"  # one line, where the file goes wrong
    assert main(["ablate", "no-such-study"]) == 2
    assert "not a bundled study" in capsys.readouterr().err


def test_bundled_studies_load_and_the_miniatures_need_no_user_files():
    studies = {name: load_study(path) for name, path in bundled_studies().items()}
    assert set(studies) >= {"table5", "table6", "table7", "table8", "table5-mini", "table6-mini", "table7-mini",
                            "table8-mini"}
    for name, s in studies.items():
        assert s.paper or name.endswith("-mini"), name
        if name.endswith("-mini"):
            assert all(t.source for t in s.tasks) and s.pretraining.corpus == "wikipedia-leads", name
    masks = {v.name: (v.prepare["mask_token_prob"], v.prepare["random_token_prob"])
             for v in studies["table8"].variants}
    assert masks == {"80/10/10": (0.8, 0.1), "100/0/0": (1.0, 0.0), "80/0/20": (0.8, 0.2), "80/20/0": (0.8, 0.0),
                     "0/20/80": (0.0, 0.8), "0/0/100": (0.0, 1.0)}
    assert [v.pretrain.get("objective") for v in studies["table5"].variants] == ["mlm+nsp", "mlm", "ltr", "ltr"]


@pytest.mark.real_data
def test_a_miniature_runs_on_the_built_in_data(tmp_path):
    """table8-mini's rows and columns, cut to a few steps and examples: the built-in text, vocab and
    task files through the runner, every row with its own masks."""
    import dataclasses

    study = load_study("table8-mini")
    pre = dataclasses.replace(study.pretraining, max_documents=300, vocab_size=2000,
                              pretrain={**study.pretraining.pretrain, "max_steps": 3, "batch_size": 8},
                              prepare={**study.pretraining.prepare, "dupe_factor": 1})
    tasks = tuple(dataclasses.replace(t, max_train=48, max_dev=24, settings={**t.settings, "epochs": 1,
                                                                            "bilstm_size": 8})
                  for t in study.tasks)
    small = dataclasses.replace(study, pretraining=pre, tasks=tasks, variants=study.variants[:2], seeds=(0,))
    report = run_study(small, AblateConfig(out=str(tmp_path), precision="fp32", device="cpu"))
    cells, _ = read_cells(tmp_path)
    assert sorted((c.variant, c.task) for c in cells) == sorted(
        (v.name, t.name) for v in small.variants for t in small.tasks)
    assert len(list((tmp_path / "prepared").iterdir())) == 2  # 80/10/10 and 100/0/0: their own shards
    done = json.loads((tmp_path / "pretrain/80-10-10/done.json").read_text())
    assert "mlm_accuracy" in done["eval_metrics"]  # held out: every 20th Wikipedia lead
    assert "| 100/0/0 |" in report.read_text()
    pytest.importorskip("sklearn_crfsuite")
    fitted = json.loads((tmp_path / "classic_baselines.json").read_text())  # fitted once, on the same files
    assert Path(fitted["MR fine-tune"]["settings"]["train_file"]).is_file()  # with the settings it read
    classic = {task: f["models"] for task, f in fitted.items()}
    assert {t: sorted(by) for t, by in classic.items()} == {
        "MR fine-tune": ["TF-IDF + logistic regression"], "POS fine-tune": ["CRF", "most frequent tag"],
        "POS feature-based": ["CRF", "most frequent tag"]}
    assert all(0 <= m["accuracy"] <= 1 for by in classic.values() for m in by.values())
    text = report.read_text()
    crf = 100 * classic["POS fine-tune"]["CRF"]["accuracy"]
    assert "What a practitioner would use without pre-training" in text and f"| CRF | — | {crf:.1f} | {crf:.1f} |" in text
    assert json.loads((tmp_path / "report.json").read_text())["classic_baselines"] == classic


# ---------------------------------------------------------------------------- the report's statistics
def _cells(scores: dict[tuple[str, str], dict[int, float]]) -> list[runner.Cell]:
    """Finished cells of the given scores ((row, task) -> seed -> score), last seed first, so that
    nothing can pair them by their order."""
    return [runner.Cell(variant=row, task=task, seed=seed, metric="accuracy", value=value, metrics={}, steps=1,
                        seconds=6.0)
            for (row, task), by_seed in scores.items() for seed, value in sorted(by_seed.items(), reverse=True)]


def test_the_report_gives_intervals_and_differences_paired_by_seed(tmp_path):
    """Each cell: the mean and its 95% Student t interval. Each later row against the first (BERT): the
    difference seed by seed, over the seeds both rows finished, resolved only where its interval
    excludes 0. The intervals were checked by hand: t(0.975, 2) = 4.3027, t(0.975, 1) = 12.706."""
    from scipy import stats

    from bertforge.experiments.report import write_report

    files = {k: tmp_path / k for k in ("vocab", "corpus", "cls_train", "cls_dev", "tag_train", "tag_dev")}
    study = load_study(_study(tmp_path, files, seeds=[0, 1, 2], figure=None))
    scores = {("BERT", "CLS"): {0: 0.60, 1: 0.70, 2: 0.80},
              ("No NSP", "CLS"): {0: 0.63, 1: 0.72, 2: 0.83},  # +3, +2, +3: within BERT's spread, yet resolved
              ("LTR & No NSP", "CLS"): {0: 0.65, 2: 0.79},  # seed 1 unfinished: +5, -1
              ("+ BiLSTM", "CLS"): {0: 0.58, 1: float("nan"), 2: 0.79},  # seed 1 gave no score: -2, -1
              ("BERT", "TAG"): {0: 0.50, 1: 0.55},  # BERT's seed 2 unfinished ...
              ("No NSP", "TAG"): {0: 0.52, 1: 0.56, 2: 0.95},  # ... so No NSP's counts not: +2, +1
              ("100/0/0", "TAG features"): {0: 0.4, 1: 0.5, 2: 0.6}}  # nothing of BERT's to pair with
    report = write_report(study, tmp_path / "out", _cells(scores), [], {})
    text = report.read_text()
    data = json.loads((tmp_path / "out" / "report.json").read_text())

    bert = data["table"]["BERT"]["CLS"]
    assert bert["mean"] == pytest.approx(0.7) and bert["sd"] == pytest.approx(0.1) and bert["n"] == 3
    assert bert["seeds"] == [0, 1, 2] and bert["values"] == [0.60, 0.70, 0.80]
    low, high = stats.ttest_1samp([0.60, 0.70, 0.80], 0.0).confidence_interval()
    assert (bert["interval"]["low"], bert["interval"]["high"]) == (pytest.approx(low, abs=1e-5),
                                                                   pytest.approx(high, abs=1e-5))
    assert bert["interval"] == {"mean": 0.7, "low": 0.45159, "high": 0.94841, "n": 3, "confidence": 0.95}
    assert data["table"]["+ BiLSTM"]["CLS"]["values"] == [0.58, None, 0.79]
    assert data["table"]["+ BiLSTM"]["CLS"]["interval"]["n"] == 2

    diff = data["differences"]
    assert diff["baseline"] == "BERT" and diff["paired_by"] == "seed"
    assert set(diff["table"]) == {"No NSP", "LTR & No NSP", "+ BiLSTM", "100/0/0"}
    no_nsp = diff["table"]["No NSP"]["CLS"]
    assert no_nsp["seeds"] == [0, 1, 2] and no_nsp["differences"] == pytest.approx([0.03, 0.02, 0.03])
    low, high = stats.ttest_rel([0.63, 0.72, 0.83], [0.60, 0.70, 0.80]).confidence_interval()
    assert no_nsp["interval"]["low"] == pytest.approx(low, abs=1e-5) == pytest.approx(0.01232, abs=1e-5)
    assert no_nsp["interval"]["high"] == pytest.approx(high, abs=1e-5) == pytest.approx(0.04101, abs=1e-5)
    assert no_nsp["resolved"] is True
    # unpaired, the two rows' intervals overlap: pairing is what resolves the difference
    assert data["table"]["No NSP"]["CLS"]["interval"]["low"] < bert["interval"]["high"]
    ltr = diff["table"]["LTR & No NSP"]["CLS"]
    assert ltr["seeds"] == [0, 2] and ltr["differences"] == pytest.approx([0.05, -0.01]) and not ltr["resolved"]
    assert diff["table"]["+ BiLSTM"]["CLS"]["seeds"] == [0, 2]
    tag = diff["table"]["No NSP"]["TAG"]
    assert tag["seeds"] == [0, 1] and tag["interval"]["mean"] == pytest.approx(0.015) and not tag["resolved"]
    nothing = diff["table"]["100/0/0"]["TAG features"]
    assert nothing["seeds"] == [] and nothing["interval"]["n"] == 0 and nothing["resolved"] is False

    scores_table, differences_table = text.split("Difference from BERT, paired by seed")
    assert "| BERT | 70.0 [45.2, 94.8] | 52.5 [20.7, 84.3] (n=2) | — |" in scores_table
    assert "| 100/0/0 | — | — | 50.0 [25.2, 74.8] |" in scores_table
    differences_table = differences_table.split("![scores]")[0]
    assert "| BERT |" not in differences_table
    assert ("| No NSP | +2.7 [+1.2, +4.1] resolved | +1.5 [-4.9, +7.9] (n=2) not resolved | — |"
            in differences_table)
    assert "| LTR & No NSP | +2.0 [-36.1, +40.1] (n=2) not resolved | — | — |" in differences_table
    assert "| + BiLSTM | -1.5 [-7.9, +4.9] (n=2) not resolved | — | — |" in differences_table
    assert "| 100/0/0 | — | — | — |" in differences_table


def test_the_papers_orderings_are_tested_on_every_task_both_rows_have(tmp_path):
    """"A > B": A minus B seed by seed; holds where the interval lies above 0, reversed where below."""
    from bertforge.experiments.report import write_report

    files = {k: tmp_path / k for k in ("vocab", "corpus", "cls_train", "cls_dev", "tag_train", "tag_dev")}
    study = load_study(_study(tmp_path, files, seeds=[0, 1, 2], figure=None,
                              orderings=["BERT > No NSP", "No NSP > LTR & No NSP", " BERT >  100/0/0 "]))
    assert study.orderings == (("BERT", "No NSP"), ("No NSP", "LTR & No NSP"), ("BERT", "100/0/0"))
    scores = {("BERT", "CLS"): {0: 0.60, 1: 0.70, 2: 0.80},
              ("No NSP", "CLS"): {0: 0.63, 1: 0.72, 2: 0.83},  # above BERT on every seed: reversed
              ("LTR & No NSP", "CLS"): {0: 0.50, 1: 0.61, 2: 0.70},  # below No NSP on every seed: holds
              ("BERT", "TAG"): {0: 0.50, 1: 0.55, 2: 0.60},
              ("No NSP", "TAG"): {0: 0.52, 1: 0.54, 2: 0.61}}  # BERT -2, +1, -1 below it: not resolved
    report = write_report(study, tmp_path / "out", _cells(scores), [], {})
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    got = {(e["above"], e["below"], e["task"]): e for e in data["orderings"]}
    assert set(got) == {("BERT", "No NSP", "CLS"), ("BERT", "No NSP", "TAG"), ("No NSP", "LTR & No NSP", "CLS"),
                        ("BERT", "No NSP", "TAG features"), ("BERT", "100/0/0", "TAG features")}  # the filled cells
    assert got["BERT", "100/0/0", "TAG features"]["seeds"] == [] and \
           got["BERT", "100/0/0", "TAG features"]["verdict"] == "not resolved"  # no scores yet
    assert got["BERT", "No NSP", "CLS"]["verdict"] == "reversed"
    assert got["BERT", "No NSP", "CLS"]["differences"] == pytest.approx([-0.03, -0.02, -0.03])
    assert got["BERT", "No NSP", "TAG"]["verdict"] == "not resolved"
    assert got["No NSP", "LTR & No NSP", "CLS"]["verdict"] == "holds"
    assert got["No NSP", "LTR & No NSP", "CLS"]["interval"]["mean"] == pytest.approx((0.13 + 0.11 + 0.13) / 3, abs=1e-5)
    text = report.read_text()
    assert "| BERT > No NSP | -2.7 [-4.1, -1.2] reversed | -0.7 [-4.5, +3.1] not resolved | — |" in text
    assert "| No NSP > LTR & No NSP | +12.3 [+9.5, +15.2] holds | — | — |" in text
    assert "| BERT > 100/0/0 | — | — | — |" in text  # no score to pair on the one task both rows have


@pytest.mark.parametrize("orderings, message", [
    ("BERT > No NSP", r"orderings: expected a list"),
    (["BERT >> No NSP"], r"orderings\[0\]: expected \"A > B\""),
    (["BERT > Nope"], r"orderings\[0\]: 'Nope' is not a variant of the study"),
    (["BERT > BERT"], r"orderings\[0\]: 'BERT > BERT' orders a row against itself"),
    ([3], r"orderings\[0\]: expected \"A > B\""),
])
def test_bad_orderings_name_the_file_and_field(tmp_path, orderings, message):
    files = {k: tmp_path / k for k in ("vocab", "corpus", "cls_train", "cls_dev", "tag_train", "tag_dev")}
    with pytest.raises(StudyError, match=message):
        load_study(_study(tmp_path, files, orderings=orderings))


# ---------------------------------------------------------------------------- checked before any work
@pytest.fixture
def no_work(monkeypatch):
    """Preparing data, learning a vocab, pre-training or fine-tuning fails the test: the study must
    have been refused before."""
    for module, name in ((prepare_module, "prepare"), (vocab_module, "learn_vocab"), (pretrain_module, "pretrain"),
                         (finetune_module, "finetune")):
        monkeypatch.setattr(module, name, lambda *args, _name=name, **kwargs: pytest.fail(f"{_name} ran"))


def _edited(root: Path, files: dict[str, Path], edit) -> Path:
    """The toy study with ``edit(data, files)`` applied to its settings (and files)."""
    path = _study(root, files)
    data = yaml.safe_load(path.read_text())
    edit(data, files)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _one_row(data, finetune=None, tasks=("TAG",)):
    data["variants"] = [{"name": "BERT", **({"finetune": finetune} if finetune else {}), "tasks": list(tasks)}]
    data["figure"] = None


def _bad_row(data, files):
    with files["cls_train"].open("a", encoding="utf-8") as f:
        f.write("{oops\n")


@pytest.mark.parametrize("edit, message", [
    (lambda d, f: d["pretraining"].update(corpus="nowhere.txt"),
     r"toy.yaml: pretraining.corpus: no such file: nowhere.txt"),
    (lambda d, f: d["tasks"][0].update(train_file="missing.jsonl"),
     r"toy.yaml: tasks\[0\] \(CLS\)\.train_file: no such file or folder: missing.jsonl$"),
    (lambda d, f: d.update(variants=[{"name": "C", "checkpoint": "no-model"}], figure=None),
     r"toy.yaml: variants\[0\] \(C\)\.checkpoint: no such checkpoint folder: no-model$"),
    (_bad_row, r"toy.yaml: tasks\[0\] \(CLS\): .*cls.train.jsonl:49: "),
    (lambda d, f: d["tasks"][1].update(metric="f1"),
     r"toy.yaml: tasks\[1\] \(TAG\)\.metric: 'f1' is not among the metrics TAG's dev files are scored with "
     r"\(accuracy\)$"),
    (lambda d, f: d["finetune"].update(batch_size=64, drop_last=True),
     r"toy.yaml: tasks\[0\] \(CLS\): 48 training sequences, fewer than one batch \(batch_size 64\)$"),
    (lambda d, f: d["finetune"].update(max_seq_length=128),
     r"toy.yaml: tasks\[0\] \(CLS\): max_seq_length 128 is longer than the 64 positions of BERT's model$"),
    (lambda d, f: d["pretraining"]["prepare"].update(max_seq_length=128),
     r"toy.yaml: variants\[\d\] \(.*\)\.pretrain: the data's sequences of 128 tokens \(prepare max_seq_length\) "
     r"are longer than the model's 64 positions"),
    (lambda d, f: _one_row(d, {"long_inputs": "truncate"}),
     r"toy.yaml: variants\[0\] \(BERT\)\.finetune \(with task TAG\): long_inputs='truncate' does not apply to "
     r"tagging"),
    (lambda d, f: _one_row(d, {"features": "-1,-3"}),
     r"toy.yaml: variants\[0\] \(BERT\)\.finetune \(with task TAG\): features='-1,-3': layer -3 does not exist"),
    (lambda d, f: d["pretraining"]["pretrain"].update(precision="fp16"),
     r"toy.yaml: pretraining.pretrain.precision: fp16 needs a CUDA device"),
])
def test_a_study_is_checked_whole_before_any_work(tmp_path, no_work, edit, message):
    path = _edited(tmp_path / "study", _files(tmp_path), edit)
    out = tmp_path / "out"
    with pytest.raises(StudyError, match=message):
        run_study(path, AblateConfig(out=str(out), precision="fp32", device="cpu"))
    assert not (out / "prepared").exists() and not (out / "pretrain").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA device")
def test_a_device_this_machine_lacks_is_refused_before_any_work(tmp_path, no_work, capsys):
    files = _files(tmp_path)
    path = _edited(tmp_path / "study", files, lambda d, f: d["finetune"].update(device="cuda"))
    with pytest.raises(StudyError, match=r"toy.yaml: tasks\[0\] \(CLS\)\.device: cuda: PyTorch sees no CUDA device"):
        run_study(path, AblateConfig(out=str(tmp_path / "out"), precision="fp32", device="cpu"))
    plain = _study(tmp_path / "plain", files)
    assert main(["ablate", str(plain), "--device", "cuda", "--out", str(tmp_path / "o")]) == 2
    assert "bertforge ablate: error: --device: cuda: PyTorch sees no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flags, message", [
    (["--device", "tpu"], "--device: expected auto, cpu, cuda or cuda:K, got 'tpu'"),
    (["--device", "cpu", "--precision", "fp16"], "--precision: fp16 needs a CUDA device (its gradient scaler), and "
                                                  "the runs go on cpu; use bf16, fp32 or auto"),
    (["--seeds", "-1"], "--seeds: expected comma-separated integers >= 0, got '-1'"),
    (["--seeds", "0,x"], "--seeds: expected comma-separated integers >= 0, got '0,x'"),
    (["--seeds", "0," + "9" * 30], "--seeds: must be below 2**63, got a 30-digit number"),
    (["--seeds", "0,0"], "--seeds: repeated seeds in [0, 0]"),
])
def test_bad_flags_are_one_line_before_any_work(tmp_path, no_work, capsys, flags, message):
    path = _study(tmp_path / "study", _files(tmp_path))
    out = tmp_path / "out"
    assert main(["ablate", str(path), "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"bertforge ablate: error: {message}\n"
    assert not out.exists()


def test_seeds_flag_follows_the_study_files_rules():
    assert runner.flag_seeds("2,0,1") == (2, 0, 1)
    with pytest.raises(ValueError, match=r"--seeds: repeated seeds in \[1, 1\]"):
        AblateConfig(seeds="1,1")


# ---------------------------------------------------------------------------- compute minutes
def test_a_resumed_pretrainings_minutes_add_up_every_process(tmp_path, monkeypatch):
    files = _files(tmp_path)
    path = _edited(tmp_path / "study", files, lambda d, f: (
        d.update(seeds=[0], tasks=d["tasks"][:1], variants=[{"name": "BERT"}], figure=None)))
    out = tmp_path / "out"
    clock = itertools.count(0.0, 60.0)  # each reading of the runner's clock is a minute after the last
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    real = pretrain_module.pretrain

    def interrupted(cfg):  # 2 of the 4 steps, a checkpoint, then Ctrl-C
        real(dataclasses.replace(cfg, max_steps=2, checkpoint_every=1))
        raise KeyboardInterrupt("stopped")

    monkeypatch.setattr(pretrain_module, "pretrain", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_study(path, AblateConfig(out=str(out), precision="fp32", device="cpu"))
    folder = out / "pretrain" / "bert"
    assert not (folder / "done.json").exists()
    assert json.loads((folder / "minutes.json").read_text())["minutes"] == pytest.approx(1.0)
    monkeypatch.setattr(pretrain_module, "pretrain", real)
    run_study(path, AblateConfig(out=str(out), precision="fp32", device="cpu"))
    done = json.loads((folder / "done.json").read_text())
    assert done["steps"] == 4 and done["minutes"] == pytest.approx(2.0)  # both processes' minute
    report = json.loads((out / "report.json").read_text())
    assert report["minutes"]["pretraining"] == pytest.approx(2.0)


def test_the_report_counts_only_the_cells_of_the_study_as_it_stands(toy, tmp_path):
    path, out, _, files = toy
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    data = yaml.safe_load(path.read_text())
    data.update(seeds=[0], tasks=data["tasks"][:2], variants=data["variants"][:2],
                figure={**data["figure"], "variants": ["BERT"]})
    smaller = tmp_path / "smaller.yaml"
    smaller.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    run_study(smaller, AblateConfig(out=str(copy), report_only=True))
    report = json.loads((copy / "report.json").read_text())
    kept = {(v, t, 0) for v in ("BERT", "No NSP") for t in ("CLS", "TAG")}
    assert {(c["variant"], c["task"], c["seed"]) for c in report["cells"]} == kept
    assert {(c["variant"], c["task"], c["seed"]) for c in report["figure"]} == {("BERT", "CLS", 0)}
    cells, figure = read_cells(copy, load_study(smaller))
    assert {(c.variant, c.task, c.seed) for c in cells} == kept
    assert report["minutes"]["finetuning"] == pytest.approx(sum(c.seconds for c in [*cells, *figure]) / 60)
    everything = read_cells(copy)
    assert len(everything[0]) > len(cells) and len(everything[1]) > len(figure)  # the folder keeps the rest
