"""Streaming: the stored on_content callback and the per-call one both see every chunk.

    python examples/03_streaming.py
"""

import sys

import robot_lab

robot = robot_lab.build(name="narrator", on_content=lambda chunk: sys.stdout.write(chunk.content))
result = robot.run("streams arrive word by word", on_content=lambda chunk: None)
print(f"\n({result.output_tokens} output tokens)")
