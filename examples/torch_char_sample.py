"""Samples text from the character model that examples/torch_char_transformer.py saved, with plain
torch (no ZeroShard, no safetensors package): reads the safetensors file and the .json beside it
(sizes and vocabulary) into the same model class.

    /usr/bin/python3 examples/torch_char_sample.py char_transformer.safetensors --length 300
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import char_model  # noqa: E402  (beside this script)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the .safetensors file the training script saved")
    parser.add_argument("--length", type=int, default=300, help="characters to generate")
    parser.add_argument("--prompt", default="\n", help="text the sample continues")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top_k", type=int, default=None,
                        help="sample among the k likeliest characters only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None,
                        help="also write the prompt and the sample, exactly, to this file")
    args = parser.parse_args(argv)
    if args.length < 0:
        parser.error("--length must be >= 0")
    if args.temperature <= 0:
        parser.error("--temperature must be > 0")
    if not args.prompt:
        parser.error("--prompt must not be empty")
    return args


def load_model(path):
    config, vocabulary = char_model.read_config(path)
    model = char_model.CharTransformer(len(vocabulary), **config)
    model.load_state_dict(char_model.load_safetensors(path), strict=True)
    model.eval()
    return model, vocabulary


@torch.no_grad()
def generate(model, vocabulary, prompt, length, temperature, top_k, generator):
    ids = vocabulary.encode(prompt).unsqueeze(0)
    for _ in range(length):
        logits = model(ids[:, -model.context:])[0, -1] / temperature
        if top_k is not None and top_k < logits.numel():
            cutoff = torch.topk(logits, top_k).values[-1]
            logits = logits.masked_fill(logits < cutoff, float("-inf"))
        following = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        ids = torch.cat([ids, following.view(1, 1)], dim=1)
    return vocabulary.decode(ids[0].tolist())


def main(argv):
    args = parse_args(argv)
    model, vocabulary = load_model(args.model)
    generator = torch.Generator().manual_seed(args.seed)
    text = generate(model, vocabulary, args.prompt, args.length, args.temperature, args.top_k,
                    generator)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
