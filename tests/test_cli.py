"""The `bertforge` command: every subcommand end to end on small generated inputs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch

from bertforge.cli import COMMANDS, main
from bertforge.model.config import BertConfig
from bertforge.model.heads import BertForPreTraining

WORDS = ("the cat sat on a mat while the dog ran after a red ball in the park near our house "
         "because everyone wanted quiet evenings with good books and warm tea").split()


@pytest.fixture
def corpus(tmp_path):
    rng = torch.Generator().manual_seed(0)
    lines = []
    for _ in range(400):
        n = int(torch.randint(4, 14, (), generator=rng))
        lines.append(" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (n,), generator=rng)) + ".")
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "bertforge", "--help"], capture_output=True, text=True, check=True)
    for name in COMMANDS:
        assert name in out.stdout
    assert set(COMMANDS) >= {"vocab", "convert", "tokenize", "info"}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_prints_its_help(command, capsys):
    # every flag's help text renders (argparse formats it: a bare "%" in a field's docstring broke demo's)
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0 and "usage: bertforge " + command in capsys.readouterr().out


def test_vocab_then_tokenize(corpus, tmp_path, capsys):
    out_dir = tmp_path / "vocab"
    assert main(["vocab", str(corpus), "--out", str(out_dir), "--vocab-size", "400", "--min-frequency", "1"]) == 0
    vocab = (out_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[0] == "[PAD]" and vocab[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(vocab) <= 400 and "cat" in vocab
    capsys.readouterr()
    assert main(["tokenize", "-t", str(out_dir), "--jsonl", "The cat sat.", "--pair", "A dog ran."]) == 0
    record = json.loads(capsys.readouterr().out.strip())
    assert record["tokens"] == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "a", "dog", "ran", ".", "[SEP]"]
    assert record["token_type_ids"] == [0] * 6 + [1] * 5
    assert record["input_ids"][0] == 101 and record["input_ids"][5] == 102

    # a reader that stops early (``| head -1``) stops the command quietly, as SIGPIPE stops a Unix tool
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"the cat sat {i}\n" for i in range(50_000)), encoding="utf-8")
    with texts.open() as stdin:
        proc = subprocess.Popen([sys.executable, "-m", "bertforge", "tokenize", "-t", str(out_dir)], stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("[CLS] the cat sat")
    proc.stdout.close()
    assert proc.wait(timeout=120) == 141 and proc.stderr.read() == ""


def test_convert_and_info(tmp_path, capsys):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    model = BertForPreTraining(config)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    # An old-style .bin checkpoint with gamma/beta names and an explicit tied decoder.
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in state.items()}
    legacy["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    src = tmp_path / "src"
    src.mkdir()
    torch.save(legacy, src / "pytorch_model.bin")
    config.save(src / "config.json")
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst)]) == 0
    assert (dst / "model.safetensors").is_file()
    again = BertForPreTraining.from_pretrained(dst)
    for k, v in again.state_dict().items():
        assert torch.equal(v, state[k]), k
    capsys.readouterr()
    assert main(["info", str(dst)]) == 0
    text = capsys.readouterr().out
    assert "BertForPreTraining" in text and "L=2 H=32 A=4" in text


def test_info_reads_the_tokenizer_of_a_tokenizer_json_folder(tmp_path, capsys):
    # transformers 5 saves tokenizer.json (+ tokenizer_config.json) and no vocab.txt
    import transformers

    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37)
    BertForPreTraining(config).save_pretrained(tmp_path / "m")
    words = tmp_path / "words.txt"
    words.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\n", encoding="utf-8")
    transformers.BertTokenizer(vocab=str(words), do_lower_case=False).save_pretrained(str(tmp_path / "m"))
    assert not (tmp_path / "m" / "vocab.txt").exists()
    assert main(["info", str(tmp_path / "m")]) == 0
    assert "tokenizer: tokenizer.json, 7 entries, cased, accents kept" in capsys.readouterr().out
    (tmp_path / "m" / "tokenizer.json").write_text('{"model": {"type": "Unigram"}}', encoding="utf-8")
    assert main(["info", str(tmp_path / "m")]) == 0
    assert "tokenizer: not usable (" in capsys.readouterr().out


def test_bad_input_is_one_clear_line(tmp_path, capsys):
    code = main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert "nowhere" in err and "Traceback" not in err


# ---------------------------------------------------------------------------- flags from signatures and configs
def _help(command: str, capsys) -> str:
    """``bertforge COMMAND --help`` as one line of words (wrapping and box borders removed)."""
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.replace("│", " ").split())


# A field docstring (or Args text) of each command, as its --help shows it.
HELP_TEXTS = {
    "vocab": "--vocab-size INT size of the vocab, special tokens included",
    "prepare": "--max-seq-length INT Longest instance, in tokens, special tokens included.",
    "tokenize": "--pair STR a second segment",
    "convert": "--model-class",
    "info": "CHECKPOINT a checkpoint folder",
    "export-onnx": "--no-verify check the exported model against PyTorch",
    "pretrain": "--no-bias-correction Adam bias correction",
    "finetune": "--train-file STR Training file(s), separated by commas",
    "evaluate": "--label-column STR Column of the label",
    "predict": "--top-k INT Fill-mask: tokens per [MASK]; classification: the most likely labels shown",
    "serve": "--max-batch INT most inputs in one request",
    "features": "--layers STR comma-separated hidden-state indexes: -1 the last layer",
    "plot": "RUN-DIR a run folder holding metrics.jsonl",
    "demo": "--vocab-size INT WordPiece vocab size learned from the pre-training text.",
    "ablate": "[STUDY] a study file, or a bundled study's name",
    "fetch": "WHAT all-minilm-l6-v2, movie-reviews, sentiment-tweets",
}


def test_every_command_has_its_help_text_in_the_table():
    assert set(HELP_TEXTS) == set(COMMANDS)


@pytest.mark.parametrize("command", list(HELP_TEXTS))
def test_help_shows_each_flag_with_its_docstring(command, capsys):
    text = _help(command, capsys)
    assert HELP_TEXTS[command] in text
    if command in ("prepare", "pretrain", "finetune", "demo"):
        assert "--config FILE JSON or YAML file" in text


@pytest.mark.parametrize("command", ["pretrain", "finetune", "evaluate", "predict", "serve", "features", "demo",
                                     "ablate"])
def test_every_command_that_runs_a_model_takes_precision(command, capsys):
    text = _help(command, capsys)
    assert "--precision" in text and "--bf16" not in text
    if command not in ("pretrain", "finetune", "demo", "ablate"):  # a config's field is checked by its dataclass
        assert "--precision {auto,fp32,bf16,fp16,int8}" in text  # every other command runs inference


@pytest.fixture
def demo_runs(monkeypatch):
    """The DemoConfig each ``bertforge demo`` call builds (the demo itself does not run)."""
    seen = []
    monkeypatch.setattr("bertforge.demo.run.run_demo", seen.append)
    return seen


def test_dashed_and_underscored_flags_and_negated_bools(demo_runs):
    assert main(["demo", "--vocab-size", "4000", "--pretrain_steps", "7", "--no-task-text-in-pretraining",
                 "--range-steps=20", "--range_top", "0.05"]) == 0
    cfg = demo_runs[-1]
    assert (cfg.vocab_size, cfg.pretrain_steps, cfg.task_text_in_pretraining, cfg.range_steps, cfg.range_top) == \
           (4000, 7, False, 20, 0.05)
    assert main(["demo", "--task_text_in_pretraining"]) == 0
    assert demo_runs[-1].task_text_in_pretraining and demo_runs[-1].vocab_size == 8192


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_config_file_sets_fields_and_flags_override_it(suffix, tmp_path, demo_runs):
    settings = {"minutes": 3, "model": "tiny", "pretrain_recipe": "paper", "task_text_in_pretraining": False}
    file = tmp_path / f"demo{suffix}"
    file.write_text(json.dumps(settings) if suffix == ".json" else
                    "minutes: 3\nmodel: tiny\npretrain_recipe: paper\ntask_text_in_pretraining: false\n")
    assert main(["demo", "--config", str(file), "--model", "mini", "--seed", "5"]) == 0
    cfg = demo_runs[-1]
    assert (cfg.minutes, cfg.model, cfg.seed, cfg.pretrain_recipe, cfg.task_text_in_pretraining) == (3.0, "mini", 5,
                                                                                                      "paper", False)
    assert main(["demo", "--model", "small", f"--config={file}"]) == 0  # wherever it stands, flags win
    assert (demo_runs[-1].model, demo_runs[-1].minutes) == ("small", 3.0)


def test_a_bad_config_file_is_one_clear_line(tmp_path, demo_runs, capsys):
    file = tmp_path / "demo.yaml"
    for text, message in (("minutes: 3\nminute: 4\n", "demo.yaml: unknown key 'minute'; expected "),
                          ("vocab_size: many\n", "demo.yaml: vocab_size: expected an integer, got 'many'"),
                          ("- a list\n", "expected a mapping"),
                          ("minutes: 0\n", "minutes")):
        file.write_text(text)
        assert main(["demo", "--config", str(file)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("bertforge demo: error: ") and message in err and err.count("\n") == 1
    assert main(["demo", "--config", str(tmp_path / "nowhere.yaml")]) == 2
    assert "nowhere.yaml" in capsys.readouterr().err
    assert demo_runs == []


def test_precision_reaches_the_model_and_bf16_is_gone(monkeypatch, capsys):
    seen = []

    def evaluate(checkpoint, file, out=None, precision="fp32", settings=None):
        seen.append((precision, settings))
        return {"accuracy": 1.0}

    monkeypatch.setattr("bertforge.tasks.finetune.evaluate", evaluate)
    assert main(["evaluate", "ckpt", "--file", "dev.tsv", "--precision", "bf16", "--device", "cpu"]) == 0
    assert seen[-1] == ("bf16", {"device": "cpu"})
    assert json.loads(capsys.readouterr().out) == {"accuracy": 1.0}
    assert main(["evaluate", "ckpt", "--file", "dev.tsv", "--max_seq_length", "64"]) == 0
    assert seen[-1] == ("fp32", {"max_seq_length": 64})  # unset settings: the checkpoint's
    capsys.readouterr()

    assert main(["predict", "ckpt", "a text", "--bf16"]) == 2
    assert capsys.readouterr().err == "bertforge predict: error: --bf16 is gone: use --precision bf16\n"
    assert main(["evaluate", "ckpt", "--file", "dev.tsv", "--precision", "fp8"]) == 2
    assert "--precision: expected one of auto, fp32, bf16, fp16, int8, got 'fp8'" in capsys.readouterr().err


def test_the_library_logs_show_on_stdout_while_a_command_runs(monkeypatch, capsys):
    logger = logging.getLogger("bertforge")
    monkeypatch.setattr("bertforge.demo.run.run_demo", lambda cfg: (logger.info("an info line"), logger.debug(
        "a debug line"), logger.warning("a warning")))
    handlers, propagate = list(logger.handlers), logger.propagate
    assert main(["demo"]) == 0
    printed = capsys.readouterr()
    assert "an info line\n" in printed.out and "a debug line" not in printed.out
    assert "a warning" in printed.err and "a warning" not in printed.out
    assert main(["-v", "demo"]) == 0
    assert "a debug line\n" in capsys.readouterr().out
    assert (logger.handlers, logger.propagate) == (handlers, propagate)  # left as it was found
    logger.info("after the command")
    assert "after the command" not in capsys.readouterr().out


def test_version_and_unknown_command(capsys):
    from bertforge import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"bertforge {__version__}"
    with pytest.raises(SystemExit) as e:
        main(["pretrian"])
    assert e.value.code == 2 and "invalid choice: 'pretrian'" in capsys.readouterr().err


# ---------------------------------------------------------------------------- Ctrl-C during start-up
_SIGINT_ON_TORCH_IMPORT = """
import os, signal, sys

