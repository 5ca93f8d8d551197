"""A tiny HF checkpoint directory made locally: a BPE tokenizer trained here, a chat template, random weights.

It is what a real checkpoint looks like to rlhf_dyna (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, chat_template.jinja, generation_config.json), small enough for CPU ranks, so tests and
newcomers without a model hub can try `model.path=DIR task=file`:

    python -m rlhf_dyna.models.tiny_checkpoint /tmp/tiny_llama
    python -m rlhf_dyna.models.tiny_checkpoint /tmp/tiny_rm --reward-model   # a one-label sequence classifier
    python -m rlhf_dyna.models.tiny_checkpoint /tmp/smollm_shape --size smollm-135m   # a real model's cost
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .architectures import live_architectures
from .build import build_policy, save_hf_dir
from .hf_config import ModelSpec, make_hf_config
from .reward import reward_config

PAD, BOS, EOS, UNK, IM_START, IM_END = "<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, IM_START, IM_END)
# ChatML, as Qwen's checkpoints write it; a turn ends with <|im_end|>, which is also the checkpoint's eos
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# Random-weight checkpoints of a real model's shape cost what the real one costs (benchmarks: scripts/bench_peer.py).
SIZES: dict[str, dict] = {
    "smollm-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                        num_key_value_heads=3, embedding_rows=49152, tie_word_embeddings=True,
                        max_position_embeddings=2048),
}


def corpus() -> list[str]:
    """Text the BPE merges are learned from: digits, arithmetic and the words of chat prompts about math."""
    lines = [f"What is {a} + {b}? The answer is {a + b}. #### {a + b}" for a in range(0, 100, 7) for b in range(0, 100, 11)]
    lines += [f"Compute {a} * {b}. \\boxed{{{a * b}}}" for a in range(12) for b in range(12)]
    lines += ["system user assistant You are a helpful assistant. Answer with a number. Question: Solve"] * 20
    return lines


def train_tokenizer(vocab_size: int = 384) -> Tokenizer:
    """Byte-level BPE (every string encodes, nothing maps to <unk>) with the special tokens first (ids 0..5)."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus(), trainer)
    return tokenizer


def make_tiny_checkpoint(out_dir: str | Path, arch: str = "llama", vocab_size: int = 384, hidden_size: int = 128,
                         intermediate_size: int = 256, num_hidden_layers: int = 2, num_attention_heads: int = 4,
                         num_key_value_heads: int = 2, max_position_embeddings: int = 512,
                         tie_word_embeddings: bool = False, chat_template: bool = True, seed: int = 0,
                         dtype: torch.dtype = torch.float32, initializer_range: float = 0.02, num_experts: int = 0,
                         num_experts_per_tok: int = 0, moe_intermediate_size: int = 0, embedding_rows: int = 0) -> Path:
    """Write the directory and return its path. head_dim = hidden / heads must be one vLLM's CPU attention takes
    (32, 64, 80, ...). The embedding has the tokenizer's size rounded up to a multiple of 16 (TP splits it), or
    `embedding_rows` when that is larger (a real model's vocabulary; ids past the tokenizer decode to nothing)."""
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(vocab_size), bos_token=BOS, eos_token=IM_END,
                                        pad_token=PAD, unk_token=UNK)
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    spec = ModelSpec(
        arch=arch, vocab_size=max(-(-len(tokenizer) // 16) * 16, embedding_rows), hidden_size=hidden_size,
        intermediate_size=intermediate_size, num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=tie_word_embeddings,
        initializer_range=initializer_range, bos_token_id=ids[BOS], eos_token_id=ids[IM_END], pad_token_id=ids[PAD],
        num_experts=num_experts, num_experts_per_tok=num_experts_per_tok, moe_intermediate_size=moe_intermediate_size,
    )
    policy = build_policy(spec, dtype, seed=seed)
    save_hf_dir(policy, make_hf_config(spec), out)
    tokenizer.save_pretrained(str(out))
    # two stop tokens, as instruct checkpoints ship them: the end of a turn and the end of text
    GenerationConfig(bos_token_id=ids[BOS], eos_token_id=[ids[IM_END], ids[EOS]], pad_token_id=ids[PAD]).save_pretrained(out)
    return out


def make_tiny_reward_model(out_dir: str | Path, seed: int = 0, **kwargs) -> Path:
    """The tiny checkpoint's directory as a reward model: the same tokenizer and chat template, a random
    `AutoModelForSequenceClassification` with one label (backbone and score head seeded) in place of the causal LM."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    out = make_tiny_checkpoint(out_dir, seed=seed, **kwargs)
    causal = AutoConfig.from_pretrained(out)
    config = reward_config(causal, causal.pad_token_id)
    torch.manual_seed(seed + 1)
    model = AutoModelForSequenceClassification.from_config(config, dtype=kwargs.get("dtype", torch.float32))
    save_hf_dir(model, config, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--arch", default="llama", choices=live_architectures())
    parser.add_argument("--size", choices=sorted(SIZES), help="a real model's shape (overrides --hidden-size, --layers)")
    parser.add_argument("--experts", type=int, default=4, help="qwen3_moe only: experts per layer (2 routed per token)")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--no-chat-template", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reward-model", action="store_true", help="a one-label sequence classifier (reward_model.path)")
    args = parser.parse_args()
    shape = SIZES[args.size] if args.size else dict(hidden_size=args.hidden_size, intermediate_size=2 * args.hidden_size,
                                                   num_hidden_layers=args.layers)
    experts = dict(num_experts=args.experts, num_experts_per_tok=2, moe_intermediate_size=shape["hidden_size"] // 2)
    make = make_tiny_reward_model if args.reward_model else make_tiny_checkpoint
    out = make(args.out_dir, arch=args.arch, chat_template=not args.no_chat_template, seed=args.seed,
               **shape, **(experts if args.arch == "qwen3_moe" else {}))
    config = json.loads((out / "config.json").read_text())
    print(f"wrote {out}: {config['architectures'][0]}, vocab {config['vocab_size']}, hidden {config['hidden_size']}, "
          f"{config['num_hidden_layers']} layers")


if __name__ == "__main__":
    main()
