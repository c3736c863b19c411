"""Random numbers known only through the decoder's comparisons: the choice points of classroom/exact_law.py.

A SymbolicUniform stands for a uniform U on [0, 1) whose value is not drawn: the Path of the current run holds
the interval [lo, hi) that U is known to lie in. Comparing U (or a monotone function of it: a * U + b, log,
exp) with a float t either follows from the interval or splits it: a choice point, whose branch the Path takes
from its script, and whose probability, (t - lo) / (hi - lo) for U < t, multiplies the path's weight. An
inverse-CDF draw (sampling.sample calls u.inverse_cdf(probs)) branches over the tokens in the same way.
EnumeratingGenerator hands out these numbers in place of a numpy Generator; its copies share the Path and read
the same numbers, as copies of a numpy Generator do.
"""

import functools
import math
from fractions import Fraction
from itertools import accumulate

import numpy as np


class OracleCannotFollow(TypeError):
    """The decoder used a symbolic uniform number in a way the exact oracle cannot follow."""


def is_number(value):
    return isinstance(value, (int, float, Fraction, np.integer, np.floating)) and not isinstance(value, bool)


def exact(value):  # a finite number -> the Fraction of exactly its value; infinities stay floats
    value = value if isinstance(value, Fraction) else float(value)
    return value if isinstance(value, float) and math.isinf(value) else Fraction(value)


@functools.lru_cache(maxsize=100_000)  # the same rows come back in every run
def cdf_steps(probs_bytes, dtype):  # -> [(token, C_(k-1), C_k)] for the tokens of positive probability
    weights = [Fraction(float(value)) for value in np.frombuffer(probs_bytes, dtype)]
    total = sum(weights)
    ends = [cumulative / total for cumulative in accumulate(weights)]
    starts = [Fraction(0)] + ends[:-1]
    return [(token, starts[token], ends[token]) for token, weight in enumerate(weights) if weight]


class Path:
    """The decisions of one run: a script to follow, then the first branch at every new choice point.

    states[i] is what is known of the i-th uniform: (lo, hi, lo_closed) with U in [lo, hi) (or (lo, hi) when
    lo is open); lo == hi is the point U == lo, a branch of probability zero.
    """

    def __init__(self, script):
        self.script = script
        self.taken = []  # (branch taken, number of branches) at each choice point, in order
        self.weight = Fraction(1)  # the product of the branches' probabilities
        self.states = []

    def new_uniform(self):
        self.states.append((Fraction(0), Fraction(1), True))
        return len(self.states) - 1

    def choose(self, branches):  # [(probability, payload)] -> the payload of the branch this run takes
        if len(branches) > 1:
            depth = len(self.taken)
            index = self.script[depth] if depth < len(self.script) else 0
            self.taken.append((index, len(branches)))
        else:
            index = 0
        probability, payload = branches[index]
        self.weight *= probability
        return payload

    def next_script(self):  # the next path depth first: the last choice point with an untried branch, advanced
        for depth in range(len(self.taken) - 1, -1, -1):
            index, n_branches = self.taken[depth]
            if index + 1 < n_branches:
                return [taken for taken, _ in self.taken[:depth]] + [index + 1]
        return None

    def below(self, i, s, strict):  # U < s (strict) or U <= s -> bool, narrowing U's interval
        lo, hi, lo_closed = self.states[i]
        if lo == hi:
            return lo < s if strict else lo <= s
        if s < lo or s == lo and (strict or not lo_closed):
            return False
        if s >= hi:
            return True
        if s == lo:  # U <= lo: only the point U == lo, probability zero, which numpy's random() can return
            branches = [(Fraction(1), (False, (lo, hi, False))), (Fraction(0), (True, (lo, lo, True)))]
        else:
            width = hi - lo
            branches = [((s - lo) / width, (True, (lo, s, lo_closed))), ((hi - s) / width, (False, (s, hi, strict)))]
        answer, self.states[i] = self.choose(branches)
        return answer

    def inverse_cdf(self, i, probs):  # -> the token sampling.sample would draw from probs with U
        """Token k is drawn when U lies in [C_(k-1), C_k), C the CDF of probs normalised exactly."""
        lo, hi, lo_closed = self.states[i]
        steps = cdf_steps(probs.tobytes(), probs.dtype.str)
        if lo == hi:
            return next(token for token, start, end in steps if start <= lo < end)
        if lo == 0 and hi == 1:  # a fresh uniform, the common case: token k has probability C_k - C_(k-1)
            branches = [(end - start, (token, (start, end, True))) for token, start, end in steps]
            token, self.states[i] = self.choose(branches)
            return token
        branches = []
        for token, start, end in steps:
            low, high = max(lo, start), min(hi, end)
            if high > low:
                closed = lo_closed if start <= lo else True  # token k needs U >= its start
                branches.append(((high - low) / (hi - lo), (token, (low, high, closed))))
        if not branches:
            raise ValueError(f"inverse_cdf: no token of positive probability in {probs}")
        token, self.states[i] = self.choose(branches)
        return token


