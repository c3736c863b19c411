"""The exact output law of a speculative decoder on small tables: `check_exact(decoder)` compares it with the target's.

lossless.check_lossless is the sampling-based sibling: thousands of runs and a chi-square test, which sees a
deviation of about 0.05 in total variation. classroom/verifier_zoo.py's real verifier bugs move the law by 0.02
to 0.61 in total variation, or only reach an output of probability zero; the ones below 0.05 pass the chi-square,
and this module fails them all, because it computes the law exactly instead of estimating it.

How: the decoder is run as it is (any decoder with sampling.speculative_sampling's signature, extra keyword
arguments passed through), with an EnumeratingGenerator as its rng. The generator's uniform numbers are
SymbolicUniforms: a uniform U on [0, 1) known only through an interval that shrinks as the decoder compares it.
A comparison whose threshold splits the interval is a choice point, and so is each token of an inverse-CDF draw
(sampling.sample hands the draw to the uniform) and each outcome of rng.choice or rng.integers. The oracle
explores the choice points depth first by re-execution: every run starts from fresh model caches with a script
of the decisions to take, takes the first branch beyond it, and the next script backtracks to the last choice
point with a branch left untried, until every path has run. A path's probability is the product of its
branches' probabilities, kept as fractions.Fraction: the thresholds are the floats the decoder computed, so the
law is exact for the decoder's own arithmetic (rounding inside an inverse CDF, or of r * c, aside).

Where a threshold equals the closed lower end of the interval (U <= 0, or u <= q/p with q = 0) the branch
U == lo, of probability zero, is explored too, because numpy's random() does return 0.0: every output a run
can reach is recorded, and a reachable output of probability zero under the target fails the decoder
(sglang #35771 accepted such drafts with u <= q/p where the test must be u < q/p).

Tolerance: a decoder passes when the total variation between its law and the target's is at most TV_TOLERANCE
= 1e-6 and it reaches no impossible output. A lossless decoder is exact only up to float32: the ratio q/p, the
residual q - p and the callable contract's probabilities are float32 values, which leaves about 1e-7; the real
bugs of classroom/bug_zoo.py sit at 1e-3 and above. The default problems (default_exact_problems) have
vocabularies of 3 to 5 tokens, K = 2 and N = 3 (K = 3 and N = 4 at temperature 0): sampling.speculative_sampling
takes 162 runs for all of them (under a second), a decoder with three drafts of two tokens about 5,400
(SpecInfer's recursive rejection took 33 seconds on a 2-core CPU shared with other work).
"""

import functools
import time
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import product

import numpy as np

import sampling
from classroom import lossless
from classroom.symbolic import EnumeratingGenerator, OracleCannotFollow, Path, SymbolicUniform  # noqa: F401

TV_TOLERANCE = 1e-6  # float32 rounding of the tables and of q/p leaves about 1e-7; real bugs show 1e-3 and more
MAX_PATHS = 200_000


class TooManyPaths(RuntimeError):
    """The decoder's choice points branch into more paths than max_paths: choose a smaller problem."""


@dataclass
class ExactLaw:
    law: dict  # outcome (a decoder's first n_joint new tokens, a tuple) -> its probability, a positive Fraction
    support: set  # every outcome some run reached, those of probability zero included
    paths: int  # the number of runs it took


def enumerate_paths(run, max_paths=MAX_PATHS):  # run(rng) -> a hashable outcome
    """Run along every path of run's choice points -> ExactLaw of its outcomes, exact as Fractions."""
    law, support = {}, set()
    script, paths = [], 0
    while script is not None:
        if paths == max_paths:
            raise TooManyPaths(f"more than {max_paths} paths; choose a smaller problem or raise max_paths")
        path = Path(script)
        outcome = run(EnumeratingGenerator(path))
        law[outcome] = law.get(outcome, Fraction(0)) + path.weight
        support.add(outcome)
        paths += 1
        script = path.next_script()
    return ExactLaw({outcome: weight for outcome, weight in law.items() if weight}, support, paths)


