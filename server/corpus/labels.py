"""An image archive's optional ``labels.csv``: which images are labelled, and with what.

The file sits at the archive's root; each row is ``path,label`` (a header row ``path,label`` is optional), where a
path is the image's path in the archive. Labels only measure the trained backbone (k-nearest-neighbour accuracy on
held-out images): training never sees them. ``split`` chooses the held-out queries and the labelled bank they are
compared with. Every refusal is a ``CorpusError`` (field "file") saying which line is wrong and what to do.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

import numpy as np

from swarmhub.server.corpus.archive import clean_name, shown
from swarmhub.server.corpus.upload import CorpusError, size_text

LABELS_FILE = "labels.csv"
MAX_LABELS_BYTES = 16 * 2**20
MAX_CLASSES = 1000
MAX_LABEL_LENGTH = 100
MIN_LABELLED = 8  # two held-out images at least, and a bank to compare them with
EVAL_SHARE = 0.25  # of the labelled images, held out as queries (never trained on)
MAX_EVAL_IMAGES = 1024
MAX_BANK_IMAGES = 4096  # the labelled training images the queries are compared with
SPLIT_SEED = 0
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
HOW = "each row of labels.csv is path,label, with the image's path as the archive names it"


@dataclass(frozen=True)
class Split:
    """Labelled images: the held-out queries (``eval``, left out of training) and the ``bank`` (also trained on),
    each a list of (path, class index); ``classes`` are the labels, sorted."""

    classes: list[str]
    eval: list[tuple[str, int]]
    bank: list[tuple[str, int]]


def parse(data: bytes, images: set[str]) -> dict[str, str]:
    """Image path -> label, from the bytes of ``labels.csv``; every path must be one of ``images``."""
    if len(data) > MAX_LABELS_BYTES:
        raise CorpusError(f"labels.csv is over {size_text(MAX_LABELS_BYTES)}: label fewer images.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise CorpusError(
            f"labels.csv is not UTF-8 (line {line}): save it as UTF-8 and make the archive again."
        ) from None
    labels: dict[str, str] = {}
    first = True
    try:
        reader = csv.reader(io.StringIO(text, newline=""))
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            header, first = first and [cell.strip().lower() for cell in row] == ["path", "label"], False
            if not header:
                _take(row, labels, images, f"labels.csv line {reader.line_num}")
    except csv.Error as error:
        raise CorpusError(f"labels.csv cannot be read as CSV ({error}): {HOW}.") from None
    if not labels:
        raise CorpusError(f"labels.csv labels no image: {HOW}, or leave labels.csv out.")
    classes = set(labels.values())
    if len(classes) > MAX_CLASSES:
        raise CorpusError(
            f"labels.csv has {len(classes):,} different labels, over the {MAX_CLASSES:,} the server takes: "
            "merge some classes."
        )
    if len(classes) < 2:
        raise CorpusError(
            f"labels.csv gives every image the label {next(iter(classes))!r}: label images of two classes at least "
            "(labels measure how well the backbone tells them apart), or leave labels.csv out."
        )
    if len(labels) < MIN_LABELLED:
        raise CorpusError(
            f"labels.csv labels {len(labels)} images: label at least {MIN_LABELLED} (a quarter of them are held out "
            "to measure the backbone), or leave labels.csv out."
        )
    return labels


def _take(row: list[str], labels: dict[str, str], images: set[str], where: str) -> None:
    if len(row) != 2:
        raise CorpusError(f"{where} has {len(row)} columns, not 2: {HOW}.")
    path, label = clean_name(row[0].strip()), row[1].strip()
    if not label:
        raise CorpusError(f"{where} gives {shown(path)} an empty label: give it one, or leave the row out.")
    if len(label) > MAX_LABEL_LENGTH or CONTROL.search(label):
        raise CorpusError(
            f"{where} gives {shown(path)} a label over {MAX_LABEL_LENGTH} characters or with control characters: "
            "use short class names."
        )
    if path not in images:
        raise CorpusError(f"{where} names {shown(path)}, which is no image in the archive: {HOW}.")
    if labels.get(path, label) != label:
        raise CorpusError(f"{where} labels {shown(path)} again, differently: give each image one label.")
    labels[path] = label


def split(labels: dict[str, str]) -> Split:
    """About ``EVAL_SHARE`` of the labelled images (at most ``MAX_EVAL_IMAGES``) held out, at most
    ``MAX_BANK_IMAGES`` of the rest as the bank; chosen by a seeded shuffle of the sorted paths, so the same archive
    always gives the same split."""
    classes = sorted(set(labels.values()))
    index = {name: i for i, name in enumerate(classes)}
    paths = sorted(labels)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(paths))
    chosen = [(paths[int(i)], index[labels[paths[int(i)]]]) for i in order]
    held_out = min(MAX_EVAL_IMAGES, max(1, round(len(chosen) * EVAL_SHARE)))
    return Split(classes, chosen[:held_out], chosen[held_out : held_out + MAX_BANK_IMAGES])
