"""Token classification (NER), end to end on generated CoNLL files.

Column files are read as written (-DOCSTART-, blank lines, tag columns, tabs or spaces) with errors
naming file and line; the first WordPiece of each word carries its tag and words that tokenize to
nothing do not shift the others; long sentences become windows in which every word is labelled and
predicted exactly once, in its max-context window; a model that tags by token identity gives the
conlleval scores counted by hand (whatever the window size), a gold tag the model was not trained
on counting as missed (with a warning); a tiny model learns a tiny NER task; the fine-tuned folder
is transformers' BertForTokenClassification with equal logits; finetune / evaluate / predict run
through the Python API and the CLI.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from data_fixtures import PLAIN_WORDS, VOCAB_SIZE
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models
from finetune_fixtures import base, root, write  # noqa: F401 - fixtures: a tiny "pre-trained" checkpoint, a folder
from torch import nn

from bertforge import cli
from bertforge.model import losses
from bertforge.model.config import BertConfig
from bertforge.tasks.finetune import FinetuneConfig, evaluate, finetune, load_finetuned, predict
from bertforge.model.heads import BertForTokenClassification, tagged_positions
from bertforge.tasks import family_for
from bertforge.tasks.tagging import (
    Sentence,
    TaggingObjective,
    detect_scheme,
    encode_sentences,
    predict_tags,
    read_sentences,
    resolve_scheme,
    tag_ids,
    tag_list,
)
from bertforge.text.tokenizer import BertTokenizer

PEOPLE = ["walker", "singer", "painter", "climber", "teacher"]  # B-PER; two WordPieces each: walk ##er
SURNAMES = ["stone", "green", "young"]  # I-PER: after a person
PLACES = ["river", "mountain", "city", "garden"]  # B-LOC
PLACE_TAILS = ["road", "field", "tree"]  # I-LOC: after a place
FILLER = [w for w in PLAIN_WORDS if w not in PLACES + SURNAMES + PLACE_TAILS] + ["jumping", "played", "rebuilding"]
ZWSP = "\u200b"  # a word the tokenizer drops entirely


@pytest.fixture(scope="module")
def tok(base) -> BertTokenizer:
    return BertTokenizer.from_pretrained(base)


def ner_sentence(rng: random.Random) -> list[tuple[str, str]]:
    """Filler words with one or two entities in BIO: PER (a person, maybe a surname), LOC (a place,
    maybe a tail word); entities never touch."""
    words = [(rng.choice(FILLER), "O") for _ in range(rng.randint(3, 7))]
    for _ in range(rng.randint(1, 2)):
        kind, head, tail = rng.choice([("PER", PEOPLE, SURNAMES), ("LOC", PLACES, PLACE_TAILS)])
        span = [(rng.choice(head), f"B-{kind}")] + [(rng.choice(tail), f"I-{kind}")] * rng.randint(0, 1)
        at = rng.randint(0, len(words))
        words[at:at] = [(rng.choice(FILLER), "O"), *span, (rng.choice(FILLER), "O")]
    return words


def write_conll(path: Path, sentences: list[list[tuple[str, str]]]) -> Path:
    """CoNLL-2003's layout: token POS chunk NER, -DOCSTART- lines, blank lines between sentences."""
    text = "-DOCSTART- -X- -X- O\n\n"
    for i, s in enumerate(sentences):
        if i and i % 10 == 0:
            text += "-DOCSTART- -X- -X- O\n\n"
        text += "".join(f"{w} NN I-NP {t}\n" for w, t in s) + "\n"
    return write(path, text)


def config(base: Path, out: Path, **overrides) -> FinetuneConfig:
    settings = dict(task="ner", model=str(base), out=str(out), lr=2e-3, batch_size=16, warmup_ratio=0.1,
                    weight_decay=0.0, log_every=1, progress=False, seed=7)
    return FinetuneConfig(**{**settings, **overrides})


class LookupTagger(nn.Module):
    """Tags every token by its id alone (a table id -> tag id): predictions independent of context and windows."""

    def __init__(self, tok: BertTokenizer, labels: list[str], table: dict[str, str]):
        super().__init__()
        self.config = SimpleNamespace(num_labels=len(labels), id2label=dict(enumerate(labels)))
        lookup = torch.zeros(tok.vocab_size, dtype=torch.long)  # id 0: "O"
        for token, tag in table.items():
            lookup[tok.convert_tokens_to_ids(token)] = labels.index(tag)
        self.register_buffer("lookup", lookup)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return SimpleNamespace(logits=nn.functional.one_hot(self.lookup[input_ids], self.config.num_labels).float())


