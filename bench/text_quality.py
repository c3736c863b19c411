"""How well the bundled target writes: bits per byte and distinct 4-grams of its greedy continuations.

- Bits per byte, comparable across vocabularies: the total negative log-likelihood in nats of every token
  of the scored documents, / ln 2, / the documents' UTF-8 bytes. Each document is scored on its own,
  from <|endoftext|> (so its first token is predicted too), in consecutive windows of n_ctx tokens
  (perplexity). Two sets: the held-out documents of the corpus in the test split (bench/spec_splits.py's rule over
  the names in the manifest.json beside --heldout; each cut to its first --doc_chars characters), and Python source
  outside the corpus: NumPy's own modules (tests left out), which tools/build_corpus.py never takes.
- Distinct 4-grams: --n_prompts open prompts of the held-out text's test split (bench/prompts/test.json,
  bench/spec_splits.py; their first --prompt_tokens tokens; the bench chooses nothing, so it reads no development
  prompt), each continued greedily (temperature 0) for --n_tokens tokens. For each
  continuation, distinct 4-grams / all 4-grams; `distinct_4grams` is their mean, `distinct_4grams_pooled`
  counts over all continuations together. Loops score low: a 4-token loop gives 4 distinct of 93.

    python bench/text_quality.py                     # the committed pair, held-out text from build/corpus

Prints one JSON object as its last line.
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

import engine
import gpt2
import sampling
import utils
from bench import spec_splits
from bench.heldout import require_heldout


def perplexity(tokens, params, hparams):
    """exp(mean next-token cross-entropy) of a token sequence, scored in consecutive full-context windows."""
    nll, count = 0.0, 0
    for start in range(0, len(tokens) - 1, hparams["n_ctx"]):
        window = np.asarray(tokens[start:start + hparams["n_ctx"] + 1])
        logits = gpt2.gpt2(window[:-1], **params, n_head=hparams["n_head"]).astype(np.float64)  # sums need float64
        log_probs = gpt2.log_softmax(logits)
        nll -= log_probs[np.arange(len(window) - 1), window[1:]].sum()
        count += len(window) - 1
    return math.exp(nll / count)


def total_nats(tokens, params, hparams):
    """Negative log-likelihood in nats of tokens[1:] given what precedes them, summed (perplexity's windows)."""
    return math.log(perplexity(tokens, params, hparams)) * (len(tokens) - 1)


def bits_per_byte(documents, encoder, params, hparams):
    """(bits per UTF-8 byte, bytes scored, tokens scored) over documents, each predicted from <|endoftext|>."""
    nats = n_bytes = n_tokens = 0
    for text in documents:
        tokens = [encoder.eot_token] + encoder.encode(text)
        nats += total_nats(tokens, params, hparams)
        n_bytes += len(text.encode("utf-8"))
        n_tokens += len(tokens) - 1
    return nats / math.log(2) / n_bytes, n_bytes, n_tokens


def distinct_ngrams(tokens, n=4):
    """(distinct n-grams, all n-grams) of a token sequence."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)), len(grams)


def documents_of_test_split(heldout, manifest, doc_chars):
    """The held-out documents of the test split, each cut to its first doc_chars characters."""
    named = spec_splits.of_split(spec_splits.named_documents(heldout, manifest), "test")
    return [text[:doc_chars] for _, text in named if text.strip()]


def numpy_sources(n_files, doc_chars):
    """n_files of NumPy's own .py modules (tests left out), spread over them in name order, cut to doc_chars."""
    root = Path(np.__file__).parent
    paths = sorted(p for p in root.rglob("*.py") if not {"tests", "testing"} & set(p.relative_to(root).parts[:-1])
                   and p.stat().st_size > 1000)
    chosen = [paths[i * len(paths) // n_files] for i in range(min(n_files, len(paths)))]
    texts = [p.read_text(encoding="utf-8")[:doc_chars] for p in chosen]
    return texts, [p.relative_to(root.parent).as_posix() for p in chosen]


def greedy_continuations(model, prompts, n_tokens):
    continuations = []
    for prompt in prompts:
        model.reset()
        out = sampling.autoregressive_sampling(prompt, model, n_tokens, temperature=0, rng=np.random.default_rng(0))
        continuations.append(out[len(prompt):].tolist())
    return continuations


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--target", default="teach-target")
    parser.add_argument("--draft", default="teach-draft", help="scored too, for comparison ('' to skip)")
    parser.add_argument("--heldout", default="build/corpus/heldout.txt", help="held-out text (tools/build_corpus.py)")
    parser.add_argument("--manifest", help="its manifest.json, naming the documents (default: beside --heldout)")
    spec_splits.add_prompts_dir_argument(parser)
    for flag, default, meaning in (("--doc_chars", 2000, "characters scored per document"),
                                   ("--numpy_files", 40, "NumPy modules scored as unseen Python (0: none)"),
                                   ("--n_prompts", 8, "test prompts continued greedily"),
                                   ("--prompt_tokens", 32, "tokens in each prompt"),
                                   ("--n_tokens", 96, "greedy tokens per prompt"),
                                   ("--samples", 3, "continuations printed as text in the result")):
        parser.add_argument(flag, type=int, default=default, help=meaning)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    require_heldout(args.heldout)
    prompts, record = spec_splits.bench_prompts(args, "test")
    try:
        manifest = args.manifest or Path(args.heldout).with_name("manifest.json")
        documents = documents_of_test_split(args.heldout, manifest, args.doc_chars)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2)
    started = time.perf_counter()
    encoder, hparams, params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
    models = {"target": (hparams, params)}
    if args.draft:
        models["draft"] = utils.load_encoder_hparams_and_params(args.draft, args.models_dir)[1:]
    result = {"target": args.target, "draft": args.draft or None, "heldout": args.heldout,
              "heldout_split": "test", "heldout_documents": len(documents), "doc_chars": args.doc_chars}
    for role, (role_hparams, role_params) in models.items():
        bpb, n_bytes, n_tokens = bits_per_byte(documents, encoder, role_params, role_hparams)
        result.update({f"{role}_bits_per_byte": bpb, "heldout_bytes": n_bytes, "heldout_tokens": n_tokens})
    if args.numpy_files:
        sources, names = numpy_sources(args.numpy_files, args.doc_chars)
        bpb, n_bytes, _ = bits_per_byte(sources, encoder, params, hparams)
        result.update(target_bits_per_byte_numpy=bpb, numpy_bytes=n_bytes, numpy_version=np.__version__,
                      numpy_files=names)

    continuations = greedy_continuations(engine.fast_model(params, hparams), prompts, args.n_tokens)
    counts = [distinct_ngrams(c) for c in continuations]
    pooled = [tuple(c[i:i + 4]) for c in continuations for i in range(len(c) - 3)]
    result.update(split="test", prompts=record, n_prompts=args.n_prompts, prompt_tokens=args.prompt_tokens,
                  n_tokens=args.n_tokens,
                  distinct_4grams=float(np.mean([d / t for d, t in counts])),
                  distinct_4grams_pooled=len(set(pooled)) / len(pooled),
                  samples=[{"prompt": encoder.decode(p.tolist()), "continuation": encoder.decode(c)}
                           for p, c in list(zip(prompts, continuations))[:args.samples]],
                  seconds=time.perf_counter() - started)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
