"""Archives of images made on the spot with Pillow, zipfile and tarfile, for the image corpus tests and bench: good
ones (varied formats and sizes, each image one solid colour that tells it apart) and the hostile ones an upload
must refuse (paths out of the folder, links, devices, zip and tar bombs, decompression bombs)."""

from __future__ import annotations

import io
import stat
import struct
import tarfile
import zipfile
import zlib

from PIL import Image

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
EXTENSIONS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif", "BMP": "bmp"}
LOSSLESS = ("PNG", "WEBP", "BMP")  # a solid colour comes back exactly (JPEG shifts it; GIF keeps it too)


def image_file(colour: tuple[int, int, int], size: tuple[int, int] = (40, 30), fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    options = {"lossless": True} if fmt == "WEBP" else {}
    Image.new("RGB", size, colour).save(buffer, fmt, **options)
    return buffer.getvalue()


def colour_of(i: int) -> tuple[int, int, int]:
    """A colour of its own for image ``i`` (up to 4,096 images), each channel at least 8 apart from the next."""
    return (8 * (i % 16) + 4, 8 * (i // 16 % 16) + 4, 8 * (i // 256 % 16) + 4)


def solid_images(count: int, formats: tuple[str, ...] = LOSSLESS, folder: str = "images") -> dict[str, bytes]:
    """``count`` images of one solid colour each, of varied sizes (some not square) and formats."""
    found = {}
    for i in range(count):
        fmt = formats[i % len(formats)]
        size = (24 + 7 * (i % 5), 24 + 5 * (i % 3))
        found[f"{folder}/{i:04d}.{EXTENSIONS[fmt]}"] = image_file(colour_of(i), size, fmt)
    return found


def zip_of(members: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = compression
            archive.writestr(info, data)
    return buffer.getvalue()


def tar_of(members: dict[str, bytes], mode: str = "w:gz", extra: tuple[tarfile.TarInfo, ...] = ()) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:  # type: ignore[call-overload]
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for info in extra:
            archive.addfile(info)
    return buffer.getvalue()


def tar_entry(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    """A tar member that is no regular file: ``tarfile.SYMTYPE``, ``LNKTYPE``, ``CHRTYPE``, ``FIFOTYPE``..."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


def zip_symlink(members: dict[str, bytes], name: str, target: str) -> bytes:
    """A zip with a symbolic link as Info-ZIP stores one: the Unix mode S_IFLNK, the target as the data."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)
        info = zipfile.ZipInfo(name)
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(info, target)
    return buffer.getvalue()


def zip_declaring(members: dict[str, bytes], declared: int) -> bytes:
    """A zip whose central directory says each member is ``declared`` bytes uncompressed, whatever it holds."""
    data = bytearray(zip_of(members, zipfile.ZIP_STORED))
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        data[at + 24 : at + 28] = struct.pack("<I", declared)  # the central header's uncompressed size
        name_length, extra_length, comment_length = struct.unpack("<HHH", data[at + 28 : at + 34])
        at = data.find(b"PK\x01\x02", at + 46 + name_length + extra_length + comment_length)
    return bytes(data)


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` pixels and holds next to none: a decompression bomb's header."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def labels_csv(rows: list[tuple[str, str]], header: bool = True) -> bytes:
    lines = (["path,label"] if header else []) + [f"{path},{label}" for path, label in rows]
    return ("\n".join(lines) + "\n").encode()


def _many_labels() -> bytes:
    members = solid_images(1001, formats=("PNG",))
    members["labels.csv"] = labels_csv([(path, f"class-{i}") for i, path in enumerate(members)])
    return zip_of(members)


def _labelled(rows: list[tuple[str, str]], where: str = "labels.csv") -> bytes:
    members = solid_images(80)
    members[where] = labels_csv(rows)
    return zip_of(members)


def _bomb_tar() -> bytes:
    zeros = b"\0" * (40 * 2**20)
    return tar_of({**solid_images(64), "images/a.bmp": zeros, "images/b.bmp": zeros}, "w:gz")


# (case, a function making the archive, words its refusal must contain): each refused with field "file".
BAD_ARCHIVES = [
    ("not-an-archive", lambda: b"some plain text, not images\n" * 20, "not a zip or tar archive"),
    ("one-image", lambda: image_file((1, 2, 3)), "is one image"),
    ("absolute-path", lambda: tar_of({**solid_images(64), "/etc/cron.d/x.png": b"x"}), "an absolute path"),
    ("dot-dot", lambda: zip_of({**solid_images(64), "images/../../escape.png": b"x"}), "'..'"),
    (
        "tar-symlink",
        lambda: tar_of(solid_images(64), extra=(tar_entry("images/link.png", tarfile.SYMTYPE, "/etc/passwd"),)),
        "is a symbolic link",
    ),
    ("zip-symlink", lambda: zip_symlink(solid_images(64), "images/link.png", "/etc/passwd"), "is a symbolic link"),
    (
        "hard-link",
        lambda: tar_of(solid_images(64), extra=(tar_entry("images/hard.png", tarfile.LNKTYPE, "/etc/shadow"),)),
        "is a hard link",
    ),
    ("device", lambda: tar_of(solid_images(64), extra=(tar_entry("dev.png", tarfile.CHRTYPE),)), "not a regular file"),
    ("too-many-members", lambda: zip_of({f"e/{i}": b"" for i in range(100_001)}), "more than 100,000 files"),
    ("zip-bomb", lambda: zip_of({**solid_images(64), "images/zeros.bmp": b"\0" * (50 * 2**20)}), "over 100 times"),
    ("tar-bomb", _bomb_tar, "over 100 times"),
    ("member-too-large", lambda: zip_declaring(solid_images(64), 65 * 2**20), "over 64 MiB uncompressed"),
    (
        "total-too-large",
        lambda: zip_declaring({f"images/{i}.bmp": bytes(700_000) for i in range(66)}, 63 * 2**20),
        "over 4 GiB uncompressed",
    ),
    (
        "decompression-bomb",  # refused from its header, before a pixel is decoded
        lambda: zip_of({**solid_images(64), "images/huge.png": png_header(6_000, 6_000)}),
        "is 6000 x 6000 pixels, over the 25,000,000 pixels the server decodes",
    ),
    (
        "decompression-bomb-past-pillows-guard",  # Pillow's own guard refuses it in Image.open
        lambda: zip_of({**solid_images(64), "images/huge.png": png_header(20_000, 20_000)}),
        "over twice the 25,000,000 pixels the server decodes",
    ),
    (
        "not-an-image",
        lambda: zip_of({**solid_images(64), "images/notes.png": b"not a png at all"}),
        "'images/notes.png' is not a PNG",
    ),
    (
        "unsupported-format",
        lambda: zip_of({**solid_images(64), "images/scan.tiff": b"II*\0"}),
        "convert it to PNG or JPEG",
    ),
    ("too-few-images", lambda: zip_of(solid_images(20)), "training needs at least 64"),
    ("no-images", lambda: zip_of({"notes.txt": b"hello"}), "has no images"),
    (
        "label-of-no-image",
        lambda: _labelled([("images/0000.png", "a"), ("images/missing.png", "b")]),
        "'images/missing.png', which is no image",
    ),
    ("empty-label", lambda: _labelled([("images/0000.png", "a"), ("images/0001.webp", " ")]), "an empty label"),
    ("too-many-classes", _many_labels, "over the 1,000 the server takes"),
    (
        "labels-not-at-root",
        lambda: _labelled([("images/0000.png", "a")], where="images/labels.csv"),
        "belongs at the archive's root",
    ),
    (
        "one-class",
        lambda: _labelled([(f"images/{i:04d}.png", "a") for i in range(0, 30, 3)]),
        "every image the label 'a'",
    ),
]
