"""An experiment's image corpus: an archive of images (or the built-in shapes) decoded and cut into shards once.

``prepare`` reads an uploaded archive (:mod:`.archive`: zip or tar, checked member by member) in two passes over
the spooled file: the first reads only headers and ``labels.csv`` (:mod:`.labels`) and refuses a bad archive before
anything is decoded; the second decodes one image at a time (PNG, JPEG, WebP, GIF's first frame, BMP), converts it
to RGB, crops its centre square, resizes it to ``image_size`` and writes it straight into its place in a shard file.
Neither the archive nor the decoded images are ever held whole. ``prepare_builtin`` draws the ``shapes`` set
(:mod:`swarmhub.worker.tasks.shapes`). Both write the folder workers download::

    manifest.json     {"format": 1, "kind": "images", "image_size", "images" (training images), "classes",
                       "source", "sha256" (the corpus's identity), "files", "shards": [{"name", "sha256", "images"}]}
    shard-00000.npy   training images, uint8 (n, 3, S, S), in a seeded shuffle of the archive's order
    eval.npy          held-out labelled images (never in a shard) and ``eval_labels.npy``, int64 indices of classes
    bank.npy          labelled training images (in the shards too) and ``bank_labels.npy``

``eval*`` and ``bank*`` exist only when the archive has labels. Every array is saved without pickle. The folder is
built beside its place and swapped in whole (``text.swap_in``), as a text corpus is.

Files in the archive: images by their extension; ``labels.csv`` at the root; hidden files, ``__MACOSX/``,
``Thumbs.db`` and ``desktop.ini`` are left out unread; an image format the server does not decode (TIFF, HEIC, ...)
is refused; any other file (a README, a CSV of notes) is skipped and counted in the manifest's ``skipped``.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import IO, Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from swarmhub.server.corpus import labels as labelling
from swarmhub.server.corpus.archive import FIX, Archive, Member, open_archive, shown
from swarmhub.server.corpus.text import FORMAT, file_facts, swap_in, write_json
from swarmhub.server.corpus.upload import CorpusError, size_text

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp"}
DECODERS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # Pillow opens nothing else: a .png that is a TIFF is refused
UNSUPPORTED = {".tif", ".tiff", ".heic", ".heif", ".avif", ".svg", ".ico", ".jp2", ".psd", ".dng", ".cr2", ".nef"}
CLUTTER = {"__macosx", "thumbs.db", "desktop.ini"}  # with hidden files: what archivers and file browsers add
MAX_PIXELS = 25_000_000  # width x height of one image, read from its header before it is decoded
MIN_IMAGES = 64  # training images, the held-out ones not counted
MAX_PREPARED_BYTES = 8 * 2**30  # all arrays written
SHUFFLE_SEED = 0  # the training images' order across the shards: the archive's order would give shards of one folder
LIMITS = {"image_size": (16, 256), "shard_images": (1, 65_536)}
BUILTIN_IMAGE_SETS = {
    "shapes": "Shapes and textures of 8 kinds, drawn by the server (4,096 images; 2,560 labelled)",
}
SHAPES_TRAIN, SHAPES_BANK, SHAPES_EVAL = 4096, 2048, 512


def check_settings(image_size: int, shard_images: int) -> None:
    for field, value in (("image_size", image_size), ("shard_images", shard_images)):
        low, high = LIMITS[field]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise CorpusError(f"{field} must be a whole number from {low} to {high}, not {value!r}.", field=field)


def member_kind(name: str) -> str:
    """ "image", "labels", "clutter", "unsupported" or "other", by the member's path."""
    path = PurePosixPath(name)
    if any(part.startswith(".") or part.lower() in CLUTTER for part in path.parts):
        return "clutter"
    if path.name.lower() == labelling.LABELS_FILE:
        return "labels"
    suffix = path.suffix.lower()
    return "image" if suffix in IMAGE_EXTENSIONS else "unsupported" if suffix in UNSUPPORTED else "other"


