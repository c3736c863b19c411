"""Bugs that look right: real mistakes from public speculative decoders, each a few lines changed in ours.

Every bug here appeared in a public implementation (the issue or pull request is named) and every one
survives a casual look: the text still reads well, and most runs look like any other. Each is kept as a
small patch of the reference source, not as a copy of the algorithm: `Variant.decoder()` takes the
current source of sampling.py's functions (or of kvcache/contract.py's cache_resume, the rollback decision every
cached model goes through, or of a verifier in verifiers/), replaces the named code lines (comments are never an
anchor, so rewording one breaks no patch) and compiles the result beside the module, so the zoo always tests
today's reference with one mistake in it. A patch whose lines no longer appear in the reference raises
StalePatch, naming the bug and the lines, instead of testing stale code. `Variant.diff()` shows a patch as a
unified diff against the real file. The verifiers' bugs are in
classroom/verifier_zoo.py.

lossless.check_lossless tells every bug from the reference (tests/test_bug_zoo.py proves it), except the
one that only costs speed: a missing bonus token changes no distribution, and
lossless.check_tokens_per_call catches it. EXACT_MATCH_VERIFICATION is not a bug but a myth: drawing
the target's own token and accepting the draft only when the two are equal is lossless, only slower.
"""

import difflib
import functools
import inspect
import io
import textwrap
import tokenize
import types
from dataclasses import dataclass

import sampling
from kvcache import contract


class StalePatch(Exception):
    """A bug's patch no longer applies to the reference: the zoo must be updated to today's source."""


@dataclass(frozen=True)
class Patch:
    """In module.function, replace the consecutive code lines `old` by `new` (function may name a method,
    "Class.method": classroom/drafter_zoo.py patches drafters' methods).

    Lines are compared as code: without indentation, comments, blank lines or lines that hold only a comment, so
    rewording a comment in the reference never makes a patch stale. `old` names code lines only.
    """

    module: types.ModuleType
    function: str
    old: str
    new: str

    def apply(self, source, bug_name):  # the function's source -> the patched source
        lines = source.splitlines(keepends=True)
        code = code_lines(source)  # (line index, its code) for every line that holds code
        old = [text for _, text in code_lines(textwrap.dedent(self.old).strip("\n"))]
        matches = [i for i in range(len(code) - len(old) + 1)
                   if all(code[i + j][1] == old[j] for j in range(len(old)))]
        if len(matches) != 1:
            where = f"{self.module.__name__}.{self.function}"
            found = "no longer contains" if not matches else f"contains {len(matches)} copies of"
            raise StalePatch(f"bug {bug_name!r}: {where} {found} the line(s) {old!r}; update bug_zoo.py to the "
                             f"current reference")
        first, last = code[matches[0]][0], code[matches[0] + len(old) - 1][0]
        indent = lines[first][:len(lines[first]) - len(lines[first].lstrip())]
        new = [indent + line + "\n" if line else "\n" for line in textwrap.dedent(self.new).strip("\n").splitlines()]
        return "".join(lines[:first] + new + lines[last + 1:])


def patched_object(module, name):  # "function" or "Class.method" -> the function object in module
    return functools.reduce(getattr, name.split("."), module)


def code_lines(source):  # -> [(line index, the line's code, stripped)] for the lines that hold code
    """Each line's code without its comment, found by Python's tokenizer (a # inside a string is no comment)."""
    lines = source.splitlines()
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    comment_starts = {token.start[0] - 1: token.start[1] for token in tokens if token.type == tokenize.COMMENT}
    code = [(i, line[:comment_starts.get(i, len(line))].strip()) for i, line in enumerate(lines)]
    return [(i, text) for i, text in code if text]


def rebound_namespace(module):
    """A copy of module's globals whose functions look names up in the copy, so a patched one is called."""
    namespace = dict(vars(module))
    for name, value in vars(module).items():
        if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            rebound = types.FunctionType(value.__code__, namespace, value.__name__, value.__defaults__,
                                         value.__closure__)
            rebound.__kwdefaults__ = value.__kwdefaults__
            namespace[name] = rebound
    return namespace


