"""The held-out text's development and test splits, the prompts every benchmark on held-out text reads: what a bench
chooses (spec_bench's recipes, K and tree sizes; pair.py's best K; early_exit.py's exit layer; frspec_vocabulary.py's
vocabulary size) is chosen on the development split (dev), and what it reports is measured on the test split (test),
which nothing is chosen on. A bench that chooses nothing reads test alone.

Each held-out document (build/corpus/heldout.txt, its documents named in the manifest.json beside it) goes to one
split by a hash of its name (split_of): about half to each, and the same split in every build that holds it. Each
split's prompts of the three kinds (bench/heldout.py's open, copy and structured) are cut from its own documents only
and committed, token ids per prompt with the documents they come from, so the bench never rebuilds the corpus:

    python bench/spec_splits.py      # bench/prompts/dev.json and test.json from build/corpus/heldout.txt (seconds)

Each file records the command that cut it, the sha256 of the held-out text it was cut from (models/corpus_manifest.json
records the build the bundled pair was trained beside) and of the vocabulary that encoded it.
"""

import argparse
import hashlib
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from bench import heldout
from checkpoints.atomic import write_atomically
from encoder import EOT, get_encoder_from_dir
from tools.build_corpus import name_hash

REPO = Path(__file__).resolve().parents[1]
PROMPTS_DIR = REPO / "bench" / "prompts"
SPLITS = ("dev", "test")
SALT = "bench-split"  # name_hash's salt: independent of the held-out rule, which uses "heldout"
RULE = f"sha256('{SALT}:' + document name) % 2: 0 dev, 1 test"
CATEGORIES = ("open", "copy", "structured")
CUT = {"per_category": 64, "prompt_tokens": 64, "new_tokens": 48}  # the bench's at_K4 reads up to 64 per category


def split_of(name):  # -> "dev" or "test": the one rule that puts a held-out document in a split
    return SPLITS[name_hash(SALT, name) % 2]


def named_documents(heldout_path, manifest_path):  # -> [(name, text)] in the held-out text's order
    texts = Path(heldout_path).read_text(encoding="utf-8").split(EOT)
    names = json.loads(Path(manifest_path).read_text(encoding="utf-8")).get("documents", {}).get("heldout")
    if names is None:
        raise ValueError(f"{manifest_path} names no held-out documents: tools/build_corpus.py writes the manifest")
    if len(names) != len(texts):
        raise ValueError(f"{manifest_path} names {len(names)} held-out documents, {heldout_path} holds {len(texts)}")
    return list(zip(names, texts))


def of_split(documents, split):  # -> the (name, text) of these documents that split_of puts in split
    return [(name, text) for name, text in documents if split_of(name) == split]


def document_tokens(encoder, documents):  # -> (tokens, index of the document each token comes from)
    """Each document encoded on its own, so that no token spans two; a line break between documents (its own,
    bench/heldout.held_out_tokens' stand-in for the separator)."""
    newline = encoder.encode("\n")
    pieces = [(encoder.encode(text) + newline, i) for i, (_, text) in enumerate(documents)]
    tokens = np.asarray([token for ids, _ in pieces for token in ids], dtype=np.int64)
    return tokens, np.asarray([i for ids, i in pieces for _ in ids], dtype=np.int64)


def cut(encoder, documents, per_category, prompt_tokens, new_tokens, max_function_tokens):  # -> {category: [prompt]}
    """Every category's prompts from these documents alone; each prompt names the documents its tokens come from."""
    tokens, owner = document_tokens(encoder, documents)

    def window(start, extra=None):
        names = sorted({documents[i][0] for i in owner[start:start + prompt_tokens]})
        return {"documents": names, "start": int(start), **(extra or {}),
                "tokens": tokens[start:start + prompt_tokens].tolist()}

    structured, scores = heldout.structured_starts(tokens, per_category, prompt_tokens, new_tokens)
    functions = [(name, source) for name, text in documents for source in heldout.held_out_functions(text)]
    copies = heldout.copy_prompts(encoder, [source for _, source in functions], per_category, max_function_tokens)
    prompts = {"open": [window(start) for start in heldout.open_starts(len(tokens), per_category, prompt_tokens)],
               "copy": [{"documents": [functions[i][0]], "function": i, "tokens": ids.tolist()} for i, ids in copies],
               "structured": [window(start, {"repetition": round(score, 4)})
                              for start, score in zip(structured, scores)]}
    for category, chosen in prompts.items():
        for k, prompt in enumerate(chosen):
            prompt["id"] = f"{category}-{k:02d}"
    return prompts


def split_files(encoder, documents, settings, command, source):  # -> {split: the file's object}
    """Both splits' files: the documents of each (split_of) and the prompts cut from them."""
    files = {}
    for split in SPLITS:
        mine = of_split(documents, split)
        files[split] = {"split": split, "rule": RULE, "command": command, "heldout": source, "settings": settings,
                        "documents": [name for name, _ in mine],
                        "categories": cut(encoder, mine, settings["per_category"], settings["prompt_tokens"],
                                          settings["new_tokens"], settings["max_function_tokens"])}
    return files


