"""Data held in memory as task files. `finetune`, `evaluate` and `predict` take, besides a path, a
`datasets.Dataset`, a pandas DataFrame, a list of records (dicts) or a dict of columns; it is written once
in the family's own format and read by the same reader as a file, so every check and message is the
file's. A run keeps what it was given in ``OUT/inputs/`` (its record points there: it resumes from its
folder, wherever the folder has moved). `datasets` and pandas are never imported: their objects are
recognised by what they offer.

    classification, multiple choice   JSON lines, one record per row (columns as --text-column & co. name)
    tagging                           CoNLL columns from a list of words and a list of tags per row
                                      ("tokens" and "ner_tags" / "tags" / "labels", or --text-column /
                                      --label-column)
    squad                             SQuAD JSON from flat rows (id, context, question, answers as
                                      `datasets` writes them: {"text": [...], "answer_start": [...]}) or
                                      the nested {"data": [...]} form itself

A `datasets` ClassLabel column gives its names: a classifier's labels are named in the ClassLabel's order
(unless --label-names names them), a tag column's ids become the tag names.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bertforge.io import atomic_write_text

__all__ = ["TAG_COLUMNS", "is_in_memory", "rows_of", "input_suffix", "input_text", "write_input", "temporary_input",
           "of_the_data"]

TAG_COLUMNS = ("ner_tags", "tags", "labels", "label", "pos_tags")
"""Where a tagging row's tags are looked for, in order, unless --label-column names the column."""
_SUFFIX = {"classification": ".jsonl", "multiple_choice": ".jsonl", "tagging": ".conll", "squad": ".json"}


def is_in_memory(data: Any) -> bool:
    """Whether ``data`` is data rather than a path (a str, a Path or an os.PathLike)."""
    return data is not None and not isinstance(data, (str, bytes, os.PathLike))