@dataclass(frozen=True)
class Variant:
    """A decoder that differs from the reference by a few lines, where it comes from and what it does.

    entry is the decoder the patches run under, (module, function name): sampling.speculative_sampling unless
    the bug lives in a verifier of verifiers/; settings are the keyword arguments that decoder takes beyond
    speculative_sampling's, as (name, value) pairs (n_drafts, replacement, drafts).
    """

    name: str
    title: str
    source: str  # the public issue or pull request where it appeared
    effect: str  # what it does to the output distribution
    patches: tuple
    lossless: bool = False  # the myth: looks wrong, is exact
    speed_only: bool = False  # changes no distribution; only tokens per target call show it
    entry: tuple = (sampling, "speculative_sampling")
    settings: tuple = ()

    def patched_functions(self):  # -> {module: {function name: patched source}}
        patched = {}
        for patch in self.patches:
            functions = patched.setdefault(patch.module, {})
            source = functions.get(patch.function) or inspect.getsource(patched_object(patch.module, patch.function))
            functions[patch.function] = patch.apply(source, self.name)
        return patched

    def decoder(self):
        """The entry decoder with this variant's patches, compiled from today's source, with
        speculative_sampling's signature (the settings bound, any of them overridable by keyword)."""
        return build_decoder(self)

    def reference(self):
        """The same entry decoder, settings and signature, without the patches: what the bug is measured against."""
        module, name = self.entry
        return with_speculative_signature(getattr(module, name), dict(self.settings), {}, f"{name}_reference")

    def diff(self):
        """The patches as a unified diff of the real files (what a reviewer would have seen)."""
        chunks = []
        for module, functions in self.patched_functions().items():
            original = inspect.getsource(module)
            changed = original
            for name, source in functions.items():
                changed = changed.replace(inspect.getsource(patched_object(module, name)), source, 1)
            path = module.__name__.replace(".", "/") + ".py"
            chunks.append("".join(difflib.unified_diff(original.splitlines(keepends=True),
                                                       changed.splitlines(keepends=True), f"a/{path}", f"b/{path}",
                                                       n=1)))
        return "".join(chunks)


@functools.cache
def build_decoder(variant):
    patched = variant.patched_functions()
    entry_module, entry_name = variant.entry
    # every module the decoder runs through is copied, and the patched functions compiled into their copies
    namespaces = {module: rebound_namespace(module) for module in {sampling, entry_module, *patched}}
    for module, functions in patched.items():
        for name, source in functions.items():
            exec(compile(source, f"<{variant.name}: {module.__name__}.{name}>", "exec"), namespaces[module])
    link_copies(namespaces)
    # functions of the cache contract are swapped in while the decoder runs (the models look them up at each call)
    model_side = {(contract, name): namespaces[contract][name] for name in patched.get(contract, {})}
    decoder = with_speculative_signature(namespaces[entry_module][entry_name], dict(variant.settings), model_side,
                                         f"{entry_name}_{variant.name}")
    decoder.__doc__ = f"{entry_module.__name__}.{entry_name} with a bug: {variant.title} ({variant.source})."
    return decoder


def link_copies(namespaces):
    """A name one copied module imported from another (`from sampling import sample`) now names the copy."""
    copies = {}
    for module, namespace in namespaces.items():
        for name, value in vars(module).items():
            if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
                copies[value] = namespace[name]
    for namespace in namespaces.values():
        for name, value in list(namespace.items()):
            if isinstance(value, types.FunctionType) and value in copies:
                namespace[name] = copies[value]