# -- decoding one image ---------------------------------------------------------------------------------------


def decode(name: str, data: bytes, size: int) -> np.ndarray:
    """An image file's pixels as uint8 (3, size, size): RGB (transparency over white), its centre square resized."""
    # Pillow's own decompression-bomb guard, process-wide, at the limit checked below (it warns past it and refuses
    # twice it): the check below refuses first, from the header, before any pixel is decoded.
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        with Image.open(io.BytesIO(data), formats=DECODERS) as image:
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise CorpusError(
                    f"The image {shown(name)} is {width} x {height} pixels, over the {MAX_PIXELS:,} pixels the "
                    "server decodes: make it smaller, or leave it out."
                )
            image.draft("RGB", (size, size))  # a JPEG decodes at the smallest scale still at least size x size
            image.load()  # a GIF's first frame
            return _square(ImageOps.exif_transpose(image), size)
    except CorpusError:
        raise
    except Image.DecompressionBombError:  # Pillow's guard, in Image.open, past twice MAX_IMAGE_PIXELS
        raise CorpusError(
            f"The image {shown(name)} is over twice the {MAX_PIXELS:,} pixels the server decodes (a decompression "
            "bomb?): make it smaller, or leave it out."
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as error:
        raise CorpusError(
            f"{shown(name)} is not a PNG, JPEG, WebP, GIF or BMP image the server can read ({error}): convert it, "
            "or leave it out of the archive."
        ) from None


def _square(image: Image.Image, size: int) -> np.ndarray:
    if image.mode.startswith("I"):  # 16-bit grey (microscopy, scans): its top 8 bits
        image = Image.fromarray((np.asarray(image).astype(np.int64) >> 8).clip(0, 255).astype(np.uint8))
    alpha = image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)
    image = image.convert("RGBA" if alpha else "RGB")
    width, height = image.size
    side = min(width, height)
    box = ((width - side) / 2, (height - side) / 2, (width + side) / 2, (height + side) / 2)
    image = image.resize((size, size), Image.Resampling.BICUBIC, box=box, reducing_gap=3.0)
    if alpha:
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, image).convert("RGB")
    return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)


# -- writing arrays -------------------------------------------------------------------------------------------


class ArrayFile:
    """A ``.npy`` of uint8 images (count, 3, size, size) filled in any order, one image at a time, on disk."""

    def __init__(self, path: Path, count: int, size: int):
        self.path = path
        self.item = 3 * size * size
        header = {"descr": "|u1", "fortran_order": False, "shape": (count, 3, size, size)}
        with path.open("wb") as handle:
            np.lib.format.write_array_header_1_0(handle, header)
            self.offset = handle.tell()
            handle.truncate(self.offset + count * self.item)

    def put(self, index: int, pixels: np.ndarray) -> None:
        with self.path.open("r+b") as handle:
            handle.seek(self.offset + index * self.item)
            handle.write(np.ascontiguousarray(pixels).tobytes())


def predicted_bytes(train: int, labelled: int, size: int) -> int:
    """The bytes of every array a corpus of ``train`` training and ``labelled`` eval + bank images holds."""
    return (train + labelled) * 3 * size * size + labelled * 8


def check_prepared(total: int) -> None:
    if total > MAX_PREPARED_BYTES:
        raise CorpusError(
            f"These images make {size_text(total)} of arrays, over the {size_text(MAX_PREPARED_BYTES)} the server "
            "keeps for one corpus: choose a smaller image size, or give fewer images.",
            field="image_size",
        )


# -- preparing a corpus ---------------------------------------------------------------------------------------