# ------------------------------------------------------------------------------ reading files
def test_conll_files_are_read_as_written(tmp_path):
    f = write(tmp_path / "a.conll", "\ufeff-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n"
                                    "\n\n-DOCSTART- -X- -X- O\nPeter NNP B-NP B-PER\r\nBlackburn NNP I-NP I-PER\n"
                                    "\nBRUSSELS NNP B-NP B-LOC")
    sentences, report = read_sentences(f)
    assert sentences == [Sentence(["EU", "rejects"], ["B-ORG", "O"], [3, 4]),
                         Sentence(["Peter", "Blackburn"], ["B-PER", "I-PER"], [8, 9]),
                         Sentence(["BRUSSELS"], ["B-LOC"], [11])]
    assert report.examples == 3 and report.blank_lines == 2 and report.num_skipped == 0  # blanks ending nothing
    assert [s.tags for s in read_sentences(f, tag_column=2)[0]] == [["B-NP", "B-VP"], ["B-NP", "I-NP"], ["B-NP"]]
    assert read_sentences(f, require_tags=False)[0][1] == Sentence(["Peter", "Blackburn"], None, [8, 9])
    tsv = tmp_path / "b.tsv.gz"  # generic token<TAB>tag, compressed: a tab-split token keeps its spaces
    with gzip.open(tsv, "wt", encoding="utf-8") as g:
        g.write("New York\tB-LOC\t\nis\tO\n\nok\tO\n")
    assert read_sentences(tsv)[0] == [Sentence(["New York", "is"], ["B-LOC", "O"], [1, 2]),
                                      Sentence(["ok"], ["O"], [4])]


def test_errors_name_file_and_line_and_skips_are_counted(tmp_path):
    f = tmp_path / "bad.conll"
    f.write_bytes(b"EU B-ORG\nrejects\nthe O\n\nGerman \xff B-MISC\ncall O\n\tO\n")
    with pytest.raises(ValueError, match=r"bad\.conll:2: 1 column where the token and the tag \(column -1\) need 2"):
        read_sentences(f)
    with pytest.raises(ValueError, match=r"bad\.conll:5: not UTF-8 text"):
        read_sentences(f, require_tags=False)
    sentences, report = read_sentences(f, skip_bad_rows=True)
    assert sentences == [Sentence(["EU", "the"], ["B-ORG", "O"], [1, 3]), Sentence(["call"], ["O"], [6])]
    assert report.skipped == {"too few columns": [2], "not UTF-8": [5], "empty token": [7]}
    assert "skipped 1 rows (too few columns; lines 2)" in report.summary()
    with pytest.raises(ValueError, match=r"bad\.conll:1: 2 columns where the token and the tag \(column 2\) need 3"):
        read_sentences(f, tag_column=2)
    with pytest.raises(ValueError, match="tag_column 0 is the token's column"):
        read_sentences(f, tag_column=0)
    with pytest.raises(FileNotFoundError, match=r"nope\.conll: no such file"):
        read_sentences(tmp_path / "nope.conll")
    dev = write(tmp_path / "dev.conll", "EU B-ORG\nsaid O\n\nin B-TIME\n")
    with pytest.raises(ValueError, match=r"dev\.conll:4: unknown tag 'B-TIME' \(the model's tags: O, B-ORG\)"):
        tag_ids(read_sentences(dev)[0], dev, {"O": 0, "B-ORG": 1})


