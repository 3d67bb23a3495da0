"""How long the server takes to cut an uploaded archive of 10,000 images into shards, and how much memory it needs.

    .venv/bin/python bench/image_corpus.py [--images 10000] [--image-size 32] [--formats zip,tar.gz]

Builds an archive of ``--images`` photographs-like images (a gradient, a few filled shapes and some noise, 64 to 256
pixels a side, some not square; half PNG, half JPEG, in 20 folders) with a ``labels.csv`` for a fifth of them, in a
temporary folder. Then, for each format, a fresh Python process imports the server's corpus code, reads its peak
resident memory (``resource.getrusage``: ``ru_maxrss``), runs ``server/corpus/images.py``'s ``prepare`` on the
archive file as the upload route does (the file on disk, read member by member), and reads its peak again.

Target (issue 46): under 60 s on 2 cores, with the server's memory bounded: the peak may grow by at most 256 MB
while it prepares an archive several times that size (the archive and the decoded images are never held whole).
Prints the figures and PASS or MISS. Making the archive is not timed. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

TARGET_SECONDS = 60.0
TARGET_GROWTH_MB = 256.0

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from swarmhub.server.corpus import images

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

archive, out, size = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
before = peak_mb()
with open(archive, "rb") as file:
    started = time.perf_counter()
    manifest = images.prepare(file, out, image_size=size, source="upload:bench")
    took = time.perf_counter() - started
print(json.dumps({"seconds": took, "peak_before_mb": before, "peak_mb": peak_mb(), "images": manifest["images"],
                  "eval": manifest["eval_images"], "bank": manifest["bank_images"], "shards": len(manifest["shards"])}))
"""


def picture(rng: np.random.Generator) -> tuple[bytes, str]:
    width, height = (int(v) for v in rng.integers(64, 257, 2))
    if rng.random() < 0.5:
        height = width  # half of them square
    start, end = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    ramp = np.linspace(0.0, 1.0, width)[None, :, None]
    pixels = (start + (end - start) * ramp) * np.ones((height, 1, 1))
    pixels += rng.normal(0.0, 12.0, pixels.shape)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(3):
        x0, y0 = int(rng.integers(0, width - 8)), int(rng.integers(0, height - 8))
        box = (x0, y0, x0 + int(rng.integers(8, width // 2 + 9)), y0 + int(rng.integers(8, height // 2 + 9)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    buffer = io.BytesIO()
    if rng.random() < 0.5:
        image.save(buffer, "PNG")
        return buffer.getvalue(), "png"
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue(), "jpg"


def build(folder: Path, count: int, formats: list[str]) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    made = {fmt: folder / f"images.{fmt}" for fmt in formats}
    zipped = zipfile.ZipFile(made["zip"], "w", zipfile.ZIP_DEFLATED) if "zip" in made else None
    tarred = tarfile.open(made["tar.gz"], "w:gz") if "tar.gz" in made else None
    rows = ["path,label"]

    def add(name: str, data: bytes) -> None:
        if zipped is not None:
            zipped.writestr(name, data)
        if tarred is not None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tarred.addfile(info, io.BytesIO(data))

    for i in range(count):
        data, extension = picture(rng)
        name = f"site-{i % 20:02d}/img-{i:05d}.{extension}"
        add(name, data)
        if i % 5 == 0:
            rows.append(f"{name},class-{i % 7}")
    add("labels.csv", ("\n".join(rows) + "\n").encode())
    for archive in (zipped, tarred):
        if archive is not None:
            archive.close()
    return made


def measure(archive: Path, out: Path, image_size: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(archive), str(out), str(image_size)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--formats", default="zip,tar.gz", help="comma-separated: zip, tar.gz")
    args = parser.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    with tempfile.TemporaryDirectory(prefix="image-corpus-bench-") as temp:
        folder = Path(temp)
        started = time.perf_counter()
        archives = build(folder, args.images, formats)
        print(f"made {args.images:,} images in {time.perf_counter() - started:.0f} s (not timed below)")
        verdicts = []
        for fmt, archive in archives.items():
            size_mb = archive.stat().st_size / 2**20
            found = measure(archive, folder / f"corpus-{fmt.replace('.', '-')}", args.image_size)
            growth = found["peak_mb"] - found["peak_before_mb"]
            ok = found["seconds"] < TARGET_SECONDS and growth <= TARGET_GROWTH_MB
            verdicts.append(ok)
            print(
                f"{fmt:7} archive {size_mb:6.1f} MiB: prepare {found['seconds']:5.1f} s "
                f"(target < {TARGET_SECONDS:.0f} s); peak RSS {found['peak_mb']:.0f} MB, "
                f"{found['peak_before_mb']:.0f} MB before prepare, +{growth:.0f} MB "
                f"(target <= {TARGET_GROWTH_MB:.0f}); "
                f"{found['images']:,} training images in {found['shards']} shards, {found['eval']} held out, "
                f"bank {found['bank']} -> {'PASS' if ok else 'MISS'}"
            )
        print("PASS" if all(verdicts) else "MISS")


if __name__ == "__main__":
    main()
