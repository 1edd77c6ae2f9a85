"""What an image (or audio clip) in a chat request really is, read from its bytes: the gateway checks every media part
here before an engine sees it (blazar/serving/media.py). The type a client declares is never trusted: Pillow reads
the header, the pixel count is bounded before anything is decoded (a decompression bomb is refused unread), so is a
JPEG's number of scans (each is decoded over the whole image: thousands make a small file cost seconds), and the
image is then decoded whole so a truncated or corrupt file is a 400 here, not the engine's error.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from blazar.errors import DialectError

# Pillow's format names → the media types the engine is told (its data: URL).
IMAGE_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif",
               "BMP": "image/bmp"}
ACCEPTED = "PNG, JPEG, WebP, GIF or BMP"
# An MPO (a camera's multi-picture file) is a JPEG with more pictures after the first, and Pillow's JPEG opener
# answers it as a format of its own: it is sent as the JPEG it is (an engine reads the first picture).
MEDIA_TYPES = {**IMAGE_TYPES, "MPO": "image/jpeg"}
AUDIO_FORMATS = ("wav", "mp3")
# NOTE: libjpeg's progressive script has 10 scans for a colour image (6 for grey), and encoders that search for a
# better one stay in the tens; each scan is entropy-decoded over every block of its components, so the decode's work
# is scans x pixels. 1.6 MB holding one scan 40,000 times took 20 s at 25 Mpx. libjpeg-turbo offers a scan limit
# for this (TJPARAM_SCANLIMIT, djpeg -maxscans), off by default; Pillow does not set one, so the bound is here.
MAX_JPEG_SCANS = 100
SOS = b"\xff\xda"  # Start Of Scan: one per scan


@dataclass(frozen=True)
class ImageInfo:
    media_type: str  # image/png, ... as the bytes say
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def inspect_image(data: bytes, *, where: str, max_pixels: int) -> ImageInfo:
    """The image `data` holds, or a DialectError (400) saying why it is not one Blazar accepts: not an image, a type
    outside PNG/JPEG/WebP/GIF/BMP, more than `max_pixels`, or bytes that do not decode."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=list(IMAGE_TYPES))
    except (UnidentifiedImageError, Image.DecompressionBombWarning, Image.DecompressionBombError):
        raise DialectError(f"{where}: not an image Blazar accepts (send {ACCEPTED}; the type is read from the "
                           f"bytes, not the declared media type)", code="invalid_image") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise DialectError(f"{where}: the image cannot be read ({e})", code="invalid_image") from None
    with img:
        width, height = img.size
        if width * height > max_pixels:  # checked from the header alone: nothing decoded yet
            raise DialectError(f"{where}: the image is {width}x{height} ({width * height / 1e6:.1f} Mpx), over the "
                               f"{max_pixels / 1e6:.0f} Mpx a request may carry (inputs.image_max_megapixels)",
                               code="image_too_large")
        fmt = img.format or ""
        media_type = MEDIA_TYPES.get(fmt)
        if media_type is None:
            raise DialectError(f"{where}: not an image Blazar accepts (send {ACCEPTED})", code="invalid_image")
        if media_type == "image/jpeg":
            _check_scans(data, where)
        try:
            img.load()  # the whole image: a truncated or corrupt one is refused here
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
            raise DialectError(f"{where}: the {fmt} image does not decode ({e})", code="invalid_image") from None
    return ImageInfo(media_type=media_type, width=width, height=height)


def jpeg_scans(data: bytes) -> int:
    """How many scans a JPEG's bytes can hold, counted without decoding: its SOS markers. Inside entropy-coded data
    0xFF is always stuffed (FF 00) or a restart marker, so every FF DA is a marker or sits inside a segment's payload
    (an EXIF thumbnail's scans): the count is never below the true one."""
    return data.count(SOS)


def _check_scans(data: bytes, where: str) -> None:
    scans = jpeg_scans(data)
    if scans > MAX_JPEG_SCANS:
        raise DialectError(f"{where}: the JPEG has {scans} scans, over the {MAX_JPEG_SCANS} an image may have (a "
                           f"progressive JPEG has about 10; each scan is decoded over the whole image)",
                           code="image_too_complex")


def inspect_audio(data: bytes, *, where: str) -> str:
    """The format of an `input_audio` clip by its bytes ("wav" or "mp3", what the engine decodes), or a 400."""
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:3] == b"ID3" or (len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    raise DialectError(f"{where}: not a WAV or MP3 clip (the format is read from the bytes)", code="invalid_audio")