def test_label_set_and_scheme_detection(tmp_path, base):
    assert tag_list([Sentence(["a"] * 4, ["I-PER", "B-LOC", "O", "B-PER"], [1] * 4),
                     Sentence(["a"], ["I-LOC"], [6])]) == ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
    assert tag_list([Sentence(["a", "b"], ["NN", "DT"], [1, 2])]) == ["O", "DT", "NN"]  # "O" always, first
    bio = ["O", "B-PER", "I-PER"]
    assert detect_scheme(["O", "S-PER", "B-LOC", "I-LOC", "E-LOC"]) == "BIOES"
    assert detect_scheme(bio, [["B-PER", "I-PER", "O", "B-PER"]]) == "BIO"
    # IOB1 (CoNLL-2003's original files): entities open with I-; B- only between touching entities of a type.
    assert detect_scheme(bio, [["I-PER", "I-PER", "B-PER", "O", "I-PER"], ["I-PER"]]) == "IOB1"
    assert detect_scheme(["O", "B-PER", "I-PER", "I-LOC"], [["B-PER", "I-LOC"]]) == "BIO"  # 1 opens with I-, 1 with B-
    assert detect_scheme(["O", "B-PER", "I-PER", "I-LOC"], [["I-PER", "I-LOC"]]) == "IOB1"  # a type switch opens
    assert detect_scheme(["O", "NN", "B-PER"]) is None and detect_scheme(["O", "B-"]) is None
    assert resolve_scheme("auto", "tagging", ["O", "NN"]) is None
    assert resolve_scheme("bioes", "ner", bio) == "BIOES"
    with pytest.raises(ValueError, match="task ner needs entity tags .* got 'NN'"):
        resolve_scheme("auto", "ner", ["O", "NN"])
    with pytest.raises(ValueError, match="tag 'S-PER' is not valid in scheme 'BIO'"):
        resolve_scheme("BIO", "ner", ["O", "S-PER"])
    with pytest.raises(ValueError, match="unknown tag_scheme 'BILOU'"):
        resolve_scheme("BILOU", "ner", bio)
    # Training files: a tag that does not fit names its file and line.
    family = family_for("ner")
    tok = BertTokenizer.from_pretrained(base)
    pos = write(tmp_path / "pos.conll", "EU NNP B-ORG\nrejects VBZ O\n")
    with pytest.raises(ValueError, match=r"pos\.conll:1: task ner needs entity tags .* got 'NNP'"):
        family.train_data(family.configure(config(base, tmp_path, train_file=str(pos), tag_column=1)), tok)
    got = family.train_data(family.configure(config(base, tmp_path, task="tagging", train_file=str(pos),
                                                    tag_column=1)), tok)
    assert got.labels == ["O", "NNP", "VBZ"] and "token accuracy only" in got.summary
    iobes = write(tmp_path / "s.conll", "EU B-ORG\nsays O\n\nPeter S-PER\n")
    with pytest.raises(ValueError, match=r"s\.conll:4: tag 'S-PER' is not valid in scheme 'BIO'"):
        family.train_data(family.configure(config(base, tmp_path, train_file=str(iobes), tag_scheme="BIO")), tok)
    got = family.train_data(family.configure(config(base, tmp_path, train_file=str(iobes))), tok)
    assert got.head == {"id2label": {0: "O", 1: "B-ORG", 2: "S-PER"}} and "scheme BIOES" in got.summary
    with pytest.raises(ValueError, match="one tag only"):
        family.train_data(family.configure(config(base, tmp_path, train_file=str(write(tmp_path / "o.conll",
                                                                                      "a O\nb O\n")))), tok)


# ------------------------------------------------------------------------------ labels and windows
def test_the_first_wordpiece_carries_the_tag_and_empty_words_shift_nothing(tok):
    s = Sentence(["Walker", ZWSP, "river", "unwalking", "."], ["B-PER", "B-MISC", "B-LOC", "I-LOC", "O"],
                 [1, 2, 3, 4, 5])
    labels = tag_list([s])
    f = encode_sentences([s], tok, 128).with_tags(tag_ids([s], "x", {t: i for i, t in enumerate(labels)}))
    batch = f.collate([0])
    pieces = ["[CLS]", "walk", "##er", "river", "un", "##walk", "##ing", ".", "[SEP]"]
    assert batch["input_ids"][0].tolist() == tok.convert_tokens_to_ids(pieces)
    ignore, tag = losses.IGNORE_INDEX, labels.index
    assert batch["labels"][0].tolist() == [ignore, tag("B-PER"), ignore, tag("B-LOC"), tag("I-LOC"), ignore, ignore,
                                           tag("O"), ignore]
    assert f.words[0].tolist() == [-1, 0, -1, 2, 3, -1, -1, 4, -1]  # word 1 (no token) appears nowhere
    assert f.empty_words == 1 and "1 words with no WordPiece token (not trained on, predicted O)" in f.summary()
    assert batch["attention_mask"].tolist() == [[1] * 9] and batch["token_type_ids"].sum() == 0
    # A word's first piece is its first *basic* token too: "U.S." is u . s . (all [UNK] / "." here).
    u = encode_sentences([Sentence(["U.S.", "house"], None, [1, 2])], tok, 128)
    assert u.words[0].tolist() == [-1, 0, -1, -1, -1, 1, -1]


