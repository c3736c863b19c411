"""A time budget for a benchmark run in parts, for a lent accelerator whose minutes are few.

A part runs only if the time it is expected to take still fits: its estimate is how long the last part of
the same kind took, or, for a kind not yet seen, the longest part so far (nothing is known before the first
part, which always runs). A part that would overrun is skipped and the result says so, with the estimate
and the seconds left. After every part the result so far is written to a file atomically, so a run killed
at its time limit still leaves every finished part's figures.
"""

import json
import time
from pathlib import Path


class Budget:
    def __init__(self, seconds, clock=time.monotonic):
        self.seconds, self.clock = seconds, clock
        self.start = clock()
        self.durations = {}  # kind -> seconds its last part took

    def elapsed(self):
        return self.clock() - self.start

    def left(self):
        return self.seconds - self.elapsed()

    def estimate(self, kind):
        return self.durations.get(kind, max(self.durations.values(), default=0.0))

    def run(self, kind, part):  # -> part()'s result, or {"skipped": why} when it would overrun
        estimate, left = self.estimate(kind), self.left()
        if estimate > left:
            return {"skipped": f"over the time budget: a {kind} part is expected to take {estimate:.1f} s, "
                               f"{max(left, 0.0):.1f} s of {self.seconds:g} s were left"}
        start = self.clock()
        result = part()
        self.durations[kind] = self.clock() - start
        return result


def write_json_atomically(path, result):
    """Write result as JSON to path (if any) under a temporary name, then rename it into place."""
    if path is None:
        return
    path = Path(path)
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(json.dumps(result, indent=1) + "\n")
    temporary.replace(path)
