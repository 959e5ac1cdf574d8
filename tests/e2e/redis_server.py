"""A real redis-server for the shared-state tests (SPEC §10): a free loopback port, no
persistence, stopped by its PID (never by name: other developers' servers run here too)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, directory: Path, port: int | None = None):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (./run-tests installs Debian's redis-server)")
        self.binary, self.directory = binary, directory
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self.start()

    def start(self) -> None:
        # A free port can be taken by another test's server between the probe and the bind
        # (tests run in parallel): a server that could not bind exits, and a PONG alone could
        # come from someone else's server, so the answer must carry this process's PID.
        deadline = time.monotonic() + 10
        while True:
            self.proc = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.directory)],
                stdout=open(self.directory / "redis.log", "ab"), stderr=subprocess.STDOUT)
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self.serves():
                    return
                time.sleep(0.05)
            if self.proc.poll() is None or time.monotonic() >= deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            self.port = free_port()  # it exited: the port was taken, try another
            self.url = f"redis://127.0.0.1:{self.port}/0"

    def serves(self) -> bool:
        """This server (by PID) answers on the port."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"INFO server\r\n")
                data = b""
                while b"process_id:" not in data or not data.endswith(b"\r\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
        except OSError:
            return False
        assert self.proc is not None
        return f"process_id:{self.proc.pid}\r\n".encode() in data

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def pause(self) -> None:
        """Freeze the server (SIGSTOP), as a stalled VM does: connections stay open, nothing answers."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server run again (SIGCONT)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.resume()  # a paused server cannot act on SIGTERM
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