def test_tag_piece_last_reads_a_word_at_its_last_wordpiece_in_every_window(tok):
    s = Sentence(["Walker", ZWSP, "river", "unwalking", "."], ["B-PER", "B-MISC", "B-LOC", "I-LOC", "O"],
                 [1, 2, 3, 4, 5])
    f = encode_sentences([s], tok, 128, piece="last")
    # [CLS] walk ##er river un ##walk ##ing . [SEP]: Walker at ##er, unwalking at ##ing
    assert f.words[0].tolist() == [-1, -1, 0, 2, -1, -1, 3, 4, -1]
    rng = random.Random(0)
    sentences = [Sentence(w, None, list(range(len(w)))) for w in
                 ([rng.choice(PEOPLE + PLACES + FILLER + ["unwalking", ZWSP]) for _ in range(rng.randint(1, 40))]
                  for _ in range(30))]
    flat = [p for s in sentences for p in tok.encode_batch_ids(s.tokens)]
    for length, stride in ((6, 1), (9, 0), (128, 0)):
        f = encode_sentences(sentences, tok, length, stride, piece="last")
        seen = np.concatenate([w[w >= 0] for w in f.words])
        assert sorted(seen.tolist()) == [k for k, p in enumerate(flat) if p]  # every word with a token once
        for ids, w in zip(f.input_ids, f.words):
            assert all(ids[pos] == flat[k][-1] for pos, k in zip(np.flatnonzero(w >= 0), w[w >= 0]))
    with pytest.raises(ValueError, match="piece must be first or last"):
        encode_sentences(sentences, tok, 128, piece="middle")


