"""The paper's experiments: ablation studies run from study files (``bertforge ablate``)."""