def exact_output_law(decoder, problem, *, max_paths=MAX_PATHS, **decoder_kwargs):
    """The law of decoder's first problem.n_joint new tokens -> ExactLaw(law, support, paths).

    Every run starts from fresh caches (lossless.run_decoder), so a path repeats exactly when re-executed.
    """
    if decoder_kwargs:
        decoder = functools.partial(decoder, **decoder_kwargs)
    draft, target = problem.models()

    def run(rng):
        new = lossless.run_decoder(decoder, problem, draft, target, rng)
        return tuple(int(token) for token in new[:problem.n_joint])

    try:
        return enumerate_paths(run, max_paths)
    except TooManyPaths as error:
        raise TooManyPaths(f"{problem.name}: {error}") from None


def exact_distribution(row):  # a probability row (float32) -> its entries as Fractions summing to exactly 1
    weights = [Fraction(float(value)) for value in row]
    total = sum(weights)
    return [weight / total for weight in weights]


def target_law(problem):  # -> {tuple of the first n_joint new tokens: Fraction}, positive entries only
    """The product of the target's processed next-token distributions, each row normalised exactly."""
    law = {}
    for tokens in product(range(problem.target.n_vocab), repeat=problem.n_joint):
        probability = Fraction(1)
        for i, token in enumerate(tokens):
            sequence = [*problem.prompt, *tokens[:i]]
            logits = problem.target.logits_at(sequence, np.array([len(sequence) - 1]))
            probability *= exact_distribution(sampling.logits_to_probs(logits, problem.settings)[0])[token]
            if not probability:
                break
        if probability:
            law[tokens] = probability
    return law


def total_variation(law, reference):  # -> (total variation, largest absolute difference), as floats
    differences = [abs(law.get(key, 0) - reference.get(key, 0)) for key in law.keys() | reference.keys()]
    return float(sum(differences) / 2), float(max(differences))


# ---- the problems -----------------------------------------------------------------------------------


def top_two(table):  # a draft that proposes only its two favourite tokens in every context
    second = np.sort(table.table, axis=-1)[..., -2:-1]
    return lossless.ContextTable(np.where(table.table >= second, table.table, lossless.NEVER))


def default_exact_problems():
    """Four small problems that exercise a verifier, sized so that every path can be run.

    V is the vocabulary, K the drafts per loop, N the new tokens, every one in the law (n_joint = N). The
    drafts propose two tokens in every context (the targets, with zeros of their own, keep all they have), so
    a loop of three drafts of two tokens has 2^6 outcomes to draw, not V^6. Both model contracts appear, with
    temperatures 1 (with a peaked draft, logits spread 4, whose drafts mostly agree, so candidates repeat),
    0.6, 1.6 with top-k 3 and top-p 0.8, and 0 (greedy, with a draft proposing all its tokens).
    sampling.speculative_sampling takes 35 to 75 paths on each sampling problem, a decoder with three drafts
    of two tokens (SpecInfer's recursive rejection) about 1,000 to 3,000.
    """
    table = lossless.random_context_table
    settings = sampling.SamplingSettings
    Problem = functools.partial(lossless.Problem, n_samples=1500)
    target3, target4, target5 = table(3, 12), table(4, 1), table(5, 4)
    return [
        Problem("plain callables, V=3, peaked draft, K=2, N=3", top_two(table(3, 13, spread=4.0)), target3,
                (0, 0), 3, 2, settings(), False),
        Problem("cached, V=4, K=2, N=3, temperature 0.6", top_two(table(4, 2)), target4, (1, 3), 3, 2,
                settings(0.6), True),
        Problem("cached, V=5, K=2, N=3, temperature 1.6, top-k 3, top-p 0.8", top_two(table(5, 5)), target5,
                (2, 3), 3, 2, settings(1.6, 3, 0.8), True),
        Problem("plain callables, V=4, K=3, N=4, greedy", table(4, 2), target4, (3, 1), 4, 3, sampling.GREEDY,
                False, n_joint=4),
    ]


