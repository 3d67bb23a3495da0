"""The corpus's tokenizer: a WordPiece tokenizer (the tokenizers library) trained on the training text, and
token ids packed into rows ``[CLS] tokens [SEP]``, as workers and their evaluation read them."""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
# The trainer gives special tokens the first ids in this order; workers and the eval loop rely on them.
SPECIAL_IDS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
ENCODE_BATCH = 2000  # paragraphs per encode_batch call: bounds the Encoding objects alive at once


def new_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(unk_token=SPECIAL_TOKENS["unk"], continuing_subword_prefix="##"))
    # Cased, accents kept: stripping accents would delete the vowel signs of Indic scripts, for example.
    tokenizer.normalizer = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.BertNormalizer(
                clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False
            ),
        ]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()  # splits on whitespace and punctuation
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def train_tokenizer(paragraphs: list[str], vocab_size: int) -> Tokenizer:
    tokenizer = new_tokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS.values()),
        limit_alphabet=min(1000, vocab_size // 2),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tokenizer.train_from_iterator(paragraphs, trainer=trainer, length=len(paragraphs))
    for key, token in SPECIAL_TOKENS.items():
        assert tokenizer.token_to_id(token) == SPECIAL_IDS[key], (token, tokenizer.token_to_id(token))
    cls, sep = SPECIAL_TOKENS["cls"], SPECIAL_TOKENS["sep"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=[(cls, CLS), (sep, SEP)]
    )
    return tokenizer


def encode(tokenizer: Tokenizer, paragraphs: list[str]) -> list[np.ndarray]:
    ids: list[np.ndarray] = []
    for start in range(0, len(paragraphs), ENCODE_BATCH):
        batch = tokenizer.encode_batch(paragraphs[start : start + ENCODE_BATCH], add_special_tokens=False)
        ids += [np.asarray(encoding.ids, dtype=np.int32) for encoding in batch]
    return ids


def pack(ids: list[np.ndarray], seq_length: int) -> np.ndarray:
    """Consecutive token ids as rows ``[CLS] up to seq_length-2 tokens [SEP]``, across paragraph boundaries; the
    last row is padded after its ``[SEP]``."""
    stream = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
    body = seq_length - 2
    rows = -(-len(stream) // body)
    packed = np.full((rows, seq_length), PAD, dtype=np.int32)
    if rows == 0:
        return packed
    packed[:, 0] = CLS
    full = len(stream) // body
    packed[:full, 1 : body + 1] = stream[: full * body].reshape(full, body)
    packed[:full, body + 1] = SEP
    rest = stream[full * body :]
    if len(rest):
        packed[full, 1 : len(rest) + 1] = rest
        packed[full, len(rest) + 1] = SEP
    return packed


def tokenizer_config(seq_length: int) -> dict[str, Any]:
    """What ``transformers.AutoTokenizer`` reads beside tokenizer.json, written here so the server needs no
    transformers."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": seq_length,
        **{f"{key}_token": token for key, token in SPECIAL_TOKENS.items()},
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
    }