def prepare(
    file: IO[bytes],
    folder: Path,
    *,
    image_size: int = 32,
    shard_images: int = 512,
    source: str = "",
    before_writing: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Decode the archive in ``file`` into an image corpus in ``folder``; returns the manifest.

    ``before_writing`` is called with the bytes the arrays will take once the archive passed every check and before
    anything is decoded or written (a quota's check); it refuses by raising. Appears whole or not at all, as
    ``text.prepare``'s folder does. Runs for seconds to minutes: call it from a worker thread.
    """
    check_settings(image_size, shard_images)
    archive = open_archive(file)
    members = archive.scan()
    images, given, skipped = _plan(archive, members)
    split = labelling.split(given) if given else labelling.Split([], [], [])
    held_out = {path for path, _ in split.eval}
    train = [name for name in images if name not in held_out]
    if len(train) < MIN_IMAGES:
        found = f"{len(images)} images" + (f", {len(held_out)} of them held out," if held_out else "")
        raise CorpusError(
            f"The archive has {found} and training needs at least {MIN_IMAGES}: add images "
            "(PNG, JPEG, WebP, GIF or BMP)."
        )
    total = predicted_bytes(len(train), len(split.eval) + len(split.bank), image_size)
    check_prepared(total)
    if before_writing is not None:
        before_writing(total)

    def write(building: Path) -> dict[str, Any]:
        order = np.random.default_rng(SHUFFLE_SEED).permutation(len(train))
        place = {name: int(order[i]) for i, name in enumerate(train)}
        counts = [min(shard_images, len(train) - start) for start in range(0, len(train), shard_images)]
        shards = [ArrayFile(building / shard_name(i), n, image_size) for i, n in enumerate(counts)]
        queries = {path: i for i, (path, _) in enumerate(split.eval)}
        bank = {path: i for i, (path, _) in enumerate(split.bank)}
        eval_file = ArrayFile(building / "eval.npy", len(split.eval), image_size) if given else None
        bank_file = ArrayFile(building / "bank.npy", len(split.bank), image_size) if given else None
        decoded = 0
        for name, data in archive.read(set(images)):
            pixels = decode(name, data, image_size)
            decoded += 1
            if name in place:
                shards[place[name] // shard_images].put(place[name] % shard_images, pixels)
            if eval_file is not None and name in queries:
                eval_file.put(queries[name], pixels)
            if bank_file is not None and name in bank:
                bank_file.put(bank[name], pixels)
        if decoded != len(images):
            raise CorpusError(f"The archive changed while it was read ({decoded} of {len(images)} images): {FIX}.")
        if given:
            _save_labels(building, split)
        held = (len(split.eval), len(split.bank))
        return manifest(building, image_size, counts, split.classes, held, source, skipped)

    return _build(folder, write)


def prepare_builtin(
    name: str,
    folder: Path,
    *,
    image_size: int = 32,
    shard_images: int = 512,
    before_writing: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """A built-in image set as a corpus: ``shapes``, drawn at 32 pixels: training shards of 4,096 images, the first
    2,048 of them (with labels) as the bank, and 512 more drawn with another seed as the held-out queries."""
    from swarmhub.worker.tasks import shapes

    if name not in BUILTIN_IMAGE_SETS:
        known = ", ".join(sorted(BUILTIN_IMAGE_SETS))
        raise CorpusError(f"There is no built-in image set {name!r}: choose one of {known}.", field="source")
    check_settings(image_size, shard_images)
    if image_size != shapes.IMAGE_SIZE:
        raise CorpusError(
            f"The built-in shapes are drawn at {shapes.IMAGE_SIZE} pixels: set the image size to {shapes.IMAGE_SIZE}, "
            "or upload an archive.",
            field="image_size",
        )
    if before_writing is not None:
        before_writing(predicted_bytes(SHAPES_TRAIN, SHAPES_BANK + SHAPES_EVAL, image_size))

    def write(building: Path) -> dict[str, Any]:
        images, kinds = shapes.draw(SHAPES_TRAIN, 0)
        queries, query_kinds = shapes.draw(SHAPES_EVAL, 1)
        counts = []
        for index, start in enumerate(range(0, SHAPES_TRAIN, shard_images)):
            shard = images[start : start + shard_images]
            np.save(building / shard_name(index), shard, allow_pickle=False)
            counts.append(len(shard))
        for stem, array, kind in (("eval", queries, query_kinds), ("bank", images[:SHAPES_BANK], kinds[:SHAPES_BANK])):
            np.save(building / f"{stem}.npy", array, allow_pickle=False)
            np.save(building / f"{stem}_labels.npy", np.asarray(kind, dtype=np.int64), allow_pickle=False)
        held = (SHAPES_EVAL, SHAPES_BANK)
        return manifest(building, image_size, counts, list(shapes.CLASSES), held, f"builtin:{name}", 0)

    return _build(folder, write)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.npy"


def _plan(archive: Archive, members: list[Member]) -> tuple[list[str], dict[str, str], int]:
    """The images (archive order), their labels from ``labels.csv`` (empty without one) and the skipped count."""
    images, labels_member, skipped = [], None, 0
    for member in members:
        kind = member_kind(member.name)
        if kind == "image":
            images.append(member.name)
        elif kind == "labels":
            if member.name != labelling.LABELS_FILE:
                raise CorpusError(
                    f"The archive has {shown(member.name)}: labels.csv belongs at the archive's root, its paths as "
                    "the archive names them. Move it there, or rename it."
                )
            labels_member = member
        elif kind == "unsupported":
            raise CorpusError(
                f"{shown(member.name)} is in an image format the server does not decode: convert it to PNG or JPEG, "
                "or leave it out of the archive."
            )
        elif kind == "other":
            skipped += 1
    if not images:
        raise CorpusError(
            f"The archive has no images (PNG, JPEG, WebP, GIF or BMP, by their extensions) among its "
            f"{len(members)} files: {FIX}."
        )
    given: dict[str, str] = {}
    if labels_member is not None:
        if labels_member.size > labelling.MAX_LABELS_BYTES:
            raise CorpusError(f"labels.csv is over {size_text(labelling.MAX_LABELS_BYTES)}: label fewer images.")
        for _, data in archive.read({labels_member.name}):
            given = labelling.parse(data, set(images))
    return images, given, skipped


def _save_labels(folder: Path, split: labelling.Split) -> None:
    for stem, rows in (("eval", split.eval), ("bank", split.bank)):
        labels = np.asarray([label for _, label in rows], dtype=np.int64)
        np.save(folder / f"{stem}_labels.npy", labels, allow_pickle=False)


def manifest(
    folder: Path,
    image_size: int,
    shard_counts: list[int],
    classes: list[str],
    held_out: tuple[int, int],
    source: str,
    skipped: int,
) -> dict[str, Any]:
    """Write ``manifest.json`` for the arrays in ``folder``; ``held_out`` is (eval images, bank images)."""
    names = ["eval.npy", "eval_labels.npy", "bank.npy", "bank_labels.npy"] if classes else []
    files = {name: file_facts(folder / name) for name in names}
    shards = [
        {"name": shard_name(i), **file_facts(folder / shard_name(i)), "images": n} for i, n in enumerate(shard_counts)
    ]
    identity = hashlib.sha256()  # names the worker's cache folder for this corpus
    for name, sha256 in sorted(
        [*((n, f["sha256"]) for n, f in files.items()), *((s["name"], s["sha256"]) for s in shards)]
    ):
        identity.update(f"{name}\0{sha256}\n".encode())
    result = {
        "format": FORMAT,
        "kind": "images",
        "image_size": image_size,
        "images": sum(shard_counts),
        "classes": classes,
        "source": source,
        "sha256": identity.hexdigest(),
        "bytes": sum(f["bytes"] for f in files.values()) + sum(s["bytes"] for s in shards),
        "eval_images": held_out[0],
        "bank_images": held_out[1],
        "skipped": skipped,
        "files": files,
        "shards": shards,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    write_json(folder / "manifest.json", result)
    return result


def _build(folder: Path, write: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".building", dir=folder.parent))
    try:
        building.chmod(0o755)  # mkdtemp makes it private; the corpus is served to every volunteer
        result = write(building)
        swap_in(building, folder)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return result
