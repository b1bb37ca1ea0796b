"""The `bertforge` command: every subcommand end to end on small generated inputs."""

from __future__ import annotations

import json
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


def test_bad_input_is_one_clear_line(tmp_path, capsys):
    code = main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert "nowhere" in err and "Traceback" not in err