# As a terminal starts a command: Ctrl-C deliverable. A child inherits an ignored or blocked SIGINT from
# the process that starts it, and a test worker may have one (whatever ran in it before).
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

class Finder:  # Ctrl-C (a real SIGINT) arrives while torch is being imported
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, Finder())
sys.argv = ["bertforge"] + sys.argv[1:]
from bertforge.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_ctrl_c_while_torch_is_imported_is_one_line_and_exit_130(verbose):
    args = ["-v"] * verbose + ["info", "nowhere"]
    done = subprocess.run([sys.executable, "-c", _SIGINT_ON_TORCH_IMPORT, *args], capture_output=True, text=True,
                          timeout=120)
    if verbose:  # -v shows the traceback
        assert "KeyboardInterrupt" in done.stderr
    else:
        assert done.returncode == 130 and done.stderr == "bertforge: interrupted\n"


def test_ctrl_c_while_parsing_is_one_line_and_exit_130(monkeypatch, capsys):
    from bertforge import cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_parser", interrupted)
    assert main(["info", "x"]) == 130
    assert capsys.readouterr().err == "bertforge: interrupted\n"


def test_a_stopped_run_says_where_it_stopped_in_steps_or_in_its_time_budget(capsys):
    from bertforge.cli import _report_stop
    from bertforge.train.loop import TrainResult

    stopped = dict(stopped_early=True, final_metrics={}, eval_metrics={}, checkpoint=None, interrupted=True,
                   stop_signal=2)
    assert _report_stop("pretrain", TrainResult(step=257, max_steps=1000, **stopped)) == 130
    assert "pretrain: stopped at step 257 of 1000; model/ holds" in capsys.readouterr().out
    budget = TrainResult(step=257, max_steps=1_000_000, budget_minutes=5, elapsed_seconds=78, **stopped)
    assert _report_stop("pretrain", budget) == 130
    assert "pretrain: stopped at 1.3 of its 5 budget minutes (step 257); model/ holds" in capsys.readouterr().out


def test_prepare_takes_no_progress_as_the_training_commands_do(monkeypatch, capsys):
    seen = {}

    def prepare(inputs, out, tokenizer, cfg, **kwargs):
        seen.update(kwargs)
        return {}

    monkeypatch.setattr("bertforge.data.prepare.prepare", prepare)
    monkeypatch.setattr("bertforge.data.prepare.format_stats", lambda manifest: "stats")
    assert main(["prepare", "in.txt", "--out", "o", "--tokenizer", "t", "--no-progress"]) == 0
    assert seen["progress"] is False
    assert main(["prepare", "in.txt", "--out", "o", "--tokenizer", "t"]) == 0
    assert seen["progress"] is True
