"""Classification inputs longer than --max-seq-length: --long-inputs truncate (the default, the paper's)
or windows.

Truncation gives exactly one sequence per example: a text keeps its start, a pair is cut as the TF
release's ``_truncate_seq_pair`` cuts it (a token at a time from the longer segment). Windows give
every overlapping window. The run says how many examples were truncated or windowed, when it reads
the data and at its end; the choice is saved with the model, and evaluate / predict / the Predictor
use it unless told otherwise. Families where one of the two cannot apply refuse it.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
from finetune_fixtures import FILLER, base, root, write  # noqa: F401 - fixtures: a tiny "pre-trained" BERT, a folder
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models

from bertforge import cli
from bertforge.serving.predictor import Predictor
from bertforge.tasks import family_for
from bertforge.tasks.classification import Example, encode_examples, predict_logits, read_examples
from bertforge.tasks.finetune import FinetuneConfig, evaluate, finetune, load_finetuned, predict
from bertforge.text.tokenizer import BertTokenizer


def words(n: int, seed: int = 0) -> str:
    """``n`` filler words (one WordPiece token each)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(FILLER) for _ in range(n))


def tf_truncate_seq_pair(a: list[int], b: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """Google's run_classifier.py ``_truncate_seq_pair``, as written there."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_length:
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()
    return a, b


def test_truncate_gives_one_sequence_per_example_cut_as_the_tf_release_cuts(base):
    tok = BertTokenizer.from_pretrained(base)
    lengths = [(40, None), (3, None), (14, None), (30, 5), (5, 30), (20, 20), (9, 8), (6, 6)]
    ex = [Example(words(a, k), None if b is None else words(b, 100 + k), None, k + 1)
          for k, (a, b) in enumerate(lengths)]
    f = encode_examples(ex, tok, max_seq_length=16)  # the default: truncate
    assert len(f) == f.num_examples == len(ex) and f.example.tolist() == list(range(len(ex)))
    cls, sep = tok.cls_token_id, tok.sep_token_id
    for e, ids, n_a in zip(ex, f.input_ids, f.num_a):
        a = tok.encode_batch_ids([e.text_a])[0]
        if e.text_b is None:
            assert ids.tolist() == [cls, *a[:14], sep] and n_a == len(ids)  # the start of the text
        else:
            ta, tb = tf_truncate_seq_pair(a, tok.encode_batch_ids([e.text_b])[0], 13)
            assert ids.tolist() == [cls, *ta, sep, *tb, sep] and n_a == len(ta) + 2
    assert f.truncated == 5 and f.windowed == 0  # 40 words; 30 + 5; 5 + 30; 20 + 20; 9 + 8 (17 > 13)
    assert f.summary() == "8 examples; 5 of 8 longer than 16 tokens were truncated"
    batch = f.collate([3])
    assert batch["token_type_ids"][0].tolist() == [0] * int(f.num_a[3]) + [1] * (16 - int(f.num_a[3]))


def test_windows_give_every_overlapping_window(base):
    tok = BertTokenizer.from_pretrained(base)
    ex = [Example(words(40), None, None, 1), Example(words(3), None, None, 2)]
    f = encode_examples(ex, tok, max_seq_length=16, stride=8, long_inputs="windows")
    ids = tok.encode_batch_ids([ex[0].text_a])[0]
    assert [w[1:-1].tolist() for w, e in zip(f.input_ids, f.example) if e == 0] == \
        [ids[s:s + 14] for s in (0, 8, 16, 24, 32)]
    assert f.windowed == 1 and f.truncated == 0
    assert f.summary() == "2 examples -> 6 windows; 1 of 2 longer than 16 tokens were cut into windows"
    with pytest.raises(ValueError, match="long_inputs must be truncate or windows"):
        encode_examples(ex, tok, max_seq_length=16, long_inputs="auto")


def test_the_setting_is_resolved_per_family_and_refused_where_it_cannot_apply(base):
    def configured(task: str, **settings):
        return family_for(task).configure(FinetuneConfig(task=task, **settings))

    assert configured("sst2").long_inputs == "truncate" and configured("swag").long_inputs == "truncate"
    assert configured("ner").long_inputs == "windows" and configured("squad").long_inputs == "windows"
    assert configured("classification", long_inputs="windows", stride=8).stride == 8
    for task, value in (("ner", "truncate"), ("squad2", "truncate"), ("swag", "windows")):
        with pytest.raises(ValueError, match=f"long_inputs='{value}' does not apply to"):
            configured(task, long_inputs=value)
    with pytest.raises(ValueError, match="stride=8 places windows, but long inputs are truncated"):
        configured("classification", stride=8)  # truncation would ignore the stride
    with pytest.raises(ValueError, match="long_inputs must be one of auto, truncate, windows"):
        FinetuneConfig(task="sst2", long_inputs="cut")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- runs and fine-tuned models
@pytest.fixture(scope="module")
def files(root) -> tuple[Path, Path]:
    """Training (24 rows, 8 longer than 16 tokens) and dev (8 rows, 2 longer) CSVs."""
    def rows(n: int, long: int, seed: int) -> str:
        rng = random.Random(seed)
        return "".join(f'"{words(30 if k < long else 5, seed * 100 + k)}",{rng.choice(["pos", "neg"])}\n'
                       for k in range(n))

    return (write(root / "train.csv", "review,sentiment\n" + rows(24, 8, 1)),
            write(root / "dev.csv", "review,sentiment\n" + rows(8, 2, 2)))


def run(base: Path, out: Path, files: tuple[Path, Path], **settings) -> Path:
    finetune(FinetuneConfig(task="classification", model=str(base), out=str(out), train_file=str(files[0]),
                            dev_file=str(files[1]), text_column="review", label_column="sentiment", max_seq_length=16,
                            batch_size=8, max_steps=2, lr=1e-2, log_every=1, progress=False, seed=3, **settings))
    return out


def test_the_run_says_how_many_examples_were_truncated_or_windowed(root, base, files, caplog):
    caplog.set_level(logging.INFO, logger="bertforge")
    run(base, root / "truncated", files)
    text = caplog.text
    assert f"{files[0]}: 24 examples; 8 of 24 longer than 16 tokens were truncated" in text  # when reading
    assert f"{files[1]}: 8 examples; 2 of 8 longer than 16 tokens were truncated" in text
    start = next(r.message for r in caplog.records if r.message.startswith("finetune: classification"))
    assert "train 24 examples; 8 of 24 longer than 16 tokens were truncated" in start
    end = next(r.message for r in caplog.records if r.message.startswith("finetune: inputs:"))
    assert end == ("finetune: inputs: train 24 examples; 8 of 24 longer than 16 tokens were truncated; "
                   "dev dev.csv 8 examples; 2 of 8 longer than 16 tokens were truncated")
    caplog.clear()
    run(base, root / "windowed", files, long_inputs="windows")
    end = next(r.message for r in caplog.records if r.message.startswith("finetune: inputs:"))
    # 30 tokens in windows of 14 every 7: 4 windows each
    assert end == ("finetune: inputs: train 24 examples -> 48 windows; 8 of 24 longer than 16 tokens were cut into "
                   "windows; dev dev.csv 8 examples -> 14 windows; 2 of 8 longer than 16 tokens were cut into windows")


def _expected_scores(folder: Path, file: Path, long_inputs: str) -> np.ndarray:
    """The logits of ``file``'s examples computed directly with the given handling."""
    ft = load_finetuned(folder, {"long_inputs": long_inputs})
    examples, _ = read_examples(file, text_column="review", require_labels=False)
    features = encode_examples(examples, ft.tokenizer, 16, 0, long_inputs)
    return predict_logits(ft.model, features, 64)


@pytest.mark.parametrize("saved", ["truncate", "windows"])
def test_evaluate_predict_and_the_predictor_use_the_saved_choice(root, base, files, saved, tmp_path):
    folder = run(base, root / f"reuse-{saved}", files, **({} if saved == "truncate" else {"long_inputs": saved}))
    folder = folder / "best"
    other = {"truncate": "windows", "windows": "truncate"}[saved]
    settings = json.loads((folder / "config.json").read_text())["bertforge_finetune"]
    assert settings["long_inputs"] == saved
    assert load_finetuned(folder).settings.long_inputs == saved
    assert load_finetuned(folder, {"long_inputs": other}).settings.long_inputs == other
    expected, overridden = _expected_scores(folder, files[1], saved), _expected_scores(folder, files[1], other)
    assert np.abs(expected - overridden).max() > 1e-5  # the handling changes the long examples' logits ...
    got = predict(folder, files[1])  # ... and the records' probabilities tell which was used

    def probabilities(records: list[dict]) -> np.ndarray:
        return np.array([list(r["probabilities"].values()) for r in records])

    def softmax(logits: np.ndarray) -> np.ndarray:
        e = np.exp(logits - logits.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    np.testing.assert_allclose(probabilities(got), softmax(expected), rtol=0, atol=1e-6)
    np.testing.assert_allclose(probabilities(predict(folder, files[1], settings={"long_inputs": other})),
                               softmax(overridden), rtol=0, atol=1e-6)
    texts = [line.rsplit(",", 1)[0].strip('"') for line in files[1].read_text().splitlines()[1:]]
    for given, scores in ((None, expected), (other, overridden)):
        p = Predictor.from_pretrained(folder, device="cpu", settings={"long_inputs": given})
        assert p.settings.long_inputs == (given or saved)
        probs = np.exp(scores) / np.exp(scores).sum(1, keepdims=True)
        np.testing.assert_allclose([[r["probabilities"]["neg"], r["probabilities"]["pos"]] for r in p.classify(texts)],
                                   probs, rtol=0, atol=1e-6)
    metrics = evaluate(folder, files[1])
    assert metrics == pytest.approx(json.loads((folder / "eval_metrics.json").read_text())["metrics"], abs=1e-6)
    assert cli.main(["evaluate", str(folder), "--file", str(files[1]), "--long-inputs", other]) == 0


def test_a_checkpoint_whose_settings_name_no_handling_keeps_windows(root, base, files, tmp_path):
    """Settings without long_inputs are those of a run that trained on every window: it predicts so. A
    checkpoint without bertforge settings (fine-tuned elsewhere) truncates, as transformers does."""
    import shutil

    folder = tmp_path / "windows-checkpoint"
    shutil.copytree(run(base, root / "unnamed", files, long_inputs="windows", stride=7) / "model", folder)
    config = json.loads((folder / "config.json").read_text())
    del config["bertforge_finetune"]["long_inputs"]
    (folder / "config.json").write_text(json.dumps(config))
    ft = load_finetuned(folder)
    assert (ft.settings.long_inputs, ft.settings.stride) == ("windows", 7)
    assert load_finetuned(folder, {"long_inputs": "truncate"}).settings.stride == 0  # no windows, no stride
    del config["bertforge_finetune"]
    (folder / "config.json").write_text(json.dumps(config))
    assert load_finetuned(folder).settings.long_inputs == "truncate"