# ---- the check ------------------------------------------------------------------------------------


@dataclass
class ProblemResult:
    name: str
    passed: bool
    tv: float = float("nan")  # total variation between the decoder's law and the target's
    max_difference: float = float("nan")  # the largest difference in probability of one output
    paths: int = 0
    impossible: list = field(default_factory=list)  # reachable outputs of probability zero under the target
    error: str = ""  # the decoder's malformed output or exception


@dataclass
class ExactCheck:
    passed: bool
    max_tv: float  # the largest total variation over the problems (inf if the decoder failed to run)
    report: str
    results: list = field(default_factory=list)
    seconds: float = 0.0

    def __repr__(self):
        return f"ExactCheck(passed={self.passed}, max_tv={self.max_tv:.3g})"


def check_problem(decoder, problem, max_paths, decoder_kwargs):
    """One problem's verdict; the decoder's crash or malformed output fails it, the oracle's limits raise."""
    try:
        exact = exact_output_law(decoder, problem, max_paths=max_paths, **decoder_kwargs)
    except (OracleCannotFollow, TooManyPaths):
        raise
    except AssertionError as error:
        return ProblemResult(problem.name, False, float("inf"), error=f"malformed output: {error}")
    except Exception as error:
        if oracle_limit(error):
            raise
        return ProblemResult(problem.name, False, float("inf"), error=f"raised {type(error).__name__}: {error}")
    reference = target_law(problem)
    tv, max_difference = total_variation(exact.law, reference)
    impossible = sorted(tokens for tokens in exact.support if tokens not in reference)
    passed = tv <= TV_TOLERANCE and not impossible
    return ProblemResult(problem.name, passed, tv, max_difference, exact.paths, impossible)


def oracle_limit(error):  # numpy re-raises an OracleCannotFollow as a TypeError of its own, naming the class
    while error is not None:
        if isinstance(error, OracleCannotFollow) or "SymbolicUniform" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def describe(result):
    verdict = "ok  " if result.passed else "FAIL"
    if result.error:
        return f"  {verdict} {result.name}: {result.error}"
    line = f"  {verdict} {result.name}: TV {result.tv:.3g}, max difference {result.max_difference:.3g}, " \
           f"{result.paths} paths"
    if result.impossible:
        line += f"; reaches {len(result.impossible)} output(s) of target probability 0, e.g. {result.impossible[0]}"
    return line


def check_exact(decoder, *, problems=None, max_paths=MAX_PATHS, **decoder_kwargs):
    """The decoder's exact law against the target's on each problem -> ExactCheck(passed, max_tv, report, results).

    decoder has sampling.speculative_sampling's signature; decoder_kwargs (e.g. n_drafts=3) are passed to it.
    It passes when every problem's total variation is at most TV_TOLERANCE and no run reaches an output the
    target gives probability zero. Raises OracleCannotFollow when the decoder uses its random numbers in a
    way the oracle cannot follow (float(u), rng.normal), TooManyPaths when a problem has too many paths.
    """
    if not callable(decoder):
        raise ValueError(f"decoder must be a function like sampling.speculative_sampling, got {decoder!r}")
    problems = default_exact_problems() if problems is None else list(problems)
    if not problems:
        raise ValueError("problems must hold at least one Problem (None gives the default four)")
    start = time.perf_counter()
    results = [check_problem(decoder, problem, max_paths, decoder_kwargs) for problem in problems]
    passed = all(result.passed for result in results)
    max_tv = max(result.tv for result in results)
    lines = [f"{'PASSED' if passed else 'FAILED'}: largest total variation {max_tv:.3g} over {len(results)} "
             f"problems (pass at most {TV_TOLERANCE:g}, and no output of target probability 0)"]
    lines += [describe(result) for result in results]
    return ExactCheck(passed, max_tv, "\n".join(lines), results, time.perf_counter() - start)