def with_speculative_signature(run, settings, model_side, name):
    """run(x, draft, target, N, K, rng=..., **settings) as decoder(x, draft_model, target_model, N, K, rng, ...)."""

    def decoder(x, draft_model, target_model, N, K, rng=None, **sampling_settings):
        originals = {key: getattr(*key) for key in model_side}
        try:
            for (module, function_name), function in model_side.items():
                setattr(module, function_name, function)
            return run(x, draft_model, target_model, N, K, rng=rng, **{**settings, **sampling_settings})
        finally:
            for (module, function_name), function in originals.items():
                setattr(module, function_name, function)

    decoder.__name__ = decoder.__qualname__ = name
    return decoder


ACCEPT_TEST = "if accepts(r, q[t], p[t], token):"
CORRECTION = "x = np.append(x, sample(max_fn(q[t] - p[t], fallback=q[t]), rng))"
DRAFT_STEP = """
    p.append(timed_probs(draft_model, x_draft, 1, settings, stats, "draft")[0])
    x_draft = np.append(x_draft, sample(p[-1], rng))
"""

BUGS = [
    Variant(
        "argmax_drafts", "greedy drafts scored with the soft p", "jaymody/speculative-sampling#3",
        "drafts are the draft's argmax, but q/p divides by its softmax: the accept rule assumes x~ ~ p, so the "
        "draft's favourite token is over-represented",
        (Patch(sampling, "draw_drafts", "x_draft = np.append(x_draft, sample(p[-1], rng))",
               "x_draft = np.append(x_draft, int(np.argmax(p[-1])))  # (bug) greedy drafts, soft p"),)),
    Variant(
        "drafts_from_processed_p", "drafts sampled from one p, scored with another",
        "transformers#47932 (also DeepSpec#31)",
        "drafts come from the processed p (temperature, top-k, top-p) but q/p divides by the raw p, so the "
        "acceptance ratio and the correction are wrong whenever the settings change p",
        (Patch(sampling, "draw_drafts", DRAFT_STEP, """
            drawn_from = timed_probs(draft_model, x_draft, 1, settings, stats, "draft")[0]
            x_draft = np.append(x_draft, sample(drawn_from, rng))
            p.append(next_token_probs(draft_model, x_draft[:-1], 1, SamplingSettings())[0])  # (bug) the raw p
            """),)),
    Variant(
        "target_without_settings", "the target scored without the request's settings", "vllm#9834, PR #10198",
        "q is the target's raw distribution while p is processed: the output follows the target at temperature "
        "1 without top-k or top-p, not the distribution the request asked for",
        (Patch(sampling, "speculative_sampling", 'q = timed_probs(target_model, x_draft, K_n + 1, settings, stats, '
               '"target")', 'q = timed_probs(target_model, x_draft, K_n + 1, SamplingSettings(), stats, "target")'
               '  # (bug)'),)),
    Variant(
        "always_accept", "an acceptance test that is always true", "transformers PR #28508",
        "every draft is accepted, so every token but the bonus comes from the draft p",
        (Patch(sampling, "accepts", "return r < min(1.0, float(q[token]) / float(p[token]))",
               "return r < max(1.0, float(q[token]) / float(p[token]))  # (bug) max for min: always true"),)),
    Variant(
        "shared_random_numbers", "drafting and acceptance read the same random numbers", "vllm PR #54282",
        "the uniform that drew a draft also decides whether it is accepted: drafts drawn with a small number "
        "(the first tokens of the CDF) are accepted more often",
        (Patch(sampling, "speculative_sampling", "drafts, p = draw_drafts(draft_model, x, K_n, settings, rng, stats)",
               """
               import copy  # (bug) the drafts are drawn from a copy of rng, whose numbers the tests below reuse
               drafts, p = draw_drafts(draft_model, x, K_n, settings, copy.deepcopy(rng), stats)
               """),)),
    Variant(
        "no_rollback", "rejected drafts left in the cache", "lucidrains/speculative-decoding#3, "
        "romsto/Speculative-Decoding#1 (also ml-explore/mlx-lm PR #1109)",
        "the cache keeps every token it was fed, rejected drafts included, and puts the next tokens after them: "
        "the target goes on reading the drafts it rejected",
        (Patch(contract, "cache_resume", "return start, x[start:]",
               "return len(cached_tokens), x[start:]  # (bug) resume after all it was fed"),)),
    Variant(
        "cache_position_plus_one", "the cache position advanced by one, not by the accepted count",
        "transformers#30042, PR #30068",
        "the position where the target's cache resumes moves one token per call, as in plain decoding, so after "
        "accepted drafts the next block overwrites them and the target forgets them",
        (Patch(contract, "cache_resume", "return start, x[start:]",
               "return max(0, len(cached_tokens) - n_last + 1), x[start:]  # (bug) one past the last block's start"),
         )),
    Variant(
        "first_draft_unverified", "the first draft committed unverified", "ohdearquant/lattice#243, PR #258",
        "the first draft of every loop is kept without the test, so one token in every loop comes from p",
        (Patch(sampling, "speculative_sampling", ACCEPT_TEST,
               "if t == 0 or accepts(r, q[t], p[t], token):  # (bug) x~_1 unchecked"),)),
    Variant(
        "correction_from_q", "the correction sampled from q, not from (q - p)+", "SafeAILab/EAGLE#329",
        "accepted drafts already supplied min(p, q); drawing the correction from q adds beta q on top, "
        "over-weighting tokens the draft already favours",
        (Patch(sampling, "speculative_sampling", CORRECTION, "x = np.append(x, sample(q[t], rng))  # (bug)"),)),
    Variant(
        "correction_from_next_row", "the correction drawn from the row after the rejected draft",
        "openvino.genai#4190",
        "the corrected token comes from q given the rejected draft, as if the draft had been kept: the rejected "
        "token is deleted and its continuation kept",
        (Patch(sampling, "speculative_sampling", CORRECTION, "x = np.append(x, sample(q[t + 1], rng))  # (bug)"),)),
    Variant(
        "bonus_from_wrong_row", "the bonus token from the wrong row", "mlx-node/mlx-node PR #11 (review: rows "
        "shifted by one)",
        "after K accepted drafts the bonus is drawn from q given K - 1 of them: the token after the last draft "
        "follows the wrong context",
        (Patch(sampling, "speculative_sampling", "x = np.append(x, sample(q[K_n], rng))",
               "x = np.append(x, sample(q[K_n - 1], rng))  # (bug)"),)),
    Variant(
        "no_bonus_token", "the bonus token dropped", "ohdearquant/lattice#389, PR #509",
        "none: after K accepted drafts the next loop starts from the target's q anyway. It only costs speed, "
        "K tokens per target call where K + 1 were free",
        (Patch(sampling, "speculative_sampling", """
            x = np.append(x, sample(q[K_n], rng))
            n += 1
            stats.record_tokens("bonus" if K_n else "target")
            """, """
            if K_n == 0:  # (bug) only a loop without drafts samples from q: the bonus token is dropped
                x = np.append(x, sample(q[K_n], rng))
                n += 1
                stats.record_tokens("target")
            """),), speed_only=True),
]

EXACT_MATCH_VERIFICATION = Variant(
    "exact_match_verification", "exact-match verification of a sampled draft",
    "mlx-swift-lm PR #459 (claims it is biased; it is not)",
    "none: every token emitted is the target's own draw y ~ q at its position (the draft only when it equals "
    "y), so the output follows q exactly; only acceptance drops, from sum min(p, q) to sum p q",
    (Patch(sampling, "speculative_sampling", """
        r = rng.random()
        token = drafts[t]
        """ + ACCEPT_TEST, """
        y = sample(q[t], rng)  # the target's own token at this position
        token = drafts[t]
        if y == token:  # exact match: keep the draft
        """),
     Patch(sampling, "speculative_sampling", CORRECTION, "x = np.append(x, y)  # else emit the target's token")),
    lossless=True)

ZOO = {variant.name: variant for variant in [*BUGS, EXACT_MATCH_VERIFICATION]}