def test_windows_give_every_word_one_position_in_its_max_context_window(tok):
    words = FILLER[:12]  # one WordPiece each: word k is sub-token k
    f = encode_sentences([Sentence(words, None, list(range(1, 13)))], tok, max_seq_length=10, stride=3)
    ids = tok.encode_batch_ids([" ".join(words)])[0]
    assert [w[1:-1].tolist() for w in f.input_ids] == [ids[0:8], ids[3:11], ids[6:12]]  # windows of 8, every 3
    # min(left, right) context: words 0-5 in window 0 (word 5: 2 vs 2, a tie -> the earlier), 6-8 in
    # window 1 (word 8: 2 vs 2), 9-11 in window 2; each at its own position (+1 for [CLS]).
    assert [w[w >= 0].tolist() for w in f.words] == [[0, 1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert [np.flatnonzero(w >= 0).tolist() for w in f.words] == [[1, 2, 3, 4, 5, 6], [4, 5, 6], [4, 5, 6]]
    assert f.windows.windowed == 1 and f.windows.example.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="stride 9 is longer than a window"):
        encode_sentences([Sentence(words, None, [1] * 12)], tok, max_seq_length=10, stride=9)


def test_long_sentences_get_exactly_one_prediction_per_word(tok):
    rng = random.Random(0)
    sentences = [Sentence(w, None, list(range(len(w)))) for w in
                 ([rng.choice(PEOPLE + PLACES + FILLER + ["unwalking", ZWSP]) for _ in range(rng.randint(1, 40))]
                  for _ in range(30))]
    pieces = [tok.encode_batch_ids(s.tokens) for s in sentences]
    for length, stride in ((6, 1), (9, 0), (16, 5), (128, 0)):
        f = encode_sentences(sentences, tok, length, stride)
        assert max(f.lengths) <= length
        seen = np.concatenate([w[w >= 0] for w in f.words])
        tokenized = [k for k, p in enumerate(p for ps in pieces for p in ps) if p]
        assert sorted(seen.tolist()) == tokenized  # every word with a token exactly once
        for ids, w in zip(f.input_ids, f.words):  # ... at its first WordPiece
            flat = [p for ps in pieces for p in ps]
            assert all(ids[pos] == flat[k][0] for pos, k in zip(np.flatnonzero(w >= 0), w[w >= 0]))
        # A tagger that reads only the token: each word gets the tag of its first WordPiece, whatever the windows.
        model = LookupTagger(tok, ["O", "B-PER", "B-LOC"], {"walk": "B-PER", "sing": "B-PER", "river": "B-LOC"})
        got = predict_tags(model, f, batch_size=7)
        first = [p[0] if p else None for ps in pieces for p in ps]
        want = [-1 if t is None else 1 if t in tok.convert_tokens_to_ids(["walk", "sing"]) else
                2 if t == tok.convert_tokens_to_ids("river") else 0 for t in first]
        assert got.tolist() == want


def test_the_task_sums_cross_entropy_over_one_position_per_word(tok):
    torch.manual_seed(0)
    model = BertForTokenClassification(BertConfig(vocab_size=VOCAB_SIZE, hidden_size=16, num_hidden_layers=1,
                                                  num_attention_heads=2, intermediate_size=16, num_labels=3,
                                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    sentences = [Sentence(["walker", "by", "the", "river"], None, [1, 2, 3, 4]), Sentence(["singing"], None, [6])]
    f = encode_sentences(sentences, tok, 128).with_tags(np.array([1, 0, 0, 2, 1]))
    batch = f.collate([0, 1])
    task = TaggingObjective()
    assert task.counts(batch) == {"tagging": 5.0}
    sums, stats = task.forward(model, batch)
    logits = model(batch["input_ids"], batch["attention_mask"]).logits
    at = batch["labels"] != losses.IGNORE_INDEX
    want = nn.functional.cross_entropy(logits[at], batch["labels"][at], reduction="sum")
    torch.testing.assert_close(sums["tagging"], want)
    assert stats["correct"] == (logits[at].argmax(-1) == batch["labels"][at]).sum()
    assert task.metrics(sums, {"tagging": 5.0}, {"correct": 4.0}) == {"accuracy": 0.8}



def test_tagged_positions_are_each_rows_labelled_tokens_in_order_padded_with_unlabelled_ones():
    labels = torch.tensor([[-100, 3, -100, 1, 2, -100], [-100, -100, 0, -100, -100, -100],
                           [-100, -100, -100, -100, -100, -100]])
    positions, aligned = tagged_positions(labels)
    assert positions.shape == aligned.shape == (3, 3)  # K: the most tags a row has
    assert positions[0].tolist() == [1, 3, 4] and aligned[0].tolist() == [3, 1, 2]
    assert positions[1, 0] == 2 and aligned[1].tolist() == [0, -100, -100]  # padded with untagged positions
    assert aligned[2].tolist() == [-100, -100, -100]
    assert tagged_positions(torch.full((2, 4), -100))[0].shape == (2, 1)  # at least one column


@pytest.mark.parametrize("fast", [False, True])
def test_the_tagger_at_its_tagged_positions_gives_the_full_logits_there_in_training_and_prediction(tok, fast):
    from bertforge.fast import speed_up

    torch.manual_seed(0)
    model = BertForTokenClassification(BertConfig(vocab_size=VOCAB_SIZE, hidden_size=16, num_hidden_layers=2,
                                                  num_attention_heads=2, intermediate_size=16, num_labels=3,
                                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    if fast:
        model = speed_up(model)  # the faster encoder computes the last layer at the positions alone
    sentences = [Sentence(["walker", "by", "the", "riverside"], None, [1, 2, 3, 4]), Sentence(["singing"], None, [6])]
    f = encode_sentences(sentences, tok, 128, piece="last").with_tags(np.array([1, 0, 0, 2, 1]))
    batch = f.collate([0, 1])
    full = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits  # (B, T, C)
    positions, labels = tagged_positions(batch["labels"])
    at = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], positions=positions).logits
    torch.testing.assert_close(at, full.gather(1, positions[..., None].expand(-1, -1, 3)), atol=1e-5, rtol=1e-5)
    every = TaggingObjective(tagged_only=False).forward(model, batch)
    tagged = TaggingObjective().forward(model, batch)
    torch.testing.assert_close(tagged[0]["tagging"], every[0]["tagging"], atol=1e-5, rtol=1e-5)
    assert tagged[1]["correct"] == every[1]["correct"]

    class Everywhere(nn.Module):  # the same model without the positions: it answers at every token
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, *args: torch.Tensor) -> object:
            return self.inner(*args)

    assert predict_tags(model, f, 2).tolist() == predict_tags(Everywhere(), f, 2).tolist() == \
        full[batch["labels"] != -100].argmax(-1).tolist()

# ------------------------------------------------------------------------------ metrics on fixed inputs
DEV = ("walker B-PER\nriver B-LOC\nthe O\nsinger B-PER\npainter I-PER\n\n"
       f"the O\ncity B-LOC\nriver I-LOC\na O\n{ZWSP} B-MISC\n")
LABELS = ["O", "B-LOC", "B-MISC", "B-PER", "I-LOC", "I-PER"]
TABLE = {"walk": "B-PER", "sing": "B-PER", "paint": "B-PER", "river": "B-LOC", "city": "B-LOC"}


@pytest.mark.parametrize("max_seq_length", [128, 5])
def test_evaluate_gives_the_conlleval_scores_counted_by_hand(tmp_path, tok, base, max_seq_length):
    """Predicted: walker/B-PER river/B-LOC the/O singer/B-PER painter/B-PER | the/O city/B-LOC river/B-LOC
    a/O zwsp/O. Gold entities: PER(0,1) LOC(1,2) PER(3,5) | LOC(1,3) MISC(4,5) = 5; predicted: PER(0,1)
    LOC(1,2) PER(3,4) PER(4,5) | LOC(1,2) LOC(2,3) = 6; right: PER(0,1), LOC(1,2) = 2. P 2/6, R 2/5,
    F1 2*2/(5+6) = 4/11; tokens right 7/10. PER: 1 right of 2 true, 3 predicted -> F1 2/5; LOC 1 of 2, 3
    -> 2/5; MISC 0. The same at length 5 (windows of 3 sub-tokens): predictions do not depend on windows."""
    family = family_for("ner")
    cfg = family.configure(config(base, tmp_path, max_seq_length=max_seq_length, stride=1 if max_seq_length == 5
                                  else 0))
    dev = write(tmp_path / "dev.conll", DEV)
    data = family.eval_data(cfg, tok, dev, {t: i for i, t in enumerate(LABELS)})
    assert len(data.data[0]) == (2 if max_seq_length == 128 else 6 + 2)  # 8 and 4 sub-tokens, windows of 3 every 1
    result = family.evaluate(LookupTagger(tok, LABELS, TABLE), data, cfg, torch.device("cpu"))
    assert result.main == "f1"
    assert result.metrics == pytest.approx({"precision": 1 / 3, "recall": 2 / 5, "f1": 4 / 11, "accuracy": 0.7,
                                            "f1_LOC": 0.4, "f1_MISC": 0.0, "f1_PER": 0.4})
    assert result.files == {"predictions.conll": (
        "walker B-PER B-PER\nriver B-LOC B-LOC\nthe O O\nsinger B-PER B-PER\npainter I-PER B-PER\n\n"
        f"the O O\ncity B-LOC B-LOC\nriver I-LOC B-LOC\na O O\n{ZWSP} B-MISC O\n\n")}
    pos = family_for("tagging").evaluate(LookupTagger(tok, ["O", "NN", "B-PER"], {"walk": "NN"}),
                                         family.eval_data(cfg, tok, write(tmp_path / "pos.tsv", "walker\tNN\nby\tO\n"),
                                                          {"O": 0, "NN": 1, "B-PER": 2}),
                                         family.configure(config(base, tmp_path, task="tagging")), "cpu")
    assert pos.metrics == {"accuracy": 1.0} and pos.main == "accuracy"  # not entity tags: token accuracy


def test_a_gold_tag_the_model_was_not_trained_on_is_scored_as_missed_with_a_warning(tmp_path, tok, base, caplog):
    """Gold B-movie / I-movie, which the model cannot predict: conlleval's scores with those entities
    missed. Predicted: walker/B-PER river/B-LOC the/O singer/O painter/O | the/O city/O. Gold entities:
    PER LOC movie(3,5) | movie(1,2) = 4, predicted 2, both right: P 1, R 2/4, F1 2/3; tokens right 4/7."""
    family = family_for("ner")
    cfg = family.configure(config(base, tmp_path))
    labels = ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
    dev = write(tmp_path / "dev.conll", "walker B-PER\nriver B-LOC\nthe O\nsinger B-movie\npainter I-movie\n\n"
                                        "the O\ncity B-movie\n")
    with caplog.at_level("WARNING", logger="bertforge"):
        data = family.eval_data(cfg, tok, dev, {t: i for i, t in enumerate(labels)})
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"{dev}: 3 words carry tags the model was not trained on ('B-movie': 2, 'I-movie': 1): it "
                        "cannot predict them, so those words count as wrong and their entities as missed"]
    result = family.evaluate(LookupTagger(tok, labels, {"walk": "B-PER", "river": "B-LOC"}), data, cfg, "cpu")
    assert result.metrics == pytest.approx({"precision": 1.0, "recall": 0.5, "f1": 2 / 3, "accuracy": 4 / 7,
                                            "f1_LOC": 1.0, "f1_PER": 1.0, "f1_movie": 0.0})
    assert result.files["predictions.conll"].splitlines()[3:5] == ["singer B-movie O", "painter I-movie O"]
    # An unseen tag the model's scheme cannot read is still an error naming file and line.
    bad = write(tmp_path / "bad.conll", "walker B-PER\nriver S-LOC\n")
    with pytest.raises(ValueError, match=r"bad\.conll:2: tag 'S-LOC' is not valid in scheme 'BIO'"):
        family.eval_data(cfg, tok, bad, {t: i for i, t in enumerate(labels)})
    # Outside evaluation (training reads its own tag set) a tag missing from the map stays an error.
    with pytest.raises(ValueError, match=r"dev\.conll:4: unknown tag 'B-movie'"):
        tag_ids(read_sentences(dev)[0], dev, {t: i for i, t in enumerate(labels)})


# ------------------------------------------------------------------------------ learning
@pytest.fixture(scope="module")
def learned(root, base) -> tuple[Path, Path, Path]:
    """A generated CoNLL-2003 NER task (people: PER, places: LOC) learned by the tiny model, with windows
    of 16 (some sentences are longer)."""
    rng = random.Random(1)
    train = write_conll(root / "train.conll", [ner_sentence(rng) for _ in range(96)])
    dev = write_conll(root / "dev.conll", [ner_sentence(rng) for _ in range(24)])
    out = root / "ner"
    finetune(config(base, out, train_file=str(train), dev_file=str(dev), max_seq_length=16, epochs=14,
                    checkpoint_every=1000, log_every=6))
    return out, train, dev


def test_a_tiny_model_learns_a_tiny_ner_task(learned):
    out, train, dev = learned
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train_lines = [r for r in lines if r["split"] == "train"]
    assert train_lines[0]["accuracy"] < 0.9 and train_lines[-1]["accuracy"] >= 0.97
    run = json.loads((out / "run_config.json").read_text())
    assert run["labels"] == ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
    best = json.loads((out / "best" / "eval_metrics.json").read_text())
    assert best["metric"] == "f1" and best["value"] >= 0.9
    assert set(best["metrics"]) == {"precision", "recall", "f1", "accuracy", "f1_LOC", "f1_PER"}
    on_train = evaluate(out / "best", file=train)
    assert on_train["f1"] >= 0.97  # near-perfect on the training data
    assert evaluate(out / "best", file=dev) == pytest.approx(best["metrics"], abs=1e-9)
    # The dev predictions beside the best model: the dev words in order, gold and predicted tag.
    conll = (out / "best" / "predictions.conll").read_text()
    blocks = [b.splitlines() for b in conll.split("\n\n") if b]
    gold = [s for s in read_sentences(dev)[0]]
    assert [[r.split(" ")[:2] for r in b] for b in blocks] == [[[w, t] for w, t in zip(s.tokens, s.tags)]
                                                                  for s in gold]
    assert all(len(r.split(" ")) == 3 for b in blocks for r in b)
    settings = json.loads((out / "best" / "config.json").read_text())["bertforge_finetune"]
    assert settings == {"task": "ner", "max_seq_length": 16, "stride": 0, "tag_column": -1, "tag_scheme": "auto",
                        "tag_piece": "first", "label_names": ""}


def test_a_run_whose_dev_file_has_an_unseen_tag_scores_it_at_every_evaluation(root, base, caplog):
    rng = random.Random(5)
    train = write_conll(root / "unseen-train.conll", [ner_sentence(rng) for _ in range(16)])
    dev = write(root / "unseen-dev.conll", "walker B-PER\nriver B-LOC\n\nthe O\nsinger B-movie\npainter I-movie\n")
    out = root / "unseen-run"
    with caplog.at_level("INFO", logger="bertforge"):
        result = finetune(config(base, out, train_file=str(train), dev_file=str(dev), max_steps=4, eval_every=2,
                                 batch_size=8))
    warned = [r.getMessage() for r in caplog.records if "not trained on" in r.getMessage()]
    assert warned == [f"{dev}: 2 words carry tags the model was not trained on ('B-movie': 1, 'I-movie': 1): it "
                      "cannot predict them, so those words count as wrong and their entities as missed"]
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["f1_movie"] for r in evals if r["split"] == "eval"] == [0.0, 0.0]
    assert result.best["metrics"]["recall"] <= 2 / 3  # the movie entity is never found
    conll = (out / "best" / "predictions.conll").read_text()
    assert "singer B-movie " in conll and "painter I-movie " in conll


