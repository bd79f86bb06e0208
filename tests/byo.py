"""A user's own model and data, built at test time: a tiny Qwen2 saved with `save_pretrained`, a BPE tokenizer
trained with `tokenizers` with a ChatML chat template, a JSONL prompt file with chat-message inputs, and a
reward module outside the package."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def questions(n: int, offset: int = 0) -> list[tuple[str, str]]:
    """(question, answer) pairs of one-digit sums."""
    out = []
    for k in range(offset, offset + n):
        a, b = k % 10, (k * 7) % 10
        out.append((f"What is {a} plus {b}?", str(a + b)))
    return out


def build_tokenizer(template: str = CHATML):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [
        f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n" for q, a in questions(200)
    ]
    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    core.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = template
    return tok


def build_model_dir(path: Path, template: str = CHATML) -> Path:
    """save_pretrained of a tiny random Qwen2 and its tokenizer into `path`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer(template)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def write_prompts(path: Path, n: int, offset: int = 0) -> Path:
    """JSONL rows: chat messages under "messages", the answer under "answer", metadata under "info"."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "messages": [
                {"role": "system", "content": "Answer with a number."},
                {"role": "user", "content": q},
            ],
            "answer": a,
            "info": {"source": "sums", "k": k},
        }
        for k, (q, a) in enumerate(questions(n, offset))
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_reward_module(directory: Path, name: str = "my_reward") -> str:
    """A reward module (slime's async (args, sample) convention) in `directory`; returns its dotted path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(
        textwrap.dedent('''
        async def reward(args, sample):
            """1 if the response contains the answer, plus a partial score for any digit."""
            text = sample.response
            return 1.0 if sample.label in text else (0.1 if any(c.isdigit() for c in text) else 0.0)
    ''')
    )
    return f"{name}.reward"