def rows_of(data: Any) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """The rows of ``data`` as dicts, and the names of its ClassLabel columns (column -> names in id order;
    a sequence of ClassLabel, as a tag column is, gives its element's names)."""
    names: dict[str, list[str]] = {}
    features = getattr(data, "features", None)
    if features is not None and hasattr(data, "column_names"):  # a datasets.Dataset
        for column, feature in features.items():
            inner = getattr(feature, "feature", feature)
            if isinstance(getattr(inner, "names", None), list):
                names[column] = list(inner.names)
        return [dict(row) for row in data], names
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a pandas DataFrame
        return data.to_dict(orient="records"), names
    if isinstance(data, Mapping):  # columns
        _check_columns(data)
        columns = {k: list(v) for k, v in data.items()}
        lengths = {len(v) for v in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths: {', '.join(f'{k}: {len(v)}' for k, v in columns.items())}")
        return [dict(zip(columns, values)) for values in zip(*columns.values())], names
    if isinstance(data, Sequence) and all(isinstance(r, Mapping) for r in data):
        return [dict(r) for r in data], names
    raise TypeError(f"expected a file path, a datasets.Dataset, a pandas DataFrame, a list of records (dicts) or a "
                    f"dict of columns; got {type(data).__name__}")


def _check_columns(data: Mapping[Any, Any]) -> None:
    """A TypeError saying what to pass where a dict is not columns: a `datasets.DatasetDict` (its splits), or
    one record (a text where a column of texts belongs would be read as its characters)."""
    splits = [k for k, v in data.items() if hasattr(v, "column_names")]
    if splits:
        raise TypeError(f"a dict of datasets (a DatasetDict of {', '.join(map(repr, data))}); pass one split, "
                        f"e.g. data[{splits[0]!r}]")
    for k, v in data.items():
        if isinstance(v, (str, bytes, Mapping)) or not hasattr(v, "__len__"):
            raise TypeError(f"column {k!r} is {type(v).__name__} {v!r:.50}, not a list: a dict is read as columns "
                            "of equal length; pass one record as a list of records, [{...}]")


def input_suffix(task: str) -> str:
    """The suffix of the file data for ``task`` is written as."""
    from bertforge.tasks import family_for

    return _SUFFIX[family_for(task).name]


def _plain(value: Any) -> Any:
    """numpy and pandas scalars and arrays as JSON's types."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a value of type {type(value).__name__} is not JSON data")


def _json_lines(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False, default=_plain) + "\n" for row in rows)


def _classification(rows: list[dict[str, Any]], names: dict[str, list[str]], cfg: Any) -> tuple[str, str]:
    """JSON lines, and the label names a ClassLabel column gives ("" when none or --label-names is set). A GLUE
    task whose labels are words (MNLI's entailment, ...) gets the names themselves; -1 is no label."""
    from bertforge.tasks.classification import GLUE_TASKS

    glue = GLUE_TASKS.get(cfg.task)
    column = cfg.label_column or (glue.label if glue else "label")
    label_names = names.get(column)
    if not label_names:
        return _json_lines(rows), ""
    for row in rows:
        if row.get(column) == -1:  # `datasets`' test splits: no label
            row[column] = None
    if glue is not None and glue.labels is not None and set(label_names) <= set(glue.labels):
        for row in rows:
            if isinstance(row.get(column), int):
                row[column] = label_names[row[column]]
        return _json_lines(rows), ""
    if cfg.label_names or (glue is not None and glue.labels is not None):
        return _json_lines(rows), ""
    return _json_lines(rows), _joined(label_names, column, "labels")


def _joined(names: list[str], column: str, what: str) -> str:
    """A ClassLabel column's names as ``label_names`` writes them (comma-separated, in id order)."""
    if any("," in n or not n.strip() for n in names):
        raise ValueError(f"the ClassLabel names of column {column!r} hold a comma or are empty ({names}); name the "
                         f"{what} with label_names")
    return ",".join(names)


def _tagging(rows: list[dict[str, Any]], names: dict[str, list[str]], cfg: Any, require_tags: bool
             ) -> tuple[str, str]:
    """CoNLL columns: a word and its tag per line, a blank line after each sentence; and the tag names a
    ClassLabel column gives, in its order, for the model's tag ids ("" when none or label_names is set)."""
    words_key = cfg.text_column or "tokens"
    tags_key = cfg.label_column or next((k for k in TAG_COLUMNS if rows and k in rows[0]), TAG_COLUMNS[0])
    tag_names = names.get(tags_key)
    lines = []
    for n, row in enumerate(rows, 1):
        if words_key not in row or (require_tags and tags_key not in row):
            need = f"{words_key!r}" + (f" and {tags_key!r}" if require_tags else "")
            raise ValueError(f"row {n}: needs {need} (keys: {', '.join(map(str, row))})")
        words = list(row[words_key])
        tags = [tag_names[t] if tag_names else t for t in row[tags_key]] if require_tags else None
        if tags is not None and len(tags) != len(words):
            raise ValueError(f"row {n}: {len(words)} words but {len(tags)} tags")
        for k, word in enumerate(words):
            word = str(word)
            if not word.strip() or "\t" in word or "\n" in word:
                raise ValueError(f"row {n}: word {k} {word!r} is empty or holds a tab or line break")
            lines.append(f"{word}\t{tags[k]}" if tags is not None else word)
        lines.append("")
    return "\n".join(lines) + "\n", _joined(tag_names, tags_key, "tags") if tag_names and not cfg.label_names else ""


def _answers(value: Any) -> list[dict[str, Any]]:
    """SQuAD's answer list from `datasets`' {"text": [...], "answer_start": [...]} or a list of answers."""
    if isinstance(value, Mapping):
        return [{"text": t, "answer_start": s} for t, s in zip(value.get("text", []), value.get("answer_start", []))]
    return list(value or [])


def _squad(rows: list[dict[str, Any]], version: str) -> str:
    """SQuAD JSON: paragraphs of consecutive rows sharing a context, articles of consecutive titles."""
    if len(rows) == 1 and "data" in rows[0]:
        return json.dumps(rows[0], ensure_ascii=False, default=_plain)
    articles: list[dict[str, Any]] = []
    for n, row in enumerate(rows, 1):
        missing = [k for k in ("id", "context", "question") if k not in row]
        if missing:
            raise ValueError(f"row {n}: no {', '.join(missing)} (keys: {', '.join(map(str, row))})")
        title = row.get("title", "")
        if not articles or articles[-1]["title"] != title:
            articles.append({"title": title, "paragraphs": []})
        paragraphs = articles[-1]["paragraphs"]
        if not paragraphs or paragraphs[-1]["context"] != row["context"]:
            paragraphs.append({"context": row["context"], "qas": []})
        qa = {"id": row["id"], "question": row["question"], "answers": _answers(row.get("answers"))}
        if version == "2.0":
            qa["is_impossible"] = not qa["answers"]
        paragraphs[-1]["qas"].append(qa)
    return json.dumps({"version": version, "data": articles}, ensure_ascii=False, default=_plain)


def input_text(data: Any, cfg: Any, split: str, labelled: bool = True) -> tuple[str, str]:
    """``data`` as the text of a file of ``cfg.task``'s family, and the label names its ClassLabel column gives
    (""); an error names the ``split``."""
    from bertforge.tasks import family_for

    family = family_for(cfg.task).name
    try:
        rows, names = rows_of(data)
        if not rows:
            raise ValueError("no rows")
        if family == "classification":
            text, label_names = _classification(rows, names, cfg)
        elif family == "tagging":
            text, label_names = _tagging(rows, names, cfg, labelled)
        elif family == "squad":
            text, label_names = _squad(rows, "2.0" if cfg.task == "squad2" else "1.1"), ""
        else:
            text, label_names = _json_lines(rows), ""
        _check_unicode(text, "row" if family in ("classification", "multiple_choice") else "line")
        return text, label_names
    except (ValueError, TypeError) as e:
        raise type(e)(f"{split} data: {e}") from None


def _check_unicode(text: str, unit: str) -> None:
    """A ValueError naming the row (or the line of the file written) of a lone surrogate, which no file can
    hold: text decoded with ``errors="surrogateescape"``, or half of a character cut apart."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        where = text.count("\n", 0, e.start) + 1
        raise ValueError(f"{unit} {where}: a lone surrogate {text[e.start]!r}, which is not Unicode text "
                         "(decoded with errors='surrogateescape', or half of a character cut off?)") from None


def write_input(text: str, cfg: Any, folder: Path, split: str, *, resume: bool = False) -> Path:
    """``text`` (`input_text`) written as ``folder/split.<suffix>``; on ``resume`` the file must hold the same."""
    path = folder / f"{split}{input_suffix(cfg.task)}"
    if resume and path.is_file() and path.read_text(encoding="utf-8") != text:
        raise ValueError(f"{split} data differs from what the run in {folder.parent} was started with ({path}); "
                         "resume with the same data, or start afresh")
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return path


@contextmanager
def temporary_input(data: Any, cfg: Any, split: str, *, labelled: bool) -> Iterator[Path]:
    """A path for ``data``: the path itself, or the data written to a temporary file for the block's length."""
    if not is_in_memory(data):
        yield Path(data)
        return
    with tempfile.TemporaryDirectory(prefix="bertforge-") as tmp:
        path = write_input(input_text(data, cfg, split, labelled)[0], cfg, Path(tmp), split)
        try:
            yield path
        except ValueError as e:  # the reader's message, about the data given rather than a file deleted now
            raise type(e)(of_the_data(str(e), path, split)) from None


def of_the_data(message: str, path: Path, split: str) -> str:
    """A reader's ``message`` about the file ``path`` the ``split`` data given in memory was written to, said
    of the data: "train data, row 3: ..." where the file holds a row a line (JSON lines), else "train data
    (written as CoNLL), line 7"."""
    rows = path.suffix == ".jsonl"
    where = re.compile(re.escape(str(path)) + r":(\d+)")
    message = where.sub(lambda m: f"{split} data, {'row' if rows else 'line'} {m.group(1)}", message)
    as_what = {".conll": "CoNLL", ".json": "SQuAD JSON"}.get(path.suffix, "")
    return message.replace(str(path), f"{split} data" + (f" (written as {as_what})" if as_what else ""))
