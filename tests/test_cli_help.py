"""What ``bertforge COMMAND --help`` offers: the task-family settings of evaluate, predict and serve under headings
naming their family, serve without the settings only reading files uses, plain metavars for optional values
(``STR``, not ``{None}|STR``); and the flags still parse to the settings they did."""

import re
import sys
import types

import pytest

from bertforge.cli import COMMANDS, main

SQUAD = "SQuAD (question answering) options"
TAGGING = "tagging options"
COLUMNS = "classification and multiple choice options"
SQUAD_FLAGS = {"--max-query-length", "--max-answer-length", "--n-best-size", "--null-score-diff-threshold"}
COLUMN_FLAGS = {"--text-column", "--text-pair-column", "--label-column", "--label-names"}
COMMON_FLAGS = {"--task", "--max-seq-length", "--long-inputs", "--stride", "--eval-batch-size", "--device"}


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _sections(text: str) -> dict[str, set[str]]:
    """The help's parts: heading ("options", "SQuAD (question answering) options", ...) -> the long flags listed
    under it. tyro draws boxes on a terminal (``╭─ options ─╮``), plain headings over a rule elsewhere."""
    lines = [line.strip("│╭╮╰╯").rstrip() for line in text.splitlines()]
    sections: dict[str, set[str]] = {}
    flags: set[str] = set()
    for i, line in enumerate(lines):
        rule = i + 1 < len(lines) and set(lines[i + 1].strip()) in ({"-"}, {"─"})
        boxed = re.fullmatch(r"─ (.+?) ─+", line)
        if boxed or (rule and line.strip().endswith(("options", "arguments"))):
            flags = sections.setdefault(boxed.group(1) if boxed else line.strip(), set())
        elif re.match(r" {0,2}-", line) and set(line.strip()) - {"-", "─"}:  # a flag's row (-o STR, --out STR)
            names = re.match(r"\s*((?:-\w [^,]*, )?--[\w-]+(?:, --[\w-]+)?)", line)
            if names:
                flags.update(f for f in re.findall(r"--[\w-]+", names.group(1)) if not f.startswith("--no-"))
    return sections


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_family_settings_are_under_their_familys_heading(command, capsys):
    sections = _sections(_help(command, capsys))
    assert sections[SQUAD] == SQUAD_FLAGS
    assert sections[TAGGING] == {"--tag-column", "--tag-scheme"}
    assert sections[COLUMNS] == COLUMN_FLAGS
    assert COMMON_FLAGS | {"--skip-bad-rows", "--precision"} <= sections["options"]
    family = SQUAD_FLAGS | COLUMN_FLAGS | {"--tag-column", "--tag-scheme"}
    assert not family & sections["options"]  # each flag once, under its family's heading only


def test_serve_offers_only_what_serving_uses(capsys):
    text = _help("serve", capsys)
    sections = _sections(text)
    assert sections[SQUAD] == SQUAD_FLAGS
    assert sections[TAGGING] == {"--tag-scheme"}  # entities from the predicted tags; no CoNLL file to read
    assert COMMON_FLAGS | {"--host", "--port", "--batch-size", "--precision"} <= sections["options"]
    offered = set().union(*sections.values())
    for flag in ("--skip-bad-rows", "--text-column", "--text-pair-column", "--label-column", "--label-names",
                 "--tag-column"):  # only reading a task file uses them: serve reads none
        assert flag not in offered
    assert "--skip-bad-rows" not in text
    assert COLUMNS not in sections


def test_serve_refuses_a_file_setting(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "ckpt", "--skip-bad-rows"])
    assert e.value.code == 2 and "--skip-bad-rows" in capsys.readouterr().err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_optional_flag_shows_a_none_metavar(command, capsys):
    text = _help(command, capsys)
    assert "{None" not in text and "None}" not in text and "|STR" not in text


def test_optional_flags_show_their_values_metavar(capsys):
    assert "--file STR" in _help("predict", capsys)
    assert "--format {text,jsonl}" in _help("predict", capsys)
    text = _help("evaluate", capsys)
    assert "--long-inputs {auto,truncate,windows}" in text and "--null-score-diff-threshold FLOAT" in text
    assert "--tag-column INT" in text
    assert "--warmup-ratio FLOAT" in _help("finetune", capsys)
    assert "--layers STR" in _help("features", capsys)


# ---------------------------------------------------------------------------- the flags parse as before
EVERY_SETTING = ["--task", "squad2", "--text-column", "t", "--text_pair_column", "p", "--label-column", "l",
                 "--label-names", "a,b", "--max-seq-length", "64", "--long-inputs", "windows", "--stride", "16",
                 "--max-query-length", "32", "--max_answer_length", "10", "--n-best-size", "5",
                 "--null-score-diff-threshold", "-1.5", "--tag-column", "2", "--tag-scheme", "BIO", "--skip-bad-rows",
                 "--eval-batch-size", "8", "--device", "cpu"]
