"""Checkpoints in and out: canonical folders, Google's TensorFlow release, ONNX."""
