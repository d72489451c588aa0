"""The tokenizers of the tiny test models (``tiny_models``): SmolLM2's BPE tokenizer copied
from the default model, or, for Gemma 2, a small sentencepiece model trained here.

llama.cpp's converter reads Gemma 2's vocabulary only from a sentencepiece ``tokenizer.model``;
the one trained here is deterministic (one thread, the whole corpus, a fixed seed) and its
``tokenizer.json`` is transformers' conversion of it, so both files describe one vocabulary.
"""

from __future__ import annotations

import io
import json
import random
import shutil
from pathlib import Path
from typing import Any

# Gemma's own layout of the special tokens, which the sentencepiece model reproduces.
GEMMA_VOCAB = 2048
GEMMA_PAD, GEMMA_EOS, GEMMA_BOS = 0, 1, 2
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def smollm_folder(cache_dir: Path) -> Path:
    from shared.model.files import resolve_model

    return resolve_model(None, cache_dir).path


def copy_smollm_tokenizer(out: Path, smollm: Path) -> None:
    shutil.copyfile(smollm / "tokenizer.json", out / "tokenizer.json")
    tok_config = json.loads((smollm / "tokenizer_config.json").read_text(encoding="utf-8"))
    # SmolLM2's own tokenizer_config.json names GPT2Tokenizer (a byte-level BPE); llama.cpp's
    # Phi-3 converter reads that name to take the BPE path instead of asking for sentencepiece.
    tok_config["tokenizer_class"] = "GPT2Tokenizer"
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    template = smollm / "chat_template.jinja"
    if template.is_file():
        shutil.copyfile(template, out / "chat_template.jinja")


def resave_tokenizer(out: Path) -> None:
    """Rewrites the tokenizer files as transformers loads them for this model type.

    transformers 5 overrides the tokenizer class of some model types (Qwen2's runs its own
    pre-tokenizer regex over any tokenizer.json); saving it back makes tokenizer.json say what
    transformers computes, so every reader of the folder tokenizes alike.
    """
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(out)).save_pretrained(str(out))


def drop_loading_state(path: Path) -> None:
    """Removes what transformers records about how it loaded a tokenizer (where from, whether
    offline), which differs between runs of the same recipe and means nothing to a reader."""
    tok_config = json.loads(path.read_text(encoding="utf-8"))
    for key in ("vocab_file", "is_local", "local_files_only"):
        tok_config.pop(key, None)
    path.write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")


def _training_text(smollm: Path) -> list[str]:
    """Sentences of ASCII words from SmolLM2's vocabulary, drawn from a fixed seed."""
    vocab = json.loads((smollm / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    # "Ġ" marks a token that starts with a space in byte-level BPE: these are whole words.
    words = sorted(
        t[1:] for t in vocab if t.startswith("Ġ") and t[1:].isascii() and t[1:].isalpha()
    )
    rng = random.Random(1234)
    marks = [".", ",", "?", "!", ""]
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(4, 16))) + rng.choice(marks)
        for _ in range(4000)
    ]


def write_sentencepiece_tokenizer(out: Path, smollm: Path) -> None:
    import sentencepiece as spm
    from transformers import AutoTokenizer

    model = io.BytesIO()
    # One thread and the whole corpus (no sampling): the trained model is the same every time.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_training_text(smollm)),
        model_writer=model,
        vocab_size=GEMMA_VOCAB,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        pad_id=GEMMA_PAD,
        eos_id=GEMMA_EOS,
        bos_id=GEMMA_BOS,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        # transformers' GemmaTokenizer expects a <mask> token, as Gemma's vocabulary has.
        user_defined_symbols=["<mask>", "<start_of_turn>", "<end_of_turn>"],
        num_threads=1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    (out / "tokenizer.model").write_bytes(model.getvalue())
    specials = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    tok_config: dict[str, Any] = {"tokenizer_class": "GemmaTokenizer", "unk_token": "<unk>"}
    tok_config |= specials
    # Gemma prompts start with <bos>, which the tokenizer adds.
    tok_config["add_bos_token"] = True
    config_path = out / "tokenizer_config.json"
    config_path.write_text(json.dumps(tok_config, indent=2) + "\n")
    # transformers converts the sentencepiece model into tokenizer.json; saving rewrites
    # tokenizer_config.json in its own form beside it.
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    if len(tokenizer) != GEMMA_VOCAB:
        raise RuntimeError(f"the Gemma tokenizer has {len(tokenizer)} tokens, not {GEMMA_VOCAB}")
    tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out))