def test_a_fine_tuned_model_keeps_the_word_piece_it_was_trained_to_read(learned, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(learned[0] / "best", folder)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["bertforge_finetune"]["tag_piece"] == "first"
    assert load_finetuned(folder).settings.tag_piece == "first"
    cfg["bertforge_finetune"]["tag_piece"] = "last"
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_finetuned(folder).settings.tag_piece == "last"
    # The weights' choice, not a setting of evaluation:
    with pytest.raises(ValueError, match="tag_piece: the checkpoint.s own"):
        load_finetuned(folder, {"tag_piece": "first"})


def test_the_fine_tuned_folder_is_transformers_bert_for_token_classification(learned, tmp_path):
    out, _, dev = learned
    folder = out / "best"
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["BertForTokenClassification"]
    assert cfg["id2label"] == {"0": "O", "1": "B-LOC", "2": "B-PER", "3": "I-LOC", "4": "I-PER"}
    theirs = transformers.BertForTokenClassification.from_pretrained(folder).eval()
    ours = BertForTokenClassification.from_pretrained(folder).eval()
    assert theirs.config.label2id == {"O": 0, "B-LOC": 1, "B-PER": 2, "I-LOC": 3, "I-PER": 4}
    tok = BertTokenizer.from_pretrained(folder)
    f = encode_sentences(read_sentences(dev)[0][:6], tok, 16)
    batch = f.collate(range(len(f)))
    with torch.no_grad():
        a = ours(**{k: v for k, v in batch.items() if k != "labels"}).logits
        b = theirs(**{k: v for k, v in batch.items() if k != "labels"}).logits
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=0)
    # predict(): one record per sentence with its entities; CoNLL columns or JSONL.
    test = write(tmp_path / "test.txt", "\n".join(" ".join(s.tokens).replace(" ", "\n") + "\n"
                                                  for s in read_sentences(dev)[0]))
    records = predict(folder, test, tmp_path / "p.conll")
    gold = read_sentences(dev)[0]
    assert len(records) == len(gold) and [r["tokens"] for r in records] == [s.tokens for s in gold]
    assert [r["line"] for r in records] == np.cumsum([1] + [len(s.tokens) + 1 for s in gold[:-1]]).tolist()
    right = sum(r["tags"] == s.tags for r, s in zip(records, gold))
    assert right >= 0.8 * len(gold)
    r = next(r for r in records if r["entities"])
    e = r["entities"][0]
    a, b = e["word_start"], e["word_end"]  # words, not characters: not the text predictions' start / end
    assert r["tags"][a] == f"B-{e['type']}" and e["text"] == " ".join(r["tokens"][a:b])
    assert e["score"] == pytest.approx(np.mean(r["scores"][a:b]))
    assert set(records[0]) == {"index", "line", "tokens", "tags", "scores", "entities"} and records[3]["index"] == 3
    assert all(len(r["scores"]) == len(r["tokens"]) and all(0 < p <= 1 for p in r["scores"]) for r in records)
    text = (tmp_path / "p.conll").read_text()
    assert text.split("\n\n")[0].splitlines() == [f"{w} {t}" for w, t in zip(records[0]["tokens"],
                                                                               records[0]["tags"])]
    assert text.endswith("\n\n") and text.count("\n\n") == len(records)
    predict(folder, test, tmp_path / "p.jsonl")
    assert json.loads((tmp_path / "p.jsonl").read_text().splitlines()[2]) == records[2]