def affine(steps, a, b):  # the steps of f -> those of a * f + b, merged into a last affine step
    if steps and steps[-1][0] == "affine":
        _, a0, b0 = steps[-1]
        return steps[:-1] + (("affine", a * a0, a * b0 + b),)
    return steps + (("affine", a, b),)


def invert(steps, t):  # f(U) compared with t -> (the threshold on U, whether f decreases)
    decreasing = False
    for step in reversed(steps):
        if step[0] == "affine":
            _, a, b = step
            t = (t - b) / a if isinstance(t, Fraction) else t * math.copysign(1, a)
            decreasing ^= a < 0
        elif step[0] == "log":  # log U < t  <=>  U < exp(t)
            t = exact(math.exp(min(t, 709))) if t < math.inf else t  # exp(709): beyond any U
        else:  # exp U < t  <=>  U < log(t); exp U is positive
            t = -math.inf if t <= 0 else exact(math.log(t)) if t < math.inf else t
    return t, decreasing


class SymbolicUniform:
    """f(U) for the index-th uniform U of a Path, f a monotone map built by the decoder's arithmetic."""

    def __init__(self, path, index, steps=()):
        self.path, self.index, self.steps = path, index, steps

    def __repr__(self):
        lo, hi, _ = self.path.states[self.index]
        return f"SymbolicUniform(U{self.index} in [{float(lo):.6g}, {float(hi):.6g}), f = {self.steps or 'U'})"

    def cannot(self, what):
        return OracleCannotFollow(f"the exact oracle cannot follow {what} of a uniform random number ({self!r}): "
                                  f"it follows comparisons with floats, sampling.sample's draws and monotone "
                                  f"arithmetic (a * u + b, 1 - u, np.log, np.exp)")

    def compare(self, op, t):
        if isinstance(t, np.ndarray):  # a uniform against an array: elementwise
            return np.array([self.compare(op, item) for item in t.ravel()], dtype=bool).reshape(t.shape)
        if not is_number(t):
            raise self.cannot(f"a comparison with {type(t).__name__}")
        if math.isnan(t):
            return False
        s, decreasing = invert(self.steps, exact(t))
        if decreasing:  # f(U) < t  <=>  U > f^-1(t)
            op = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
        below = self.path.below(self.index, s, strict=op in ("<", ">="))
        return below if op in ("<", "<=") else not below

    def __lt__(self, t):
        return self.compare("<", t)

    def __le__(self, t):
        return self.compare("<=", t)

    def __gt__(self, t):
        return self.compare(">", t)

    def __ge__(self, t):
        return self.compare(">=", t)

    def map(self, a, b=0):
        if not (is_number(a) and is_number(b)) or not a or math.isinf(a) or math.isinf(b):
            raise self.cannot(f"arithmetic with {a!r} and {b!r}")
        return SymbolicUniform(self.path, self.index, affine(self.steps, exact(a), exact(b)))

    def __mul__(self, c):
        return self.map(c)

    __rmul__ = __mul__

    def __truediv__(self, c):
        return self.map(1 / exact(c) if is_number(c) and c else c)

    def __add__(self, c):
        return self.map(1, c)

    __radd__ = __add__

    def __sub__(self, c):
        return self.map(1, -c if is_number(c) else c)

    def __rsub__(self, c):
        return self.map(-1, c)

    def __neg__(self):
        return self.map(-1)

    def bounds(self):  # the image of [0, 1] under f, as floats
        low, high = 0.0, 1.0
        for step in self.steps:
            if step[0] == "affine":
                low, high = sorted((float(step[1]) * low + float(step[2]), float(step[1]) * high + float(step[2])))
            elif step[0] == "log":
                low, high = (math.log(low) if low > 0 else -math.inf), math.log(high)
            else:
                low, high = math.exp(low), math.exp(high)
        return low, high

    def log(self):  # np.log on an object array calls this
        if self.bounds()[0] < 0:
            raise self.cannot("the logarithm of a value that may be negative")
        return SymbolicUniform(self.path, self.index, self.steps + (("log",),))

    def exp(self):  # np.exp on an object array calls this
        return SymbolicUniform(self.path, self.index, self.steps + (("exp",),))

    def inverse_cdf(self, probs):  # sampling.sample's draw by inverse CDF, branching over the tokens
        if self.steps:
            raise self.cannot("an inverse-CDF draw with a transformed number")
        return self.path.inverse_cdf(self.index, np.ascontiguousarray(probs))

    def __float__(self):
        raise self.cannot("float()")

    def __int__(self):
        raise self.cannot("int()")

    def __index__(self):
        raise self.cannot("use as an index")

    def __bool__(self):
        raise self.cannot("truth testing")

    def __eq__(self, other):
        raise self.cannot("an equality test")

    __hash__ = None

    def __getattr__(self, name):  # np.sqrt, np.sin and the like call methods the oracle has not
        if name.startswith("__"):  # numpy and copy probe for protocols: answer as a plain object would
            raise AttributeError(name)
        raise self.cannot(f"{name}()")


