r"""Decode one prompt autoregressively and speculatively, and compare.

    python main.py --K 4 --temperature 0           # the bundled teaching pair (models/teach-*)
    python main.py --draft_model_size 124M --target_model_size 1558M \
        --prompt "Alan Turing theorized that computers would one day become"   # OpenAI's GPT-2, 124M drafting for 1558M
    python main.py --prompt "def fibonacci(n):" --n_tokens_to_generate 64 --decoder speculative,assisted
    python main.py --K auto      # K chosen every loop from this machine's measured costs and the alpha so far
    python main.py --draft_model_size prompt-lookup   # drafts copied from the text so far, no second model
    python main.py --json        # one JSON object as the last line of stdout
    python main.py --batch_size 8 --temperature 1     # eight sequences at once
    python main.py --prompt "def add(a, b):" --prompt "class Queue:"   # a batch of two prompts
    python main.py --verifier block --temperature 1      # block verification (verifiers/block.py)
    python main.py --verifier tree --n_drafts 3 --temperature 1   # three drafts as a token tree (verifiers/tree.py)

Every decoder starts from the same prompt, the same seed and empty caches, runs once untimed, then --repeats
timed runs of all decoders interleave (cli/runs.py); times are medians and the speedup is the median of the
paired ratios, printed with their ranges. The speculative text is coloured by where each token came from
(on a terminal, unless NO_COLOR is set): a draft token the target accepted, the target's correction after
a rejection, or the bonus token the target adds when it accepts all K. Before the runs, speedup/costs.py
measures this machine's costs (about a second); the report sets the measured speedup beside what the
formula expects from them, and says from which alpha speculation can pay here. With --batch_size B, or
--prompt given several times, the decoders run over a batch. --verifier picks how the speculative decoder
keeps drafts: Algorithm 2's token verification, or one of verifiers/ (block, several drafts, a token tree).
Bad input gets `error: ...` on stderr and exit status 2, before any model is loaded where possible.
`python main.py --help` lists the flags.
"""

import json as jsonlib
import os
import sys

import sampling
import utils
from cli import flags, runs
from cli.flags import DECODERS
from cli.report import coloured_text, print_batch_report, print_report, wants_colour
from cli import backends
from speedup import costs, drafts

# The bundled pair's first run: a function it writes with accepted stretches and corrections, where prompts
# into its loops (text it repeats) accept nearly everything and teach nothing. It ends after the docstring, not after a newline: GPT-2's BPE keeps a newline
# and the next line's indentation in one token, so a prompt ending in "\n" splits them as no training text
# does, and the pair then writes unindented code.
DEFAULT_PROMPT = 'def flatten(items):\n    """Return a flat list of the items in nested lists."""'
BUNDLED_MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


