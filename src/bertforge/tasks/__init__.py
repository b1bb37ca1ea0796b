"""Fine-tuning tasks: how a task's files become examples, features, batches, losses and metrics.

Each task plugs into the shared loop of `bertforge.trainer`; the recipe that drives them is
`bertforge.finetune`.

    classification  single sentence or pair -> one label, or a score (regression); GLUE's files
"""

from bertforge.tasks.classification import (
    GLUE_TASKS,
    ClassificationTask,
    Example,
    FeatureBatches,
    Features,
    GlueTask,
    ReadReport,
    encode_examples,
    glue_files,
    read_examples,
)

__all__ = ["GLUE_TASKS", "ClassificationTask", "Example", "FeatureBatches", "Features", "GlueTask", "ReadReport",
           "encode_examples", "glue_files", "read_examples"]
