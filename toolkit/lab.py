"""``python -m toolkit.lab``: JupyterLab on the repository, opened at the quickstart notebook.

``make lab`` runs exactly this command (and so does the browser test that checks it). The
server's root is the current directory, which must hold ``notebooks/quickstart.ipynb`` (the
repository root), so the README and every notebook are reachable from the file browser. It
listens on 127.0.0.1 only, on ``LAB_PORT`` or the first free port from 8888, with a fresh
token, and prints the full URL of the notebook before the server starts::

    python -m toolkit.lab                 # from the repository root
    python -m toolkit.lab --no-browser    # further arguments go to jupyter lab

The URL is built by :func:`notebook_url` from the same port and token the server gets.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from toolkit.errors import ParameterError

NOTEBOOK = "notebooks/quickstart.ipynb"
FIRST_PORT = 8888


def free_port(first: int = FIRST_PORT, count: int = 100) -> int:
    """The first port from ``first`` that nothing on 127.0.0.1 accepts connections on."""
    for port in range(first, first + count):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise ParameterError("LAB_PORT", f"{first}-{first + count - 1}", "a free port (all of these are in use)")


def notebook_url(port: int, token: str, notebook: str = NOTEBOOK) -> str:
    return f"http://127.0.0.1:{port}/lab/tree/{notebook}?token={token}"


def command(root: Path, port: int, token: str, extra: Sequence[str] = ()) -> list[str]:
    """The jupyter lab command line: root_dir is the repository, the default page the notebook."""
    cmd = [
        sys.executable, "-m", "jupyterlab",
        f"--ServerApp.root_dir={root}", f"--ServerApp.default_url=/lab/tree/{NOTEBOOK}",
        "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # jupyter refuses to run as root without it
    return cmd + list(extra)


def main(argv: Sequence[str] | None = None) -> int:
    extra = list(sys.argv[1:] if argv is None else argv)
    root = Path.cwd()
    if not (root / NOTEBOOK).is_file():
        raise ParameterError("working directory", str(root), f"the repository root (holding {NOTEBOOK})")
    raw_port = os.environ.get("LAB_PORT", "")
    if raw_port:
        if not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
            raise ParameterError("LAB_PORT", raw_port, "a port number from 1 to 65535")
        port = int(raw_port)
    else:
        port = free_port()
    token = secrets.token_hex(24)
    print(f"\n  JupyterLab: {notebook_url(port, token)}\n", flush=True)
    cmd = command(root, port, token, extra)
    os.execv(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ParameterError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
