"""Models that record each call: when it ran and what the KV cache did (`RecordingModel`, notebook 3's timeline in
timeline.py), and also what it was given and returned (`TracingModel`, the page's replay in trace.py).

They import no plotting library, so main.py's --html can record a run with the runtime dependencies alone.
"""

import time
from dataclasses import dataclass

import numpy as np

from kvcache import contract


@dataclass
class Call:
    role: str  # "draft" or "target"
    start: float  # time.perf_counter() seconds
    end: float
    n_last: int  # positions scored: 1 for a draft step, K + 1 for a verification
    cached_before: int  # tokens the KV cache held before the call (len(model.cached_tokens))
    kept: int  # the prefix of them the call kept: the cache rolls back to it
    fed: int  # tokens fed after that prefix; the cache holds kept + fed afterwards

    @property
    def seconds(self):
        return self.end - self.start


class RecordingModel:
    """A GPT2Model that appends a Call to `calls` for each forward pass; its logits are the model's own."""

    def __init__(self, model, role, calls):
        self.model, self.role, self.calls = model, role, calls
        self.n_vocab, self.n_ctx = model.n_vocab, model.n_ctx

    def reset(self):
        self.model.reset()

    def logits(self, x, n_last=1):  # [n_seq] -> [n_last, n_vocab]
        cached_before = len(self.model.cached_tokens)
        kept, fed = contract.cache_resume(self.model.cached_tokens, np.asarray(x), n_last)  # what the call will do
        start = time.perf_counter()
        logits = self.model.logits(x, n_last)
        self.calls.append(Call(self.role, start, time.perf_counter(), n_last, cached_before, kept, len(fed)))
        return logits


class TracingModel(RecordingModel):
    """A RecordingModel that also keeps, for each call, the tokens it read and the logits it returned: `inputs`
    runs parallel to `calls` (one shared list for the draft and the target, in call order)."""

    def __init__(self, model, role, calls, inputs):
        super().__init__(model, role, calls)
        self.inputs = inputs

    def logits(self, x, n_last=1):  # [n_seq] -> [n_last, n_vocab]
        logits = super().logits(x, n_last)
        self.inputs.append((np.array(x, dtype=np.int64), np.array(logits, dtype=np.float32)))
        return logits
