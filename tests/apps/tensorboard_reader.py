"""Reads a TensorBoard log directory with the tensorboard package's own event
loader, the reader that `wandb sync DIR` imports a TensorBoard run with, and
prints {tag: [[step, value], ...]} as JSON on stdout.

  tensorboard_reader.py LOG_DIR
"""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

accumulator = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})  # 0: keep every event
accumulator.Reload()
print(json.dumps({tag: [[event.step, event.value] for event in accumulator.Scalars(tag)]
                  for tag in accumulator.Tags()["scalars"]}))
