"""ALBERT masked-language modelling on the experiment's corpus: DeDLOC's ALBERT and sahajBERT workload.

The model is ``transformers.AlbertForMaskedLM`` built from a size preset and the corpus's manifest (vocabulary,
sequence length, special token ids); batches are the corpus's shards with BERT's masking applied on the fly;
``export`` writes a folder that ``from_pretrained`` and ``AutoTokenizer`` load. The server imports this module to
validate ``Params``: torch, transformers and tokenizers are imported inside the methods that use them.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from swarmhub.common.protocol import OptimizerName
from swarmhub.worker.tasks import CorpusNotAttached, Evaluation, Task
from swarmhub.worker.tasks.masking import IGNORE, Vocabulary, choose_positions
from swarmhub.worker.tasks.unigram import UnigramBaseline, token_counts, unigram_baseline

if TYPE_CHECKING:
    import torch

    from swarmhub.worker.tasks import TaskData

# Sizes: (hidden, layers, attention heads, feed-forward, embedding). base and large are ALBERT's own (Lan et al.,
# 2019; DeDLOC trained albert-large); tiny trains on a CPU in seconds (tests); small is a laptop-sized model.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 256,
        "embedding_size": 32,
    },
    "small": {
        "hidden_size": 256,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "embedding_size": 128,
    },
    "base": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "embedding_size": 128,
    },
    "large": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
        "embedding_size": 128,
    },
}
# Sequences a second of one CPU thread of the reference machine (bench/task_rates.py: a bare loop with Adam on
# random tokens, local batch 8, 128 tokens a sequence, a vocabulary of 8,000: the corpus defaults); a peer's rate
# falls about in proportion to its sequences' length.
REFERENCE_SEQUENCES_PER_SECOND = {"tiny": 124.0, "small": 22.3, "base": 2.39, "large": 0.70}
REFERENCE_SEQ_LENGTH = 128
# LAMB's learning rate (bench/albert_settings.py, the demo's workload: held-out loss at equal samples): LAMB_RATE at
# LAMB_BATCH sequences a step; the task proposes it scaled with the square root of the batch, up to LAMB_MAX_RATE.
# Measured: at 256, 0.02 ahead of 0.014 (5.88 against 5.90 at 70k samples); at 512, 0.02 and 0.03 alike in the demo.
LAMB_RATE, LAMB_BATCH, LAMB_MAX_RATE = 0.02, 256, 0.04
WEIGHT_DECAY = 0.01  # LAMB's recipe for BERT and ALBERT; none on biases and LayerNorm
EVAL_SEED = 20_191_001  # fixed masking of the held-out set, so evaluations at different times compare
EVAL_BATCH = 32
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# BERT's split of the chosen positions: replaced by [MASK], by a random token, or left as they are.
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1


class AlbertParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: Literal["tiny", "small", "base", "large"] = Field(
        title="Model size",
        default="base",
        description="Model size: tiny (2 layers, 64 wide: tests), small (6 layers, 256 wide), "
        "base (ALBERT-base: 12 layers, 768 wide) or large (ALBERT-large: 24 layers, 1024 wide)",
    )
    batch_size: int = Field(default=8, title="Local batch size", ge=1, le=4096, description="Sequences per local step")
    masking: Literal["whole-word", "token"] = Field(
        title="Masking",
        default="whole-word",
        description="What is masked: whole words (every piece of a word together) or single tokens",
    )
    mlm_probability: float = Field(
        title="Masking rate",
        default=0.15,
        ge=0.01,
        le=0.5,
        description="Share of the tokens (or words) that the model must predict",
    )
    warmup_steps: int = Field(
        title="Warm-up steps",
        default=100,
        ge=0,
        le=10_000_000,
        description="Collaborative steps over which the learning rate rises to its value",
    )
    total_steps: int = Field(
        title="Total steps",
        default=10_000,
        ge=1,
        le=100_000_000,
        description="Collaborative steps after which the learning rate has decayed linearly to zero",
    )

    @model_validator(mode="after")
    def _decay_after_warmup(self) -> AlbertParams:
        if self.total_steps <= self.warmup_steps:
            raise ValueError(f"total_steps ({self.total_steps}) must be larger than warmup_steps ({self.warmup_steps})")
        return self


class AlbertMLMTask(Task):
    name = "albert-mlm"
    title = "ALBERT masked-language model (transformers) on the experiment's corpus"
    Params = AlbertParams
    params: AlbertParams
    needs_corpus = True
    keeps_checkpoints = True
    # DeDLOC's sahajBERT and hivemind's ALBERT example: groups of many peers over the internet, rounds that move
    # tens of megabytes, and a collaborative batch of 4,096 sequences (LAMB's large-batch regime).
    proposed_matchmaking_time = 5.0
    proposed_averaging_timeout = 60.0
    proposed_min_target_batch_size = 4096
    proposed_optimizer = OptimizerName.lamb

    def proposed_learning_rate(self, target_batch_size: int) -> float:
        """LAMB's rate for ``target_batch_size`` samples a step: the rate measured at ``LAMB_BATCH`` on the demo's
        workload (bench/albert_settings.py), scaled with the square root of the batch (You et al., 2019), at most
        ``LAMB_MAX_RATE``."""
        rate = LAMB_RATE * math.sqrt(target_batch_size / LAMB_BATCH)
        return float(f"{min(rate, LAMB_MAX_RATE):.2g}")

    baseline_label = "knows only token frequencies"
    held_out_words = "text no worker trains on"
    accuracy_words = (
        "the share of the held-out masked tokens the newest checkpoint ranks first, or among its five most likely"
    )
    download_words = (
        "in the transformers format (weights, config, tokenizer): "
        "load it with AutoModelForMaskedLM.from_pretrained(folder) after unzipping"
    )

    def __init__(self, params: BaseModel | dict[str, Any] | None = None):
        super().__init__(params)
        self._vocab: Vocabulary | None = None
        self._eval: tuple[Any, Any, Any] | None = None

    @property
    def batch_size(self) -> int:
        return self.params.batch_size

    def reference_samples_per_second(self) -> float:
        seq_length = int(self.data.manifest["seq_length"]) if self.data is not None else REFERENCE_SEQ_LENGTH
        return REFERENCE_SEQUENCES_PER_SECOND[self.params.size] * REFERENCE_SEQ_LENGTH / seq_length

    def attach(self, data: TaskData) -> None:
        super().attach(data)
        self._vocab = None
        self._eval = None

    def _corpus(self) -> TaskData:
        if self.data is None:
            raise CorpusNotAttached(
                "The albert-mlm task needs the experiment's corpus: call attach(corpus) before building the model "
                "or reading batches"
            )
        return self.data

    # -- model -------------------------------------------------------------------------------------------------

    def config(self) -> Any:
        """The ``AlbertConfig`` of the preset, sized to the corpus's vocabulary and sequence length."""
        from transformers import AlbertConfig

        manifest = self._corpus().manifest
        special = manifest["special_tokens"]
        settings: dict[str, Any] = {
            "vocab_size": int(manifest["vocab_size"]),
            "max_position_embeddings": int(manifest["seq_length"]),  # the longest input the model trains on
            **PRESETS[self.params.size],
            # ALBERT v2 and DeDLOC train without dropout.
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "classifier_dropout_prob": 0.0,
            "pad_token_id": special["pad"],
            "bos_token_id": special["cls"],
            "eos_token_id": special["sep"],
            "mask_token_id": special["mask"],  # kept in config.json for readers of the export
        }
        return AlbertConfig(**settings)

    def build_model(self) -> torch.nn.Module:
        self._corpus()  # the clear error before the slow import
        from transformers import AlbertForMaskedLM

        return AlbertForMaskedLM(self.config())

    def parameter_groups(self, model: torch.nn.Module) -> Iterable[Any]:
        """Weight decay on weight matrices and embeddings; none on biases and LayerNorm (LAMB's recipe)."""
        import torch

        decay: list[torch.nn.Parameter] = []
        no_decay: list[torch.nn.Parameter] = []
        seen: set[int] = set()  # tied weights (the output layer shares the input embedding) appear once
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                if id(param) in seen:
                    continue
                seen.add(id(param))
                if isinstance(module, torch.nn.LayerNorm) or name == "bias":
                    no_decay.append(param)
                else:
                    decay.append(param)
        return [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]

    # -- data --------------------------------------------------------------------------------------------------

    def _vocabulary(self) -> Vocabulary:
        if self._vocab is None:
            corpus = self._corpus()
            self._vocab = Vocabulary.load(corpus.file("tokenizer.json"), corpus.manifest)
        return self._vocab

    def masked_batch(
        self, sequences: np.ndarray, rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask, labels)`` for rows of token ids, with BERT's masking drawn from ``rng``.

        In each row, ``mlm_probability`` of the maskable positions (not [PAD], [UNK], [CLS], [SEP] or [MASK]) are
        chosen, at least one (rounded at random, so the share is right on average); with whole-word masking whole
        words are chosen, a word being a token and the ``##`` pieces after it. Of the chosen positions 80% become
        [MASK], 10% a random ordinary token and 10% stay; ``labels`` holds their original ids and -100 elsewhere.
        """
        import torch

        inputs, attention, labels = self.masked_arrays(sequences, rng)
        return torch.from_numpy(inputs), torch.from_numpy(attention), torch.from_numpy(labels)

    def masked_arrays(self, sequences: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        """``masked_batch`` as numpy arrays, without torch (the server masks the held-out set for its baseline)."""
        ids = np.asarray(sequences, dtype=np.int64)
        vocab = self._vocabulary()
        maskable = ~vocab.special[ids]
        if self.params.masking == "whole-word":
            previous_maskable = np.zeros_like(maskable)
            previous_maskable[:, 1:] = maskable[:, :-1]
            # A piece that follows a maskable token continues its word; one after [CLS] or [SEP] starts one.
            starts = maskable & ~(vocab.continuation[ids] & previous_maskable)
        else:
            starts = maskable
        chosen_starts = choose_positions(starts, self.params.mlm_probability, rng)
        # Every maskable token belongs to the word of the nearest start at or before it (same maskable run).
        positions = np.arange(ids.shape[1])
        word_start = np.maximum.accumulate(np.where(starts, positions, -1), axis=1)
        chosen = maskable & np.take_along_axis(chosen_starts, np.maximum(word_start, 0), axis=1) & (word_start >= 0)

        fate = rng.random(ids.shape)
        inputs = ids.copy()
        inputs[chosen & (fate < MASK_SHARE)] = vocab.mask_id
        randomised = chosen & (fate >= MASK_SHARE) & (fate < MASK_SHARE + RANDOM_SHARE)
        inputs[randomised] = rng.choice(vocab.ordinary, size=int(randomised.sum()))
        labels = np.where(chosen, ids, IGNORE)
        attention = (ids != vocab.pad_id).astype(np.int64)
        return inputs, attention, labels

    def batches(self, seed: int) -> Iterator[Any]:
        from swarmhub.worker.tasks.data import load_sequences

        rng = np.random.default_rng(seed)
        size = self.params.batch_size
        left = np.zeros((0, int(self._corpus().manifest["seq_length"])), dtype=np.int32)
        for shard in self._corpus().shards(seed):
            rows = load_sequences(shard)
            rows = np.concatenate([left, rows[rng.permutation(len(rows))]])
            full = len(rows) - len(rows) % size
            for start in range(0, full, size):
                yield self.masked_batch(rows[start : start + size], rng)
            left = rows[full:]  # carried into the next shard's first batch

    def loss(self, model: torch.nn.Module, batch: Any, device: torch.device) -> torch.Tensor:
        input_ids, attention_mask, labels = (tensor.to(device) for tensor in batch)
        return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss

    # -- schedule, evaluation, export --------------------------------------------------------------------------

    def lr_schedule(self) -> Callable[[int], float]:
        """Linear warm-up to the full rate over ``warmup_steps``, then linear decay to 0 at ``total_steps``.

        The first collaborative step already trains (at ``1 / warmup_steps`` of the rate), and step
        ``warmup_steps - 1`` reaches the full rate."""
        warmup, total = self.params.warmup_steps, self.params.total_steps

        def multiplier(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return max(0.0, (total - step) / (total - warmup))

        return multiplier

    def _eval_batches(self) -> tuple[Any, Any, Any]:
        if self._eval is None:
            from swarmhub.worker.tasks.data import load_sequences

            sequences = load_sequences(self._corpus().file("eval.npy"))
            self._eval = self.masked_batch(sequences, np.random.default_rng(EVAL_SEED))
        return self._eval

    def eval_labels(self) -> np.ndarray:
        """The held-out labels ``evaluate`` scores (the token ids at the masked positions, -100 elsewhere), from
        the same fixed masking; numpy only, for the server's baseline."""
        from swarmhub.worker.tasks.data import load_sequences

        sequences = load_sequences(self._corpus().file("eval.npy"))
        return self.masked_arrays(sequences, np.random.default_rng(EVAL_SEED))[2]

    def evaluate(self, model: torch.nn.Module, device: torch.device) -> float:
        """The mean masked-token loss on the corpus's held-out sequences, with the same masked positions (and
        replacements) every call."""
        return self.measure(model, device).loss

    def measure(self, model: torch.nn.Module, device: torch.device) -> Evaluation:
        """``evaluate``'s loss and, on the same masked positions, the share of labels the model ranks first
        (``top1``) or among its five most likely tokens (``top5``)."""
        import torch

        input_ids, attention_mask, labels = self._eval_batches()
        was_training = model.training
        model.eval()
        total, count, top1, top5 = 0.0, 0, 0, 0
        try:
            with torch.no_grad():
                for start in range(0, len(input_ids), EVAL_BATCH):
                    part = slice(start, start + EVAL_BATCH)
                    batch_labels = labels[part].to(device).flatten()
                    logits = model(
                        input_ids=input_ids[part].to(device), attention_mask=attention_mask[part].to(device)
                    ).logits.flatten(0, 1)
                    # A sum over tokens, so batches with more masked tokens weigh more: the mean over all of them.
                    total += float(
                        torch.nn.functional.cross_entropy(
                            logits.float(), batch_labels, ignore_index=IGNORE, reduction="sum"
                        )
                    )
                    scored = batch_labels != IGNORE
                    count += int(scored.sum())
                    best = logits[scored].topk(min(5, logits.shape[-1]), dim=-1).indices
                    hits = best == batch_labels[scored].unsqueeze(-1)
                    top1 += int(hits[:, 0].sum())
                    top5 += int(hits.any(dim=-1).sum())
        finally:
            model.train(was_training)
        count = max(count, 1)
        return Evaluation(loss=total / count, top1=top1 / count, top5=top5 / count)

    def baseline(self, shard_paths: Iterable[Path] = ()) -> UnigramBaseline:
        """The unigram model of the training shards (``shard_paths``: all of the corpus's) on the held-out masked
        positions (``evaluate``'s). Reads every shard: the server computes it once, when it prepares the corpus."""
        manifest = self._corpus().manifest
        counts = token_counts(shard_paths, len(self._vocabulary().special))
        return unigram_baseline(counts, self.eval_labels(), manifest["special_tokens"].values())

    def export(self, model: torch.nn.Module, folder: Path) -> None:
        """A transformers model folder (safetensors) with the corpus's tokenizer: ``AlbertForMaskedLM`` and
        ``AutoTokenizer.from_pretrained(folder)`` load it, and ``pipeline("fill-mask", ...)`` runs on it."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder)  # type: ignore[operator]
        corpus = self._corpus()
        for name in TOKENIZER_FILES:
            shutil.copyfile(corpus.file(name), folder / name)
