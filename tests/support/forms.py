"""A multipart/form-data body, as an SDK uploading a file sends one."""

from __future__ import annotations


def multipart(fields: dict[str, str], filename: str, data: bytes, content_type: str = "application/octet-stream",
              boundary: str = "blazarform") -> tuple[bytes, str]:
    """(body, Content-Type) of a form with `fields` and one `file` part named `filename`."""
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                 f"Content-Type: {content_type}\r\n\r\n".encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"