EVERY_VALUE = {"task": "squad2", "text_column": "t", "text_pair_column": "p", "label_column": "l", "label_names": "a,b",
               "max_seq_length": 64, "long_inputs": "windows", "stride": 16, "max_query_length": 32,
               "max_answer_length": 10, "n_best_size": 5, "null_score_diff_threshold": -1.5, "tag_column": 2,
               "tag_scheme": "BIO", "skip_bad_rows": True, "eval_batch_size": 8, "device": "cpu"}
SERVE_VALUE = {k: v for k, v in EVERY_VALUE.items()
               if k not in ("text_column", "text_pair_column", "label_column", "label_names", "tag_column",
                            "skip_bad_rows")}


def _serve_args() -> list[str]:
    dropped = {"--text-column", "--text_pair_column", "--label-column", "--label-names", "--tag-column"}
    args, i = [], 0
    while i < len(EVERY_SETTING):
        if EVERY_SETTING[i] == "--skip-bad-rows":
            i += 1
        elif EVERY_SETTING[i] in dropped:
            i += 2
        else:
            args += EVERY_SETTING[i:i + 2]
            i += 2
    return args


@pytest.fixture
def evaluated(monkeypatch):
    seen = []

    def evaluate(checkpoint, file, out=None, precision="fp32", settings=None):
        seen.append(settings)
        return {}

    monkeypatch.setattr("bertforge.tasks.finetune.evaluate", evaluate)
    return seen


def test_evaluate_passes_every_setting_on(evaluated, capsys):
    assert main(["evaluate", "ckpt", "--file", "dev.json", *EVERY_SETTING]) == 0
    assert evaluated[-1] == EVERY_VALUE
    assert main(["evaluate", "ckpt", "--file", "dev.json"]) == 0
    assert evaluated[-1] == {}  # unset: the checkpoint's
    assert main(["evaluate", "ckpt", "--file", "dev.json", "--max-query-length", "None", "--tag-column", "-1"]) == 0
    assert evaluated[-1] == {"tag_column": -1}  # None still reads as unset
    capsys.readouterr()
    assert main(["evaluate", "ckpt", "--file", "dev.json", "--n-best-size", "many"]) == 2
    assert capsys.readouterr().err == "bertforge evaluate: error: --n-best-size: expected an integer, got 'many'\n"


def test_predict_passes_every_setting_on(monkeypatch, tmp_path, capsys):
    seen = []

    def from_pretrained(checkpoint, precision="fp32", head=None, settings=None):
        seen.append(("texts", precision, head, settings))
        raise ValueError("stop here")

    def predict(checkpoint, file, out=None, *, precision="fp32", settings=None):
        seen.append(("file", precision, file, settings))
        return []

    monkeypatch.setattr("bertforge.serving.predictor.Predictor.from_pretrained", from_pretrained)
    monkeypatch.setattr("bertforge.serving.predictor.checkpoint_head", lambda path: "qa")
    monkeypatch.setattr("bertforge.tasks.finetune.predict", predict)
    assert main(["predict", "ckpt", "a question ||| a context", *EVERY_SETTING, "--batch-size", "4"]) == 2
    assert seen[-1] == ("texts", "fp32", None, {**EVERY_VALUE, "eval_batch_size": 4})
    task_file = tmp_path / "dev.json"
    task_file.write_text("{}", encoding="utf-8")
    assert main(["predict", "ckpt", str(task_file), *EVERY_SETTING, "--precision", "bf16"]) == 0
    assert seen[-1] == ("file", "bf16", str(task_file), EVERY_VALUE)
    assert main(["predict", "ckpt", str(task_file)]) == 0
    assert seen[-1] == ("file", "fp32", str(task_file), {})
    capsys.readouterr()


def test_serve_passes_every_setting_it_takes_on(monkeypatch, capsys):
    for name in ("starlette", "uvicorn"):  # serve checks they are installed; nothing here runs them
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    seen = []
    model = object()

    def from_pretrained(checkpoint, precision="fp32", head=None, settings=None):
        seen.append((precision, head, settings))
        return model

    served = []
    monkeypatch.setattr("bertforge.serving.predictor.Predictor.from_pretrained", from_pretrained)
    monkeypatch.setattr("bertforge.serving.http.serve", lambda predictor, **kwargs: served.append((predictor, kwargs)))
    assert main(["serve", "ckpt", *_serve_args(), "--port", "9000", "--top-k", "3"]) == 0
    assert seen[-1] == ("fp32", None, SERVE_VALUE)
    assert served[-1][0] is model and served[-1][1]["port"] == 9000 and served[-1][1]["top_k"] == 3
    assert main(["serve", "ckpt", "--embeddings", "--batch-size", "4"]) == 0
    assert seen[-1] == ("fp32", "embeddings", {"eval_batch_size": 4})
    capsys.readouterr()
