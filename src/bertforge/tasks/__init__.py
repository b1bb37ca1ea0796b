"""Fine-tuning tasks: how a task's files become examples, encoded inputs, batches, losses, metrics and
prediction files. Each family fulfils `bertforge.tasks.base.TaskFamily` and reads its settings from
`bertforge.tasks.base.TaskSettings`; what the families share once their files are read (windows,
batches, prediction over encoded inputs) is `bertforge.tasks.encoding`. The fine-tuning run that drives them
through the shared loop is `bertforge.tasks.finetune`, which no family imports.

    classification   single sentence or pair -> one label, or a score (regression); GLUE's files
    tagging          one tag per word (NER: ner; any tag set: tagging); CoNLL column files
    multiple_choice  a context and C choices -> the right one; SWAG's CSVs
    squad            extractive QA: a question and a context -> an answer span (or none); SQuAD v1.1 / v2.0 JSON
"""

from bertforge.tasks.base import EvalData, EvalResult, ReadReport, TaskFamily, TaskSettings, TrainData
from bertforge.tasks.classification import (GLUE_TASKS, ClassificationFamily, ClassificationObjective, Example,
                                            GlueDataset, encode_examples, glue_files, read_examples)
from bertforge.tasks.encoding import EncodedBatches, Windows
from bertforge.tasks.multiple_choice import MultipleChoiceFamily
from bertforge.tasks.squad import SquadFamily
from bertforge.tasks.tagging import TaggingFamily

FAMILIES: tuple[TaskFamily, ...] = (ClassificationFamily(), MultipleChoiceFamily(), TaggingFamily(), SquadFamily())
"""Every family; a ``--task`` name belongs to exactly one."""


def task_names() -> list[str]:
    return [name for family in FAMILIES for name in family.tasks]


def family_for(task: str) -> TaskFamily:
    """The family handling ``--task task``."""
    for family in FAMILIES:
        if task in family.tasks:
            return family
    raise ValueError(f"unknown task {task!r}; choose one of: {', '.join(task_names())}")


__all__ = ["FAMILIES", "family_for", "task_names", "TaskFamily", "TaskSettings", "TrainData", "EvalData",
           "EvalResult", "EncodedBatches", "Windows", "ReadReport", "GLUE_TASKS", "ClassificationFamily",
           "ClassificationObjective", "Example", "GlueDataset", "encode_examples", "glue_files", "read_examples",
           "TaggingFamily", "MultipleChoiceFamily", "SquadFamily"]