def main(prompt=DEFAULT_PROMPT, n_tokens_to_generate=64, draft_model_size="teach-draft",
         target_model_size="teach-target", models_dir=None, K=4, temperature=0.0, top_k=0, top_p=1.0, seed=123,
         decoder="autoregressive,speculative", repeats=5, json=False, color=None, backend="numpy",
         dtype="float32", batch_size=None, threads=None, verifier="token", n_drafts=None, replacement=False,
         tree_drafts=None):
    """Run the chosen decoders on one prompt and print texts, times, speedup and statistics.

    decoder: comma-separated names among autoregressive, speculative and assisted (greedy assisted
    generation, temperature 0 only; it adapts its own K from 5, as Hugging Face does, and ignores K).
    models_dir: None is the bundled models/ beside this file. repeats: timed runs of each decoder.
    color: None colours on a terminal unless the NO_COLOR environment variable is set; True or False
    forces it. backend: numpy or jax; dtype: float32, or bfloat16 (JAX only) for the models' compute.
    prompt: a text, or a list of texts for a batch; batch_size: None (one row per prompt) or B, the number
    of rows (B copies of a single prompt). threads: how many threads the NumPy engine splits a product over
    where that measures faster (engine/threads.py); None is every usable core. verifier: token (Algorithm 2),
    block, multi or tree, the speculative decoder's rule; n_drafts: drafts per loop for multi and tree (None:
    3; token and block take 1); replacement: multi and tree's sampled drafts drawn independently; tree_drafts:
    sampled, top_k or lookup (None: lookup with prompt-lookup, else sampled).
    Returns the result dict that --json prints.
    """
    decoders = flags.parse_decoders(decoder)
    flags.check_flags(n_tokens_to_generate, K, seed, repeats, decoders, temperature, backend, dtype)
    settings = sampling.SamplingSettings(temperature, top_k, top_p)  # raises on a bad temperature, top_k or top_p
    n_drafts, tree_drafts = flags.check_verifier(verifier, n_drafts, replacement, tree_drafts, decoders, K,
                                                 draft_model_size)
    verifier_flags = {"verifier": verifier, "n_drafts": n_drafts, "replacement": replacement, "tree_drafts": tree_drafts}
    prompts = list(prompt) if isinstance(prompt, (list, tuple)) else [prompt]
    for text in prompts:
        flags.check_strings(None, prompt=text)
    flags.check_strings(draft_model_size=draft_model_size, target_model_size=target_model_size, models_dir=models_dir)
    B = flags.batch_rows(batch_size, prompts, decoders, K, draft_model_size, verifier)
    flags.set_threads(threads)
    models_dir = BUNDLED_MODELS_DIR if models_dir is None else models_dir
    lookup = draft_model_size == drafts.PROMPT_LOOKUP
    for name in ([] if lookup else [draft_model_size]) + [target_model_size]:
        for text in set(prompts):
            flags.check_context_early(text, n_tokens_to_generate, name, models_dir)
    prompt = prompts[0]

    if not lookup:
        draft_encoder, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(draft_model_size, models_dir)
    encoder, target_hparams, target_params = utils.load_encoder_hparams_and_params(target_model_size, models_dir)
    all_hparams = [target_hparams]
    if not lookup:
        flags.check_same_vocabulary(draft_encoder, encoder, draft_hparams, target_hparams)
        all_hparams.append(draft_hparams)
    prompt_ids = flags.encode_prompt(encoder, prompt)
    flags.check_context(len(prompt_ids), n_tokens_to_generate, *all_hparams)
    if B > 1:
        prompts = prompts * (B // len(prompts))
        result, stats = runs.run_batch(prompts, (draft_params, draft_hparams), (target_params, target_hparams), encoder,
                                       decoders, settings, n_tokens_to_generate, backend, dtype,
                                       {"draft": draft_model_size, "target": target_model_size, "K": K,
                                        "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
                                        "n_tokens": n_tokens_to_generate, "repeats": repeats, "backend": backend,
                                        "dtype": dtype, **verifier_flags})
        if json:
            print(jsonlib.dumps(result))
        else:
            colour = wants_colour(color)
            print_batch_report(result, stats, lambda tokens, origins: coloured_text(tokens, origins, encoder.decode)
                               if colour else encoder.decode(tokens))
        return result
    target = backends.make_model(target_params, target_hparams, backend, dtype, in_place=True, layout="auto")
    draft = (drafts.PromptLookup(target_hparams["n_vocab"]) if lookup
             else backends.make_model(draft_params, draft_hparams, backend, dtype, in_place=True, layout="auto"))
    runs.explain_backend(backend, dtype)
    runs.explain_blas_kernels(backend)
    runs.explain_verifier(verifier, backend)

    # this machine's costs, before the runs: the report's explanation, and --K auto's choices (JAX's device
    # loops time no single step, so they are measured there only for --K auto, which runs on the host)
    measured = costs.measure_costs(target, draft, prompt_ids, settings) if backend == "numpy" or K == "auto" else None
    speculative_draft = costs.AutoK(draft, measured) if K == "auto" else draft
    speculative = runs.verifier_decoder(verifier, n_drafts, replacement, tree_drafts)  # None: Algorithm 2
    runs_by_name, stats = runs.compare(decoders, lambda name: runs.run_decoder(
        name, prompt_ids, draft, speculative_draft, target, encoder, n_tokens_to_generate,
        runs.AUTO_K_MAX if K == "auto" else K, settings, seed, speculative), repeats)

    result = {"prompt": prompt, "draft": draft_model_size, "target": target_model_size, "K": K,
              "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
              "n_tokens": n_tokens_to_generate, "repeats": repeats, "backend": backend, "dtype": dtype,
              **verifier_flags, "costs": runs.describe_costs(measured)}
    stats = {name: stats.get(name) for name in DECODERS}  # the report follows this order
    result.update({name: runs_by_name.get(name) for name in DECODERS})
    runs.add_run_costs(result, stats, measured)
    runs.add_speedups(result)
    result["engine"] = runs.describe_engine(target)  # threads, the target's layouts, peak memory

    if json:
        print(jsonlib.dumps(result))
    else:
        print_report(result, stats, encoder.decode, use_colour=wants_colour(color), measured=measured)
    return result


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