def test_cli_finetune_evaluate_predict_ner(root, base, capsys):
    rng = random.Random(4)
    train = write_conll(root / "cli-train.conll", [ner_sentence(rng) for _ in range(16)])
    out = root / "cli-run"
    assert cli.main(["finetune", "--task", "ner", "--model", str(base), "--train-file", str(train),
                     "--dev-file", str(train), "--out", str(out), "--max-steps", "2", "--batch-size", "8",
                     "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "5 labels (O, B-LOC, B-PER, I-LOC, I-PER)" in printed and "scheme BIO" in printed
    assert {"f1", "precision", "recall", "accuracy"} <= set(json.loads(printed.strip().splitlines()[-1]))
    assert cli.main(["evaluate", str(out / "model"), "--file", str(train), "--out", str(root / "cli-eval")]) == 0
    assert {"f1", "accuracy"} <= set(json.loads(capsys.readouterr().out))
    assert (root / "cli-eval" / "predictions.conll").read_text().count("\n\n") == 16
    assert cli.main(["predict", str(out / "model"), str(train), "--out", str(root / "cli.conll")]) == 0
    blocks = [b for b in (root / "cli.conll").read_text().split("\n\n") if b]
    assert len(blocks) == 16 and all(len(row.split(" ")) == 2 for b in blocks for row in b.splitlines())
    unseen = write(root / "cli-unseen.conll", "walker B-PER\nriver B-TIME\n")  # a type the model never saw
    assert cli.main(["evaluate", str(out / "model"), "--file", str(unseen)]) == 0
    got = capsys.readouterr()
    metrics = json.loads(got.out.splitlines()[-1])
    assert metrics["f1_TIME"] == 0.0 and metrics["recall"] <= 0.5
    assert "cli-unseen.conll: 1 word carries a tag the model was not trained on ('B-TIME': 1)" in got.err
    bad = write(root / "cli-bad.conll", "walker B-PER\nriver TIME\n")
    assert cli.main(["evaluate", str(out / "model"), "--file", str(bad)]) == 2
    assert "cli-bad.conll:2: tag 'TIME' is not valid in scheme 'BIO'" in capsys.readouterr().err