def file_text(content):  # the file's JSON, one prompt per line
    head = {key: value for key, value in content.items() if key != "categories"}
    blocks = [f' {json.dumps(category)}: [\n' + ",\n".join(f"  {json.dumps(prompt)}" for prompt in prompts) + "\n ]"
              for category, prompts in content["categories"].items()]
    return json.dumps(head, indent=1)[:-2] + ',\n "categories": {\n' + ",\n".join(blocks) + "\n }\n}\n"


def load(split, prompts_dir=PROMPTS_DIR):  # -> the committed file of that split, checked to be that split's
    path = Path(prompts_dir) / f"{split}.json"
    if not path.is_file():
        raise ValueError(f"no {split} prompts at {path}: cut them with `python bench/spec_splits.py`")
    content = json.loads(path.read_text(encoding="utf-8"))
    if content.get("split") != split:
        raise ValueError(f"{path} holds the {content.get('split')!r} split, not {split!r}")
    return content


def add_prompts_dir_argument(parser):  # the flag of every bench that reads the splits
    parser.add_argument("--prompts_dir", default=str(PROMPTS_DIR), help="dev.json and test.json (bench/spec_splits.py)")


def check_vocabulary(content, vocabulary, target):  # a file cut with another vocabulary than the target's is refused
    if content["settings"]["vocabulary_sha256"] != vocabulary:
        raise ValueError(f"{content['split']}.json was cut with another vocabulary than {target}'s: rerun "
                         "python bench/spec_splits.py")


def target_vocabulary(models_dir, target):  # -> the sha256 of the target's vocabulary, as the files record theirs
    return sha256_of(Path(models_dir) / target / "encoder.json")


def open_prompts(split, n, prompt_tokens, models_dir, target, prompts_dir=PROMPTS_DIR):  # -> (prompts, their record)
    """n of the split's open prompts (held-out text to continue), spread over the file's, each cut to its first
    prompt_tokens tokens (None: whole): what the benches other than spec_bench read. The record (the JSON's
    "prompts" entry) names the split, the file's sha256, the ids read and the tokens kept of each."""
    content = load(split, prompts_dir)
    check_vocabulary(content, target_vocabulary(models_dir, target), target)
    longest, available = content["settings"]["prompt_tokens"], content["categories"]["open"]
    prompt_tokens = longest if prompt_tokens is None else prompt_tokens
    if not 1 <= prompt_tokens <= longest:
        raise ValueError(f"the {split} prompts hold {longest} tokens each: asked for {prompt_tokens}")
    if not 1 <= n <= len(available):
        raise ValueError(f"the {split} split holds {len(available)} open prompts: asked for {n}")
    chosen = heldout.spread(available, n)
    record = {"split": split, "sha256": sha256_of(Path(prompts_dir) / f"{split}.json"), "category": "open",
              "ids": [prompt["id"] for prompt in chosen], "prompt_tokens": prompt_tokens}
    return [np.asarray(prompt["tokens"][:prompt_tokens], dtype=np.int64) for prompt in chosen], record


def bench_prompts(args, split):  # -> open_prompts' (prompts, record) from a bench's flags, or exit status 2
    """What a bench reads of a split from its flags (--n_prompts, --prompt_tokens, --models_dir, --target,
    --prompts_dir): a file it cannot use is a one-line error and exit status 2."""
    try:
        return open_prompts(split, args.n_prompts, args.prompt_tokens, args.models_dir, args.target, args.prompts_dir)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2)


def sha256_of(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heldout", default="build/corpus/heldout.txt", help="held-out text (tools/build_corpus.py)")
    parser.add_argument("--manifest", help="its manifest.json, naming the documents (default: beside --heldout)")
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--target", default="teach-target", help="the model folder whose vocabulary encodes them")
    parser.add_argument("--out_dir", default="bench/prompts")
    for name, value in CUT.items():
        parser.add_argument(f"--{name}", type=int, default=value)
    args = parser.parse_args(argv)
    if min(args.per_category, args.prompt_tokens, args.new_tokens) < 1:
        parser.error("--per_category, --prompt_tokens and --new_tokens must be positive")
    return args


def main(argv=None):
    args = parse_args(argv)
    heldout.require_heldout(args.heldout)
    manifest = Path(args.manifest or Path(args.heldout).with_name("manifest.json"))
    model_dir = Path(args.models_dir) / args.target
    try:
        documents = named_documents(args.heldout, manifest)
        n_ctx = json.loads((model_dir / "hparams.json").read_text())["n_ctx"]
        settings = {"per_category": args.per_category, "prompt_tokens": args.prompt_tokens,
                    "new_tokens": args.new_tokens, "max_function_tokens": (n_ctx - args.new_tokens) // 2 - 8,
                    "vocabulary_sha256": sha256_of(model_dir / "encoder.json")}
        source = {"path": args.heldout, "sha256": sha256_of(args.heldout), "documents": len(documents)}
        command = shlex.join(["python", "bench/spec_splits.py", *(sys.argv[1:] if argv is None else argv)])
        files = split_files(get_encoder_from_dir(model_dir), documents, settings, command, source)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    for split, content in files.items():
        write_atomically(Path(args.out_dir) / f"{split}.json", file_text(content).encode())
        print(f"{split}: {len(content['documents'])} documents, " + ", ".join(
            f"{len(prompts)} {category}" for category, prompts in content["categories"].items()))


if __name__ == "__main__":
    main()
