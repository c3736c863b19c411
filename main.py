r"""Decode one prompt autoregressively and speculatively, and compare.

    python main.py --K 4 --temperature 0           # the bundled teaching pair (models/teach-*)
    python main.py --draft_model_size 124M --target_model_size 1558M \
        --prompt "Alan Turing theorized that computers would one day become"   # OpenAI's GPT-2 (downloaded)
    python main.py --K auto      # K chosen every loop from this machine's measured costs and the alpha so far
    python main.py --draft_model_size prompt-lookup   # drafts copied from the text so far, no second model
    python main.py --draft_model_size early-exit --exit_layer 2   # the target's first 2 layers draft (drafters/)
    python main.py --draft_model_size eagle --verifier tree --tree_drafts dynamic   # EAGLE-2's tree from a head
    python main.py --verbose     # each run's counts and costs, and the engine (--json: one JSON object)
    python main.py --prompt "def add(a, b):" --prompt "class Queue:"   # a batch of two prompts
    python main.py --verifier tree --n_drafts 3 --temperature 1   # three drafts as a token tree (verifiers/)

Every decoder starts from the same prompt, seed and empty caches, runs once untimed, then --repeats timed
runs of all decoders interleave (cli/runs.py); times are medians, the speedup the median of the paired
ratios. The report (cli/report.py) leads with the answer: the speedup and its range, whether the texts
agree, alpha, tokens per target call and what Leviathan et al.'s formula expects; then the text, coloured
by where each token came from. Bad input gets `error: ...` and exit status 2, before any model loads.
"""

import json as jsonlib
import sys

import utils
from cli import backends, flags, html_page, report, runs

# The bundled pair's first run: a function it writes with accepted stretches and corrections, where prompts
# into its loops (text it repeats) accept nearly everything and teach nothing. It ends after the docstring,
# not after a newline: GPT-2's BPE keeps a newline and the next line's indentation in one token, so a prompt
# ending in "\n" splits them as no training text does, and the pair then writes unindented code.
DEFAULT_PROMPT = 'def flatten(items):\n    """Return a flat list of the items in nested lists."""'


def main(prompt=DEFAULT_PROMPT, n_tokens_to_generate=64, draft_model_size="teach-draft",
         target_model_size="teach-target", models_dir=None, K=4, temperature=0.0, top_k=0, top_p=1.0,
         seed=123, decoder="autoregressive,speculative", repeats=5, json=False, color=None, backend="numpy",
         dtype="float32", batch_size=None, threads=None, verifier="token", n_drafts=None, replacement=False,
         tree_drafts=None, exit_layer=None, tree_nodes=None, confidence_threshold=None, verbose=False, html=None):
    """Run the chosen decoders on one prompt (or a batch); print the report, or with json=True a JSON object.

    decoder: comma-separated names among autoregressive, speculative and assisted (greedy assisted generation,
    temperature 0 only; it adapts its own K from 5, as Hugging Face does, and ignores K). models_dir: None is the
    bundled models/ beside this file. repeats: timed runs of each decoder. color: None colours on a terminal unless
    NO_COLOR is set; True or False forces it. backend: numpy or jax; dtype: float32, or bfloat16 (JAX only) for the
    models' compute. prompt: a text, or a list of texts for a batch; batch_size: None (one row per prompt) or B, the
    number of rows (B copies of a single prompt). threads: how many threads the NumPy engine splits a product over
    where that measures faster (engine/threads.py); None is every usable core. verifier: token (Algorithm 2), block,
    multi or tree, the speculative decoder's rule; n_drafts: drafts per loop for multi and tree (None: 3; token and
    block take 1); replacement: multi and tree's sampled drafts drawn independently; tree_drafts: sampled, top_k or
    lookup (None: lookup with prompt-lookup, else sampled), or dynamic (eagle's, eagle3's or medusa's own tree, within
    tree_nodes nodes; None: drafters.load.DEFAULT_N_NODES). exit_layer: the layers an early-exit draft runs (None: a
    quarter); confidence_threshold: kangaroo's early stop (None: 0.6). verbose: the report adds each run's counts and
    costs and the engine. html: where a page replaying one more run is written (cli/html_page.py). Returns the dict
    that --json prints."""
    run = flags.check_run(**locals())  # every flag, checked before a model loads
    report.announce(run)  # on a terminal, at once: what the next seconds are spent on
    encoder, rows, draft, target = load_models(run)
    result, stats = runs.compare_decoders(run, rows, draft, target, encoder)
    if run.html:  # a page that replays one more speculative run, loop by loop
        html_page.write_html(run, rows[0], draft, target, encoder, result)
    if json:
        print(jsonlib.dumps(result))
    else:
        report.print_report(result, stats, encoder.decode, report.wants_colour(color), verbose)
    return result


def load_models(run):
    """-> (the target's encoder, the prompts' token ids, the draft, the target), the models built for one
    sequence (the NumPy engine in this machine's fastest layouts) or for the batch's rows."""
    load, has_model = utils.load_encoder_hparams_and_params, run.flags["draft"] not in flags.WITHOUT_A_MODEL
    encoder, hparams, params = load(run.flags["target"], run.models_dir)
    every_hparams = [hparams]
    if has_model:
        draft_encoder, draft_hparams, draft_params = load(run.flags["draft"], run.models_dir)
        flags.check_same_vocabulary(draft_encoder, encoder, draft_hparams, hparams)
        every_hparams.append(draft_hparams)
    rows = [flags.encode_prompt(encoder, text) for text in run.prompts]
    flags.check_context(max(map(len, rows)), run.flags["n_tokens"], *every_hparams)
    backend, dtype = run.flags["backend"], run.flags["dtype"]
    if run.batch:
        return encoder, rows, *(backends.make_batched_model(weights, shape, len(rows), backend, dtype, "auto")
                                for weights, shape in [(draft_params, draft_hparams), (params, hparams)])
    # in_place: each model lays its weights out inside the checkpoint's arrays, freeing them as it goes
    target = backends.make_model(params, hparams, backend, dtype, layout="auto", in_place=True)
    draft = (backends.make_model(draft_params, draft_hparams, backend, dtype, layout="auto", in_place=True) if has_model
             else backends.draft_without_a_model(run.flags["draft"], target, run.models_dir, run.flags["exit_layer"],
                                                 run.flags["tree_nodes"], run.flags["confidence_threshold"]))
    return encoder, rows, draft, target


if __name__ == "__main__":
    try:
        arguments = flags.parse_arguments(sys.argv[1:])
        if arguments.pop("help", "false") == "true":
            print(flags.usage(main, __doc__))
            sys.exit(0)
        import fire  # only the command line needs fire

        fire.Fire(main, command=flags.fire_command(arguments), serialize=lambda result: None)
    except (ValueError, OSError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
