"""The job's shared secret, which every node of a job over several machines holds: where a node reads it,
and the proofs by which node 0 and another node show each other at the rendezvous that they hold it.

The secret itself must never travel, be printed or reach the tasks: only proofs cross the network
(`proof`, an HMAC of a challenge), and the launcher drops it from the tasks' environment. Pure Python.
"""

from __future__ import annotations

import hashlib
import hmac
import os

SECRET_ENV = "TRAINER_RDZV_SECRET"  # the job's shared secret, unless --rdzv-secret-file names a file


def read_secret(path: str | None, environ=os.environ) -> bytes:
    """The job's shared secret: the file at `path` (its first line), else `TRAINER_RDZV_SECRET`.

    Raises:
      ValueError: there is none, or the file cannot be read or is empty; the message says how to set one.
    """
    how = (f"Set the same secret on every node, e.g. `export {SECRET_ENV}=$(python3 -c 'import secrets; "
           f"print(secrets.token_hex(16))')` on one and the same value on the others, or write it to a file "
           "that only you can read and pass --rdzv-secret-file FILE.")
    if path is not None:
        try:
            with open(path, "rb") as f:
                secret = f.readline().strip()
        except OSError as err:
            raise ValueError(f"--rdzv-secret-file must be a readable file. Received: --rdzv-secret-file {path!r} "
                             f"({err.strerror or err}). {how}") from None
        if not secret:
            raise ValueError(f"--rdzv-secret-file must hold the secret on its first line. Received: "
                             f"--rdzv-secret-file {path!r}, whose first line is empty. {how}")
        return secret
    secret = environ.get(SECRET_ENV, "").strip().encode()
    if not secret:
        raise ValueError(f"a job over several machines needs a shared secret, which every node presents at the "
                         f"rendezvous. Received: no {SECRET_ENV} in the environment and no --rdzv-secret-file. {how}")
    return secret


def proof(secret: bytes, purpose: str, challenge: str) -> str:
    """What a holder of `secret` answers to `challenge` (HMAC-SHA256): the secret itself never travels."""
    return hmac.new(secret, f"{purpose}:{challenge}".encode(), hashlib.sha256).hexdigest()


def proven(secret: bytes, purpose: str, challenge: str, answer) -> bool:
    """Whether `answer` is the proof of `secret` for `challenge` (compared in constant time)."""
    return isinstance(answer, str) and hmac.compare_digest(proof(secret, purpose, challenge), answer)
