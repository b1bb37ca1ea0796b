"""The end-to-end demo on real data: a vocab, pre-training and fine-tuning on 2 CPU cores."""

from bertforge.demo.run import DemoConfig, run_demo

__all__ = ["DemoConfig", "run_demo"]