class EnumeratingGenerator:
    """Stands in for a numpy Generator: random, uniform, integers and choice, all symbolic.

    A copy (copy.copy, copy.deepcopy) reads the same numbers as the original, as a copied Generator would.
    """

    def __init__(self, path, drawn=0):
        self.path, self.drawn = path, drawn  # drawn: how many uniforms this generator has handed out

    def __copy__(self):
        return EnumeratingGenerator(self.path, self.drawn)

    def __deepcopy__(self, memo):
        return self.__copy__()

    def next_uniform(self):
        if self.drawn == len(self.path.states):
            self.path.new_uniform()
        self.drawn += 1
        return SymbolicUniform(self.path, self.drawn - 1)

    def random(self, size=None, dtype=np.float64, out=None):
        if out is not None or np.dtype(dtype) != np.float64:
            raise OracleCannotFollow("the exact oracle's random() takes only size (float64, no out=)")
        if size is None:
            return self.next_uniform()
        uniforms = np.empty(size, dtype=object)
        for index in np.ndindex(uniforms.shape):
            uniforms[index] = self.next_uniform()
        return uniforms

    def uniform(self, low=0.0, high=1.0, size=None):
        if not (is_number(low) and is_number(high) and low < high):
            raise OracleCannotFollow(f"the exact oracle's uniform() needs numbers low < high, got {low!r}, {high!r}")
        return self.random(size) * (high - low) + low

    def choice(self, a, size=None, replace=True, p=None, axis=0, shuffle=True):
        """One element of a (or of range(a)): a choice point over the elements, with probabilities p."""
        if size is not None:
            raise OracleCannotFollow("the exact oracle's choice() draws one element at a time (size=None)")
        n = a if isinstance(a, (int, np.integer)) else len(a)
        probs = np.full(n, 1.0) if p is None else np.asarray(p, dtype=np.float64)
        if probs.shape != (n,) or (probs < 0).any() or not probs.sum() > 0:
            raise ValueError(f"choice: p must hold {n} non-negative probabilities, got {p!r}")
        index = self.next_uniform().inverse_cdf(probs)
        return index if isinstance(a, (int, np.integer)) else a[index]

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):
        low, high = (0, low) if high is None else (low, high)
        high += bool(endpoint)
        if size is not None or not high > low:
            raise OracleCannotFollow("the exact oracle's integers() draws one integer of a non-empty range")
        return low + self.choice(high - low)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise OracleCannotFollow(f"the exact oracle's generator has no {name}(): it can follow random, uniform, "
                                 f"integers and choice")
